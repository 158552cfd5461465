"""``compilecache demo``: the whole flow on one machine's CPU, no cluster, no GPU.

1. A warm-up job: the harness compiles a built-in model from scratch and the bundle is
   published to a file store.
2. A pod's init container: ``compilecache preload`` in a fresh process unpacks the bundle
   into an empty cache directory.
3. The pod's workload: a fresh process with ``TORCHINDUCTOR_CACHE_DIR`` pointing there
   compiles the same model; torch's own counters say whether it hit, and the runtime
   collector shows them as Prometheus metrics.
4. For comparison, in fresh processes too: the model's eager first call (the floor) and a compile
   against the warm-up's own cache directory (a node's hot cache), so that the seconds a warm
   start still costs can be read against both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cachelib.in_image.podcontract import CACHE_DIR_ENV, JOB_ID_ENV, TERMINATION_LOG_ENV
from cachelib.units import human_bytes

NAMESPACE, NAME = "default", "demo"


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


# -- the pod's workload (runs in its own process) --------------------------------------------------
def workload(target: str, cache_dir: Path, options: dict[str, Any], job_id: str) -> dict[str, Any]:
    """Compile ``target`` against ``cache_dir`` as a pod would; timings, counters and metrics text."""
    os.environ[CACHE_DIR_ENV] = str(cache_dir)
    os.environ[JOB_ID_ENV] = job_id
    from cachelib.in_image import compilestep, harness

    opts = compile_options(options)
    harness.apply_options(opts, job_id)
    timings = compilestep.run_target(target, opts)
    counters = compilestep.counters_snapshot()
    return {
        "targets": timings,
        "first_call_seconds": round(sum(t["seconds"] for t in timings), 4),
        "cache": compilestep.cache_summary(counters),
        "metrics": workload_metrics(),
    }


def compile_options(options: dict[str, Any]) -> Any:
    """The warm-up's recorded options (result.json) as :class:`cachelib.in_image.compilekey.CompileOptions`."""
    from cachelib.in_image.compilekey import CompileOptions

    return CompileOptions(**{**options, "inductor_config": tuple((options.get("inductor_config") or {}).items())})


def eager(target: str, options: dict[str, Any]) -> dict[str, Any]:
    """The floor: the target's first calls without compiling, in a fresh process (called as the harness
    calls them: the same grad mode)."""
    from cachelib.in_image import compilestep

    opts = compile_options(options)
    function = compilestep.load_target(target)
    takes_compile = compilestep.required_params(function) >= 1
    entries = compilestep.normalise_entries(target, function(lambda fn: fn) if takes_compile else function()) or []
    seconds = 0.0
    for fn, args, kwargs in entries:
        started = time.perf_counter()
        compilestep.run_entry(compilestep.eager_entry(fn, opts), args, kwargs, opts)
        seconds += time.perf_counter() - started
    return {"first_call_seconds": round(seconds, 4)}


def workload_metrics() -> str | None:
    """The Prometheus text of :mod:`cachelib.runtime`, or None where prometheus_client is not
    installed (a plain ``pip install compilecache``: it comes with the ``metrics`` extra)."""
    try:
        from cachelib import runtime
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "prometheus_client":
            raise
        return None
    return runtime.metrics_text()


def check_requirements() -> None:
    """The demo compiles a model: without torch it cannot start (say so before anything runs)."""
    import importlib.util

    try:
        installed = importlib.util.find_spec("torch") is not None
    except ModuleNotFoundError:  # what an import hook that hides a package raises
        installed = False
    if not installed:
        raise DemoError(
            "the demo compiles a model on this machine's CPU and needs torch, which is not installed here: "
            "pip install torch (or pip install 'compilecache[torch]'), then run it again"
        )


def workload_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m cachelib.demo workload")
    parser.add_argument("--target", required=True)
    parser.add_argument("--cache-dir", required=True, type=Path)
    parser.add_argument("--options", required=True, help="compile options as JSON")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--eager", action="store_true", help="call the target's entries without compiling")
    args = parser.parse_args(argv)
    options = json.loads(args.options)
    if args.eager:
        print(json.dumps(eager(args.target, options)))
    else:
        print(json.dumps(workload(args.target, args.cache_dir, options, args.job_id)))
    return 0


# -- the demo ---------------------------------------------------------------------------------------
def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise DemoError(f"{what} failed (exit status {proc.returncode}):\n{tail}")
    return proc.stdout


def _last_json(stdout: str, what: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            data: dict[str, Any] = json.loads(line)
            return data
    raise DemoError(f"{what} printed no JSON result")


def warm_up(work: Path, target: str) -> dict[str, Any]:
    from cachelib.in_image import harness

    out = work / "warmup"
    argv = [
        sys.executable,
        harness.__file__,
        "--target",
        target,
        "--out",
        str(out),
        "--namespace",
        NAMESPACE,
        "--name",
        NAME,
    ]
    _run(argv, "the warm-up harness")
    result: dict[str, Any] = json.loads((out / harness.RESULT_FILE).read_text())
    return result


def preload_as_init_container(store: str, cache_dir: Path, work: Path) -> dict[str, Any]:
    env = {**os.environ, TERMINATION_LOG_ENV: str(work / "termination-log")}
    argv = [
        sys.executable,
        "-m",
        "cachelib.cli",
        "preload",
        "--store",
        store,
        "--cache",
        f"{NAMESPACE}/{NAME}",
        "--target",
        str(cache_dir),
        "--strict",
    ]
    return _last_json(_run(argv, "compilecache preload", env), "compilecache preload")


def run_workload(target: str, cache_dir: Path, warm: dict[str, Any], *flags: str) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "cachelib.demo",
        "workload",
        "--target",
        target,
        "--cache-dir",
        str(cache_dir),
        "--options",
        json.dumps(warm["options"]),
        "--job-id",
        warm["job_id"],
        *flags,
    ]
    env = {k: v for k, v in os.environ.items() if k not in (CACHE_DIR_ENV, "TRITON_CACHE_DIR")}
    return _last_json(_run(argv, "the workload", env), "the workload")


