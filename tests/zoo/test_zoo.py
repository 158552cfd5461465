"""The model zoo through the product path, on the CPU with real ``torch.compile``.

For each model built by a library users run (transformers, timm, torchvision; tiny random-weight
configurations): the warm-up harness with ``--precompile auto`` (which checks its precompiled part
in a fresh process), ``compilecache publish`` to a file store, ``compilecache preload`` into an
empty directory, then two fresh pod processes: one that calls ``cachelib.runtime.warm_start()``
and one with the webhook's environment only. Each case asserts: every process exits 0, outputs
(and gradients, for a training step) equal eager's within tolerance, and torch's counters show
either the precompiled entry used (a Dynamo hit, no frame compiled, no fallback) or, where the
warm-up's check left the part out, the reason recorded and the FX-graph cache still hit.

Lanes: ``CI_CASES`` run on every run; ``COMPILECACHE_ZOO=all`` runs every case (the slow lane).
Both ends of the supported torch range run: the suite's venv (torch 2.13) and the venv
``scripts/test.sh`` makes with the newest torch (``$COMPILECACHE_TEST_CACHE/venv-torch-2.15``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachelib import harness, precompileguard, warmstart
from tests.cachelib.helpers import ROOT, last_json, run_cli
from testsupport.servers import missing

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("COMPILECACHE_TEST_CACHE", Path.home() / ".cache" / "compilecache-test"))
NEWEST_TORCH = "2.15"
NEWEST_VENV = CACHE / f"venv-torch-{NEWEST_TORCH}"


@dataclass(frozen=True)
class Case:
    target: str
    backward: bool = False
    dynamic: bool = False
    newest: bool = True  # also on the newest torch: torchvision (and so timm) has no release for 2.15 yet

    def harness_flags(self) -> list[str]:
        return (["--backward"] if self.backward else []) + (["--dynamic", "true"] if self.dynamic else [])

    def pod_flags(self) -> list[str]:
        return (["--backward"] if self.backward else []) + (["--dynamic"] if self.dynamic else [])


CASES = [
    Case("hf_bert"),
    Case("hf_bert_train", backward=True),
    Case("hf_gpt2"),
    Case("hf_gpt2_dynamic", dynamic=True),
    Case("hf_llama"),
    Case("hf_t5_encoder"),
    Case("hf_vit"),
    Case("hf_whisper_encoder"),
    Case("timm_convnext", newest=False),
    Case("timm_resnet_train", backward=True, newest=False),
    Case("timm_vit", newest=False),
    Case("tv_resnet", newest=False),
    Case("tv_swin", newest=False),
]
CI_CASES = {("hf_bert", "oldest"), ("timm_convnext", "oldest"), ("hf_bert", "newest")}
"""Every CI run; the rest in the slow lane (COMPILECACHE_ZOO=all). hf_bert is the model whose
precompiled entry crashed pods on torch 2.11 and 2.13, and hits on 2.15."""


def lanes() -> list[Any]:
    every = os.environ.get("COMPILECACHE_ZOO") == "all"
    params = []
    for case in CASES:
        for end in ("oldest", "newest"):
            if end == "newest" and not case.newest:
                continue
            if every or (case.target, end) in CI_CASES:
                params.append(pytest.param(case, end, id=f"{case.target}-{end}"))
    return params


def interpreter(end: str) -> str:
    if end == "oldest":
        return sys.executable
    python = NEWEST_VENV / "bin" / "python"
    if not python.exists():
        missing(f"{python} (scripts/test.sh makes it: torch {NEWEST_TORCH} for the zoo's newest end)")
    return str(python)


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
    """One JSON line per case into ``$COMPILECACHE_ZOO_REPORT`` when set (docs/benchmarks.md's zoo table)."""
    path = os.environ.get("COMPILECACHE_ZOO_REPORT")
    if not path:
        return
    check = result["precompile"]["check"]
    line = {
        "target": case.target, "end": end, "torch": result["versions"]["torch"],
        "compile_seconds": result["compile_seconds"], "check_seconds": check["seconds"],
        "verified": check["verified"], "reason": check["reason"],
        "pods": {how: {"dynamo": pod["counters"]["dynamo_cache"], "frames": pod["counters"]["frames"],
                       "fallbacks": pod["fallbacks"], "problems": pod["problems"]} for how, pod in seen.items()},
    }  # fmt: skip
    with open(path, "a") as f:
        f.write(json.dumps(line, sort_keys=True) + "\n")


def pods(python: str, case: Case, cache: Path, job_id: str, verified: bool) -> dict[str, dict[str, Any]]:
    """The two pod processes, side by side, each on its own copy of the preloaded directory."""
    running = {}
    for how in ("warm_start", "env"):
        copy = cache.with_name(f"pod-{how}")
        subprocess.run(["cp", "-a", str(cache), str(copy)], check=True)
        env = environment(TORCHINDUCTOR_CACHE_DIR=str(copy), TORCH_COMPILE_JOB_ID=job_id)
        if how == "env" and verified:
            # what the webhook sets, for a verified part only: with caching precompile on, torch 2.13 cannot
            # even compile some models afresh (a T5 encoder: "check_fn.guards_state must not be None")
            env["TORCH_CACHING_PRECOMPILE"] = "1"
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
    seen = pods(python, case, cache, result["job_id"], check["verified"])
    for how, pod in seen.items():
        assert pod["problems"] == [], (how, pod["problems"])
        dynamo = pod["counters"]["dynamo_cache"]
        if check["verified"]:
            assert pod["fallbacks"] == {}, (how, pod)
            assert dynamo.get("dynamo_cache_hit", 0) >= 1 and not dynamo.get("dynamo_cache_miss"), (how, dynamo)
            assert pod["counters"]["frames"].get("ok", 0) == 0, (how, "Dynamo traced afresh", pod["counters"])
        else:
            assert not dynamo.get("dynamo_cache_hit"), (how, "a left-out entry was loaded", dynamo)
            assert pod["counters"]["inductor"].get("fxgraph_cache_hit", 0) >= 1, (how, pod["counters"])
            assert pod["fallbacks"] == {}, (how, "nothing to fall back from", pod["fallbacks"])
    report(case, end, result, seen)
    prepared = seen["warm_start"]["prepared"]
    assert {"torch_key", "triton_key"} <= set(prepared["applied"]), ("the source keys, per torch version", prepared)
    if check["verified"]:
        assert "caching_precompile" in prepared["applied"], prepared
    else:
        assert any("left out by the warm-up's check" in d for d in prepared["declined"]), prepared


def test_the_newest_torch_is_the_one_claimed() -> None:
    python = interpreter("newest")
    proc = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    assert proc.stdout.startswith(f"{NEWEST_TORCH}."), proc.stdout
    high = ".".join(map(str, precompileguard.PROVEN_TORCH[1]))
    assert high == NEWEST_TORCH, "the zoo's newest end and the guard's proven range disagree"
