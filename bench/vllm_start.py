"""vLLM's start, cold and warm from a compilecache bundle: engine initialisation and time to the first answer.

For each mode, one run of each row, one after another on one machine (the ratio warm ÷ cold is from that run):

  cold       vLLM's server, an empty ``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` (a new node)
  warm       the same start on a directory ``compilecache preload`` filled from the bundle that
             cachelib/in_image/vllmwarm.py (the warm-up Job's harness) made and ``compilecache publish`` stored;
             ``compilecache vllm-watch`` beside it says what vLLM did (its verdict is in the table)

Modes: ``aot`` (vLLM's default: its AOT compile and artifact) and ``inductor`` (``VLLM_USE_AOT_COMPILE=0``:
Inductor's own cache). "engine init" is vLLM's own figure (``init engine (profile, create kv cache, warmup model)
took X s``), which holds the compile; "first answer" runs from the server process's spawn to the end of the first
completion (8 tokens), what a pod's readiness waits for plus one request. Every server: the same model, arguments
and ``--load-format dummy`` (no weights to download), one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``--distributed-executor-backend uni``), its own empty HOME.

    python bench/vllm_start.py --python $COMPILECACHE_TEST_VLLM/bin/python --out bench/results/vllm-cpu-DATE
    python bench/vllm_start.py ... --model /path/to/model --arg=--max-model-len --arg=4096 --modes aot

Without ``--model``: the tests' tiny Qwen2 (2 layers, hidden size 128; tests/vllm/conftest.py). Writes
``results.json`` and ``table.md`` into ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cachelib import preload, publish  # noqa: E402
from cachelib.in_image.podcontract import CACHE_DIR_ENV, VLLM_CACHE_ROOT_ENV, VLLM_ROOT_SUBDIR  # noqa: E402
from cachelib.in_image.vllmwarm import Server, free_port  # noqa: E402

LAUNCH = ["-m", "vllm.entrypoints.openai.api_server"]
DEFAULT_ARGS = ["--max-model-len", "256", "--max-num-seqs", "4"]
SINGLE_PROCESS = ["--distributed-executor-backend", "uni"]
MODES = {"aot": {}, "inductor": {"VLLM_USE_AOT_COMPILE": "0"}}
TIMEOUT = 1800.0


def machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")  # fmt: skip
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {"cpu": cpu, "cores": str(os.cpu_count()), "kernel": platform.release(), "load_before": load}


def versions(python: str) -> dict[str, str]:
    code = "import json, torch, vllm, platform; print(json.dumps({'vllm': vllm.__version__, " \
           "'torch': torch.__version__, 'python': platform.python_version()}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def environment(home: Path, mode_env: dict[str, str]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_", "TRITON_"))}
    return {**keep, "HOME": str(home), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", **mode_env}  # fmt: skip


def start(python: str, model: str, args: list[str], cache: Path, env: dict[str, str], watch: bool) -> dict[str, Any]:
    """One server start on ``cache``: its engine initialisation, seconds to the first answer, tokens, verdict."""
    port = free_port()
    termination = cache.parent / f"termination-{port}"
    watcher = None
    if watch:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cachelib.cli", "vllm-watch", "--cache-dir", str(cache), "--port", str(port)],
            env={**os.environ, "COMPILECACHE_TERMINATION_LOG": str(termination), "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        time.sleep(2)
    pod_env = {**env, VLLM_CACHE_ROOT_ENV: str(cache / VLLM_ROOT_SUBDIR), CACHE_DIR_ENV: str(cache)}
    argv = [python, *LAUNCH, "--model", model, *args, "--load-format", "dummy", "--port", str(port)]
    spawned = time.monotonic()
    server = Server(argv, pod_env, port)
    try:
        ready = server.wait_ready(TIMEOUT)
        answer = server.complete(server.get("/v1/models")["data"][0]["id"])
        first = time.monotonic() - spawned
    finally:
        server.stop()
        if watcher is not None:
            try:
                watcher.wait(60)
            except subprocess.TimeoutExpired:
                watcher.kill()
    verdict = json.loads(termination.read_text())["compilecache_why"] if termination.is_file() else None
    return {"engine_init_s": server.init_seconds, "ready_s": round(ready, 3), "first_answer_s": round(first, 3),
            "tokens": answer["token_ids"], "verdict": verdict}  # fmt: skip


def run_mode(python: str, model: str, args: list[str], mode: str, scratch: Path) -> dict[str, Any]:
    env_mode = MODES[mode]
    home = scratch / "home"
    home.mkdir(parents=True)
    env = environment(home, env_mode)
    cold = start(python, model, args, scratch / "cold" / "inductor", env, watch=False)
    out = scratch / "out"
    invocation = {"command": [python, *LAUNCH], "model": model, "args": args}
    warm_up = REPO / "cachelib" / "in_image" / "vllmwarm.py"
    subprocess.run([python, str(warm_up), "--out", str(out), "--namespace", "bench",
                    "--name", "vllm", "--invocation", json.dumps(invocation)], env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    store = f"file://{scratch / 'store'}"
    published = publish.publish(out, store)
    target = scratch / "pod" / "inductor"
    loaded = preload.preload(store, [published.key], target)
    warm = start(python, model, args, target, env, watch=True)
    return {"mode": mode, "env": env_mode, "cold": cold, "warm": warm, "preload_s": round(loaded.seconds, 3),
            "bundle_bytes": published.bytes, "same_tokens": cold["tokens"] == warm["tokens"]}  # fmt: skip


def ratio(warm: float | None, cold: float | None) -> str:
    return f"{warm / cold:.2f}" if warm is not None and cold else "–"


def table(results: dict[str, Any]) -> str:
    head = results["versions"]
    lines = [
        f"vLLM {head['vllm']}, torch {head['torch']}, Python {head['python']}; {results['machine']['cpu']}, "
        f"{results['machine']['cores']} cores, load before {results['machine']['load_before']}; model "
        f"{results['model_name']}, {' '.join(results['args'])}",
        "",
        "| mode | engine init cold | warm | warm ÷ cold | first answer cold | warm | warm ÷ cold | preload | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        cold, warm = row["cold"], row["warm"]
        verdict = warm["verdict"] or {}
        lines.append(
            f"| {row['mode']} | {cold['engine_init_s']} s | {warm['engine_init_s']} s | "
            f"{ratio(warm['engine_init_s'], cold['engine_init_s'])} | {cold['first_answer_s']} s | "
            f"{warm['first_answer_s']} s | {ratio(warm['first_answer_s'], cold['first_answer_s'])} | "
            f"{row['preload_s']} s | {verdict.get('result')} ({verdict.get('cause')}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", required=True, help="the interpreter of an environment with vLLM")
    parser.add_argument("--model", help="a model directory or hub id (default: the tests' tiny Qwen2)")
    parser.add_argument("--arg", action="append", default=None, help="an engine argument (repeat; default: "
                        f"{' '.join(DEFAULT_ARGS)})")  # fmt: skip
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=sorted(MODES))
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    args = [*(options.arg or DEFAULT_ARGS), *SINGLE_PROCESS]
    options.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"machine": machine(), "versions": versions(options.python), "args": args,
                               "date": time.strftime("%Y-%m-%d"), "rows": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as scratch:
        model = options.model
        if model is None:
            from tests.vllm.conftest import write_tiny_model

            model = str(write_tiny_model(Path(scratch) / "tiny-qwen2"))
        results["model_name"] = options.model or "tiny Qwen2 (tests/vllm)"
        for mode in options.modes:
            results["rows"].append(run_mode(options.python, model, args, mode, Path(scratch) / mode))
            (options.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = table(results)
    (options.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