def run_demo(store: str | None = None, target: str = "tiny_mlp", keep: bool = False, out: TextIO | None = None) -> int:
    """Run the three steps and print what happened; 0 when the warm start hit."""
    from cachelib.publish import publish

    out = out or sys.stdout
    work = Path(tempfile.mkdtemp(prefix="compilecache-demo-"))
    url = store or f"file://{work / 'store'}"

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    try:
        check_requirements()
        say(f"compilecache demo: {target} on the CPU, store {url}")
        say()
        say(f"1/4 warm-up job: the harness compiles {target} from scratch (takes a while on a CPU)")
        started = time.perf_counter()
        warm = warm_up(work, target)
        cold = sum(t["seconds"] for t in warm["targets"])
        published = publish(work / "warmup", url)
        say(
            f"    versions                    torch {warm['versions']['torch']}, triton {warm['versions']['triton']}, "
            f"python {warm['versions']['python']}"
        )
        say(f"    first call (cold compile)   {cold:.2f} s   (harness process {time.perf_counter() - started:.1f} s)")
        say(f"    torch cache counters        {_counters(warm['cache'])}")
        say(f"    published                   {published.key}")
        say(f"                                {human_bytes(published.bytes)}, sha256 {published.sha256[:16]}…")
        say()
        cache_dir = work / "pod" / "inductor-cache"
        cache_dir.mkdir(parents=True)
        say("2/4 pod init container: compilecache preload into an empty cache directory (no torch)")
        pre = preload_as_init_container(url, cache_dir, work)
        say(
            f"    result                      {pre['result']}: {human_bytes(pre['bytes'])} fetched, "
            f"{pre['files']} files unpacked in {pre['seconds']:.2f} s"
        )
        say()
        say("3/4 pod workload: a fresh process compiles the same model with TORCHINDUCTOR_CACHE_DIR set")
        pod = run_workload(target, cache_dir, warm)
        warm_seconds = pod["first_call_seconds"]
        say(
            f"    first call (warm start)     {warm_seconds:.2f} s   ({cold / max(warm_seconds, 1e-9):.1f}x faster "
            "than cold)"
        )
        say(f"    torch cache counters        {_counters(pod['cache'])}")
        say()
        say("4/4 for comparison, each in a fresh process: the model eager (no compile), and compiled against")
        say("    the warm-up's own cache directory (a node that compiled the model itself: its hot cache)")
        floor = run_workload(target, cache_dir, warm, "--eager")
        hot = run_workload(target, work / "warmup" / "cachedir", warm)
        for line in floor_lines(floor["first_call_seconds"], cold, hot["first_call_seconds"], warm_seconds,
                                pre["seconds"]):
            say(line)
        say()
        if pod["metrics"] is None:
            say("Prometheus metrics of the workload: not shown, prometheus_client is not installed")
            say("    (pip install 'compilecache[metrics]' for cachelib.runtime's collector)")
        else:
            say("Prometheus metrics of the workload (cachelib.runtime):")
            for line in pod["metrics"].splitlines():
                if "compilecache_runtime" in line:
                    say(f"    {line}")
        hit = pod["cache"]["fxgraph_hit"] > 0 and pod["cache"]["fxgraph_miss"] == 0
        say()
        say("warm start: every FX-graph lookup hit." if hit else "warm start MISSED: see the counters above.")
        return 0 if hit else 1
    except DemoError as exc:
        print(f"compilecache demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if keep:
            say(f"(working directory kept: {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)


def floor_lines(eager: float, cold: float, hot: float, warm: float, preload: float) -> list[str]:
    """The first calls side by side, and what the seconds a warm start still costs are (pure)."""
    return [
        f"    first call, eager            {eager:.2f} s   (the floor: no compile at all)",
        f"    first call, cold compile     {cold:.2f} s",
        f"    first call, node's hot cache {hot:.2f} s   (the node compiled the model itself)",
        f"    first call, warm start       {warm:.2f} s   (after a {preload:.2f} s preload)",
        "    What a warm start costs over the eager call is Dynamo tracing the model again and rebuilding its",
        "    guards, and loading the compiled code: the node's own hot cache pays the same. With",
        "    spec.model.precompile: Auto the bundle carries Dynamo's precompiled entries, which skip most",
        "    of the tracing (docs/operator.md, \"The warm first call\").",
    ]


def _counters(cache: dict[str, int]) -> str:
    return (
        f"fxgraph hit {cache['fxgraph_hit']} / miss {cache['fxgraph_miss']}, "
        f"aotautograd hit {cache['aotautograd_hit']} / miss {cache['aotautograd_miss']}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["workload"]:
        sys.exit(workload_main(sys.argv[2:]))
    sys.exit(run_demo())
