"""The model zoo through the product path, on the CPU with real ``torch.compile``.

For each model built by a library users run (transformers, timm, torchvision, torch-geometric; tiny
random-weight configurations): the warm-up harness with ``--precompile auto`` (which compiles as Off
does, then with caching precompile, and checks its precompiled part in fresh processes),
``compilecache publish`` to a file store, ``compilecache preload`` into an empty directory, then two
fresh pod processes: one that calls ``cachelib.runtime.warm_start()`` and one with the webhook's
environment only. Each case asserts: every process exits 0, outputs (and gradients, for a training
step) equal eager's within tolerance, the env pod hits every FX-graph and AOTAutograd lookup (what
a pod of Off's bundle hits: never worse than Off), and the warm_start pod either uses the
precompiled entry (a Dynamo hit, no frame compiled, no fallback) or, where the warm-up's check left
the part out, has the reason recorded and hits what the env pod hits.

Lanes: ``CI_CASES`` run on every run; the others are marked ``full_lane`` and run with ``COMPILECACHE_LANE=full``
(docs/testing.md).
Both ends of the supported torch range run: the suite's venv (torch 2.13) and the venv
``scripts/test.sh`` makes with the newest torch (``$COMPILECACHE_TEST_CACHE/venv-torch-2.15``).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachelib.in_image import harness, precheck, precompileguard, warmstart
from tests.cachelib.helpers import ROOT, last_json, run_cli
from tests.zoo.ends import NEWEST_TORCH, interpreter

pytestmark = pytest.mark.slow

@dataclass(frozen=True)
class Case:
    target: str
    backward: bool = False
    dynamic: bool = False
    newest: bool = True  # also on the newest torch

    def harness_flags(self) -> list[str]:
        return (["--backward"] if self.backward else []) + (["--dynamic", "true"] if self.dynamic else [])

    def pod_flags(self) -> list[str]:
        return (["--backward"] if self.backward else []) + (["--dynamic"] if self.dynamic else [])


CASES = [
    Case("hf_bert"),
    Case("hf_bert_train", backward=True),
    Case("hf_clip_vision"),
    Case("hf_distilbert"),
    Case("hf_gpt2"),
    Case("hf_gpt2_dynamic", dynamic=True),
    Case("hf_llama"),
    Case("hf_phi3"),
    Case("hf_qwen2_train", backward=True),
    Case("hf_qwen3"),
    Case("hf_t5_encoder"),
    Case("hf_vit"),
    Case("hf_wav2vec2"),
    Case("hf_whisper_encoder"),
    Case("pyg_gcn"),
    Case("timm_convnext"),
    Case("timm_regnet"),
    Case("timm_resnet_train", backward=True),
    Case("timm_vit"),
    Case("tv_efficientnet"),
    Case("tv_resnet"),
    Case("tv_swin"),
]
CI_CASES = {("hf_llama", "oldest"), ("hf_bert", "newest")}
"""Every CI run; the rest in the full lane (COMPILECACHE_LANE=full). hf_llama: a transformers model
whose part is left out, where Auto was worse than Off before its bundle carried Off's entries;
hf_bert: the model whose precompiled entry crashed pods on torch 2.11 and 2.13, and is verified and
hits on 2.15 (a verified part on the newest torch; timm_convnext, the same with a timm model, is
breadth: the full lane)."""


def lanes() -> list[Any]:
    params = []
    for case in CASES:
        for end in ("oldest", "newest"):
            if end == "newest" and not case.newest:
                continue
            marks = () if (case.target, end) in CI_CASES else (pytest.mark.full_lane,)
            params.append(pytest.param(case, end, id=f"{case.target}-{end}", marks=marks))
    return params


def environment(**extra: str) -> dict[str, str]:
    ours = ("TORCHINDUCTOR_", "TORCH_CACHING", "TORCH_COMPILE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def warm_up(python: str, case: Case, work: Path) -> dict[str, Any]:
    out = work / "out"
    proc = subprocess.run(
        [python, harness.__file__, "--target", f"testsupport.models:{case.target}", "--out", str(out),
         "--namespace", "zoo", "--name", case.target.replace("_", "-"), "--precompile", "auto",
         *case.harness_flags()],
        capture_output=True, text=True, env=environment(), cwd=ROOT, timeout=1200, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def publish_and_preload(work: Path, key: str) -> Path:
    store = f"file://{work / 'store'}"
    published = run_cli("publish", str(work / "out"), "--store", store)
    assert published.returncode == 0, published.stderr
    target = work / "pod-cache"
    pre = run_cli("preload", "--store", store, "--key", key, "--target", str(target), "--strict")
    assert pre.returncode == 0, pre.stderr
    assert last_json(pre.stdout)["result"] == "hit"
    return target


def report(case: Case, end: str, result: dict[str, Any], seen: dict[str, dict[str, Any]]) -> None:
    """One JSON line per case into ``$COMPILECACHE_ZOO_REPORT`` when set (docs/benchmarks.md's zoo table):
    the warm-up's verdict and, per pod, its first compiled call and torch's cache counts side by side."""
    path = os.environ.get("COMPILECACHE_ZOO_REPORT")
    if not path:
        return
    check = result["precompile"]["check"]
    line = {
        "target": case.target, "end": end, "torch": result["versions"]["torch"],
        "compile_seconds": result["compile_seconds"], "check_seconds": check["seconds"],
        "second_pass_seconds": (result["precompile"].get("pass") or {}).get("seconds"),
        "verified": check["verified"], "reason": check["reason"],
        "check_first_call_seconds": check.get("first_call_seconds"),
        "pods": {how: {"first_call_seconds": pod["first_call_seconds"], **cache_counts(pod["counters"]),
                       "fallbacks": pod["fallbacks"], "problems": pod["problems"]} for how, pod in seen.items()},
    }  # fmt: skip
    with open(path, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def cache_counts(counters: dict[str, dict[str, int]]) -> dict[str, int]:
    """A pod's hits and misses per cache: Dynamo's precompiled entries, FX graph, AOTAutograd (with its
    restarted attempts, which no cache serves), autotuning."""
    inductor, aot, dynamo = counters["inductor"], counters["aot_autograd"], counters["dynamo_cache"]
    autotune = {k: v for k, v in inductor.items() if "autotune" in k}
    return {
        "precompiled_hit": dynamo.get("dynamo_cache_hit", 0), "fx_hit": inductor.get("fxgraph_cache_hit", 0),
        "fx_miss": inductor.get("fxgraph_cache_miss", 0), "aot_hit": aot.get("autograd_cache_hit", 0),
        "aot_miss": aot.get("autograd_cache_miss", 0), "aot_restarted": precheck.restarted_attempts(counters),
        "autotune_hit": sum(v for k, v in autotune.items() if "hit" in k),
        "autotune_miss": sum(v for k, v in autotune.items() if "miss" in k),
    }  # fmt: skip


def pods(python: str, case: Case, cache: Path, job_id: str) -> dict[str, dict[str, Any]]:
    """The two pod processes, side by side, each on its own copy of the preloaded directory, with what
    the webhook gives a pod (the cache directory and the job id; never TORCH_CACHING_PRECOMPILE)."""
    running = {}
    for how in ("warm_start", "env"):
        copy = cache.with_name(f"pod-{how}")
        subprocess.run(["cp", "-a", str(cache), str(copy)], check=True)
        env = environment(TORCHINDUCTOR_CACHE_DIR=str(copy), TORCH_COMPILE_JOB_ID=job_id)
        running[how] = subprocess.Popen(
            [python, "-m", "tests.zoo.pod", case.target, how, *case.pod_flags()],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )  # fmt: skip
    seen = {}
    for how, proc in running.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"the {how} pod process died:\n{stderr[-4000:]}"
        seen[how] = last_json(stdout)
    return seen


@pytest.mark.parametrize(("case", "end"), lanes())
def test_a_zoo_model_warms_and_never_breaks_a_pod(case: Case, end: str, tmp_path: Path) -> None:
    python = interpreter(end)
    result = warm_up(python, case, tmp_path)
    check = result["precompile"]["check"]
    cachedir = tmp_path / "out" / "cachedir"
    manifest = warmstart.read_manifest(cachedir)
    assert manifest is not None and manifest["precompile_check"]["verified"] is check["verified"]
    if check["verified"]:
        assert check["reason"] is None and result["precompile"]["dynamo_entries"] >= 1, check
        assert manifest["dynamo_precompile"] is True
    else:
        assert check["reason"], check
        assert manifest["dynamo_precompile"] is False and manifest["precompile_check"]["reason"] == check["reason"]
        assert warmstart.dynamo_entries(cachedir) == 0, "an unverified precompiled entry was left to ship"
        assert "precompile" not in result["megacache"]["artifacts"], result["megacache"]
    assert check["seconds"] < result["compile_seconds"] + 60, "the check costs as much as the warm-up"

    cache = publish_and_preload(tmp_path, result["key_string"])
    seen = pods(python, case, cache, result["job_id"])
    report(case, end, result, seen)
    for how, pod in seen.items():
        assert pod["problems"] == [], (how, pod["problems"])
        assert pod["fallbacks"] == {}, (how, pod)
    env = cache_counts(seen["env"]["counters"])
    assert env["precompiled_hit"] == 0, ("no caching precompile without warm_start()", env)
    # a restarted attempt's lookup misses in every pod, Off's included (precheck.restarted_attempts)
    assert env["fx_miss"] == 0 and env["aot_miss"] == env["aot_restarted"], ("Off's entries", env)
    assert env["autotune_miss"] == 0, ("Off's entries", env)
    assert env["fx_hit"] + env["aot_hit"] >= 1, env
    counted = cache_counts(seen["warm_start"]["counters"])
    prepared = seen["warm_start"]["prepared"]
    assert {"torch_key", "triton_key"} <= set(prepared["applied"]), ("the source keys, per torch version", prepared)
    if check["verified"]:
        assert "caching_precompile" in prepared["applied"], prepared
        assert counted["precompiled_hit"] >= 1, counted
        assert seen["warm_start"]["counters"]["frames"].get("ok", 0) == 0, ("Dynamo traced afresh", counted)
    else:
        assert any("left out by the warm-up's check" in d for d in prepared["declined"]), prepared
        assert counted == env, ("a left-out part: the warm_start pod gets exactly Off's entries", counted, env)


def test_the_newest_torch_is_the_one_claimed() -> None:
    python = interpreter("newest")
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    assert proc.stdout.startswith(f"{NEWEST_TORCH}."), proc.stdout
    high = ".".join(map(str, precompileguard.PROVEN_TORCH[1]))
    assert high == NEWEST_TORCH, "the zoo's newest end and the guard's proven range disagree"
