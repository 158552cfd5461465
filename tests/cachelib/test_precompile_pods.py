"""precompile Auto never crashes a pod, and a pod that does not load the precompiled part gets Off's entries.

One ``--precompile auto`` warm-up per torch end (the suite's, and the newest in its own venv) of
``testsupport.models:layer_loop`` (a tiny model with Python builtins in its traced code: the shape of
the torch 2.11-2.14 crash ``Name '__builtins_dict___0' already exists in scope``), published to a
file store and preloaded. Then fresh pod processes, each on its own copy of the preloaded directory:

- ``env``: exactly the environment the operator's webhook gives an app container of a cache whose
  every bundle passed the check (taken from the webhook's own pod patch: no ``TORCH_*`` variable of
  it is left out), and nothing else;
- ``warm_start``: the same, and ``cachelib.runtime.warm_start()`` before ``torch.compile``;

each in the warm-up's global state and in the others pods meet: ``OMP_NUM_THREADS=1`` (torchrun's
default), deterministic algorithms, inference without ``torch.no_grad()``. Every process must exit 0
with the outputs of eager. In the warm-up's state, the env pod must hit every FX-graph and AOTAutograd
lookup (what a pod of Off's bundle hits) and the warm_start pod must load the precompiled entry; in
another state, ``warm_start()`` declines the part and names the setting with both values, and the
pod's verdict names what made a lookup miss.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.decisions.podpatch import patched_pod

from cachelib.in_image import harness
from tests.cachelib.helpers import ROOT, last_json, run_cli
from tests.operator.samples import env_of, inject, pod, view
from tests.zoo.ends import interpreter

pytestmark = pytest.mark.slow

TARGET = "layer_loop"
STATES = ("default", "threads", "deterministic", "grad")
NEWEST_DEFAULT_LANE = ("default", "threads")
"""Every CI run: every state on the suite's torch, the crash's own case (another thread count) and the
warm-up's state on the newest; the full lane (COMPILECACHE_LANE=full) every state on both."""


def webhook_env() -> dict[str, str]:
    """The TORCH*/PYTHON* variables the webhook gives an app container of a verified Auto cache."""
    p = pod()
    auto = view(model={"target": f"testsupport.models:{TARGET}", "precompile": "Auto"}, precompile="Verified")
    container = patched_pod(p, inject(p, auto))["spec"]["containers"][0]
    return {k: str(v) for k, v in env_of(container).items() if k.startswith(("TORCH", "PYTHON")) and v is not None}


def clean_env(**extra: str) -> dict[str, str]:
    ours = ("TORCHINDUCTOR_", "TORCH_CACHING", "TORCH_COMPILE", "OMP_NUM_THREADS", "PYTHONPYCACHEPREFIX")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(ours)}, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """end -> (the preloaded directory, the warm-up's job id), made on first use."""

    class Lazy(dict[str, tuple[Path, str]]):
        def __missing__(self, end: str) -> tuple[Path, str]:
            self[end] = warm_up(end, tmp_path_factory.mktemp(f"warm-{end}"))
            return self[end]

    return Lazy()


def warm_up(end: str, work: Path) -> tuple[Path, str]:
    out = work / "out"
    proc = subprocess.run(
        [interpreter(end), harness.__file__, "--target", f"testsupport.models:{TARGET}", "--out", str(out),
         "--namespace", "zoo", "--name", "layer-loop", "--precompile", "auto"],
        capture_output=True, text=True, env=clean_env(), cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert result["precompile"]["check"]["verified"], result["precompile"]["check"]
    assert "harness: precompile: entry 0 (_LayerLoop): verified, shipped" in proc.stderr
    store = f"file://{work / 'store'}"
    assert run_cli("publish", str(out), "--store", store).returncode == 0
    target = work / "preloaded"
    pre = run_cli("preload", "--store", store, "--key", result["key_string"], "--target", str(target), "--strict")
    assert pre.returncode == 0 and last_json(pre.stdout)["result"] == "hit", pre.stderr
    return target, str(result["job_id"])


def run_pod(end: str, cache: Path, job_id: str, how: str, state: str, work: Path) -> dict[str, Any]:
    copy = work / "pod-cache"
    subprocess.run(["cp", "-a", str(cache), str(copy)], check=True)
    env = clean_env(**{**webhook_env(), "TORCHINDUCTOR_CACHE_DIR": str(copy), "TORCH_COMPILE_JOB_ID": job_id})
    if state == "threads":
        env["OMP_NUM_THREADS"] = "1"
    args = ["--state", state] if state in ("deterministic", "grad") else []
    proc = subprocess.run(
        [interpreter(end), "-m", "tests.zoo.pod", TARGET, how, *args],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"the {how} pod ({state}) died on torch's {end} end:\n{proc.stderr[-4000:]}"
    seen: dict[str, Any] = last_json(proc.stdout)
    return seen


def test_the_webhook_gives_no_unguarded_caching_precompile() -> None:
    assert "TORCH_CACHING_PRECOMPILE" not in webhook_env()
    assert {"TORCHINDUCTOR_CACHE_DIR", "TORCH_COMPILE_JOB_ID"} <= set(webhook_env())


@pytest.mark.parametrize(
    ("end", "how", "state"),
    [pytest.param(end, how, state, marks=() if end == "oldest" or state in NEWEST_DEFAULT_LANE
                  else (pytest.mark.full_lane,))
     for end in ("oldest", "newest") for state in STATES for how in ("env", "warm_start")],
)
def test_a_pod_of_a_verified_auto_bundle_never_crashes(
    end: str, how: str, state: str, warmed: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    cache, job_id = warmed[end]
    seen = run_pod(end, cache, job_id, how, state, tmp_path)
    assert seen["problems"] == [], seen["problems"]
    assert seen["fallbacks"] == {}, seen
    counters = seen["counters"]
    dynamo, frames = counters["dynamo_cache"], counters["frames"]
    inductor, aot = counters["inductor"], counters["aot_autograd"]
    if how == "env":  # no caching precompile: the plain path, on Off's entries
        assert not dynamo.get("dynamo_cache_hit"), dynamo
        if state == "default":
            assert inductor.get("fxgraph_cache_hit", 0) >= 1 and not inductor.get("fxgraph_cache_miss"), counters
            assert aot.get("autograd_cache_hit", 0) >= 1 and not aot.get("autograd_cache_miss"), counters
        return
    prepared = seen["prepared"]
    if state == "default":
        assert "caching_precompile" in prepared["applied"], prepared
        assert dynamo.get("dynamo_cache_hit", 0) >= 1 and frames.get("ok", 0) == 0, counters
        assert seen["why"]["result"] == "hit", seen["why"]
        return
    if state in ("threads", "deterministic"):  # known before the first call: the part is declined, by name
        setting = {"threads": "num_threads", "deterministic": "deterministic_algorithms"}[state]
        declined = [d for d in prepared["declined"] if d.startswith("caching_precompile:")]
        assert declined and setting in declined[0] and "in the warm-up" in declined[0], prepared
        assert not dynamo.get("dynamo_cache_hit"), dynamo
    why = seen["why"]
    missed = inductor.get("fxgraph_cache_miss", 0) or aot.get("autograd_cache_miss", 0)
    if missed:  # a miss is said with its cause, never as "unknown"
        assert why["result"] == "miss" and why["cause"] != "unknown", why
