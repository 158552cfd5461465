"""Warm-start benchmark: the first compiled call of a fresh process, cold and warm, every way.

For each reference model (bench/models.py) and compile mode, every row runs in its own
fresh Python process, one after another on one device:

  eager       first eager call (the floor), a sample in every round of the warm rows; the
              machine's very first process (it reads the CUDA libraries from disk) is
              kept apart as eager-first-process
  cold        torch.compile, empty TORCHINDUCTOR_CACHE_DIR
  hot         same cache dir again (a node that compiled the model itself)
  shared      a cache dir another process compiled into (a shared TORCHINDUCTOR_CACHE_DIR, such as an NFS
              mount every node sees), read in place; here on the same local disk: a shared mount's best case
  preloaded   compilecache: the warm-up harness compiles and publishes a bundle to Redis;
              `compilecache preload` fetches, verifies and unpacks it into an empty dir
              (its own process, timed); then compile against that dir (the init-container mode)
  sidecar     the same preload started together with the compiling process (the sidecar
              mode): the process imports torch, builds the model and wraps it meanwhile, and
              waits for the preload's done file (cachelib.handoff) just before its first call
  megacache   torch.compiler.load_cache_artifacts() of the cold run's Mega-Cache, then compile
  remote      PyTorch's own Redis remote caches (FX graph, AOTAutograd, autotune), empty local
              dir, warmed beforehand by another process
  warmstart   spec.model.precompile Auto: the harness compiles with --precompile auto (Dynamo's
              caching precompile and the warm-start manifest), the bundle is preloaded as above,
              and the process calls cachelib.runtime.warm_start() before torch.compile
  warmstart-env  the same bundle, no call: only TORCH_CACHING_PRECOMPILE=1 (what the webhook sets)
  warmstart-pool the warmstart row with TORCH_WARM_POOL=1 set by the workload: Inductor's
              compile-worker pool starts at the first compile (warm_start() leaves it alone)
  warmstart-nocc the warmstart row in an image without a C compiler: gcc, cc, clang and the
              rest hidden from PATH, CC unset
  warmstart-1thread the warmstart row with OMP_NUM_THREADS=1 (as torchrun sets it per worker): a
              global state other than the warm-up's, so the precompiled entry's guards fail
  precompiled torch.compile(step, fullgraph=True).aot_compile(...) saved by one process,
              torch.compiler.load_compiled_function() in a fresh one with an empty cache dir
              ("precompiled"), and again beside a copy of the preloaded cache dir
              ("precompiled+cachedir")

"1st call" figures start after the first torch.compile wrapper exists: creating it imports
Dynamo and Inductor, a fixed cost of every compiled process, reported on its own (wrap_s).
With caching precompile the wrapper also loads Dynamo's entry, so the warmstart rows import
Dynamo and Inductor first (import_s) and report the rest as load_s: the runtime call, then the
wrapper's creation (the load); their "1st call" is load_s + the call.
"To first output" is what a pod waits: from the process's spawn (and for the init-container
mode, the preload process's spawn) to the first call's result. Every measured process starts
as a fresh container does: its own empty HOME (no Triton or CUDA caches of earlier processes),
and, where the preloaded bundle carries the byte-code part, PYTHONPYCACHEPREFIX on it as the
webhook sets it for an init-container preload. `--image-bytecode` measures an image that
carries byte code of its own instead: every process, eager ones too, reads one tree compiled
beforehand (then the warm-up ships none). Each child reports the compiled C modules that
Triton built in it (`triton_modules_built`) and where.
Each process reports its torch cache counters: a warm row with any miss is reported as a
miss. Warm-up processes that are not themselves measured (the harness, the remote-cache
warm-up, the ahead-of-time save) run in parallel between the timed phases. `--rows` picks a
subset of the rows; `--breakdown MODEL` adds the profiled warm first call of one model.

    python bench/warm_start.py --device cuda --out out/warm-start
    python bench/warm_start.py --device cpu --tiny --out /tmp/ws   # a check without a GPU
    python bench/warm_start.py render out/a/results.json out/b/results.json > table.md

The simpler ways side by side (README.md): eager, cold, the node's hot cache, a shared cache directory,
PyTorch's Redis remote cache and compilecache's preload, in one run:

    python bench/warm_start.py --device cpu --tiny --models gpt2 --autotune-model '' --precompile none \
        --breakdown '' --rows eager,cold,hot,shared,remote,preloaded --repeat 3 --out out/simpler
    python bench/warm_start.py simpler out/simpler/results.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("gpt2", "resnet50", "llama1b", "gpt2_train")
AUTOTUNE_MODE = "max-autotune-no-cudagraphs"
REMOTE_ENV = {
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "1",
}
# The `compilecache` console script, without needing the package installed.
CLI = ("-c", "import sys; from cachelib.cli import main; sys.exit(main())")
WARMSTART_ROWS = ("warmstart", "warmstart-env", "warmstart-pool", "warmstart-nocc", "warmstart-1thread")
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "cpp", "x86_64-linux-gnu-gcc", "x86_64-linux-gnu-g++",
             "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")
ROWS = ("eager", "cold", "hot", "shared", "preloaded", "sidecar", "megacache", "remote", *WARMSTART_ROWS,
        "precompiled")
# Rows whose cache lookups must all hit.
WARM_ROWS = ("hot", "shared", "preloaded", "sidecar", "megacache", "remote")
SIMPLER = ("eager", "cold", "hot", "shared", "remote", "preloaded")
"""The rows of the comparison with the simpler ways (README.md, "The simpler ways"): ``simpler`` prints them."""
DONE_FILE_ENV = "COMPILECACHE_PRELOAD_DONE"  # cachelib.handoff's, without importing it here

# =======================================================================================
# Child: one measured process. Imports torch only here, so the parent stays light.


def child_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="warm_start.py child")
    p.add_argument("row", choices=["eager", "compile", "aot-save", "aot-load", "breakdown"])
    p.add_argument("--model", required=True)
    p.add_argument("--mode", default="default")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--result", required=True, type=Path)
    p.add_argument("--megacache-save", type=Path)
    p.add_argument("--megacache-load", type=Path)
    p.add_argument("--aot", type=Path, help="ahead-of-time compiled function file (save or load)")
    p.add_argument("--profile", type=Path, help="breakdown: also write cProfile statistics here")
    p.add_argument("--wait-preload", action="store_true", help=f"wait for ${DONE_FILE_ENV} before the first call")
    p.add_argument("--warm-start", action="store_true", help="call cachelib.runtime.warm_start() before compiling")
    p.add_argument("--precompile-load", action="store_true", help="time the wrapper's creation as load_s")
    args = p.parse_args(argv)
    started = time.perf_counter()
    started_epoch = time.time()
    import torch

    from bench import models

    record: dict[str, Any] = {"row": args.row, "model": args.model, "mode": args.mode, "pid": os.getpid()}
    record["import_torch_s"] = time.perf_counter() - started
    try:
        workload = models.get(args.model)
        t = time.perf_counter()
        _model, step_args = workload.make(args.device, args.tiny)
        _sync(torch, args.device)
        record["build_s"] = time.perf_counter() - t
        record.update(_run_row(torch, args, workload, step_args))
        record["ok"] = True
    except Exception as exc:  # reported, never hidden: the row shows the error
        import traceback

        record["ok"] = False
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
    record["counters"] = _counters(torch)
    record["triton_modules_built"] = _triton_modules_built(started_epoch)
    record["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if args.device == "cuda" and torch.cuda.is_available():
        record["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    args.result.write_text(json.dumps(record, indent=1, default=str))
    # Leave at once: everything measured is written, and an orderly exit waits on inductor's
    # compile-worker pool (10-20 s on a 16-core machine) that no row's figures include.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if record["ok"] else 1)


def _triton_modules_built(since: float) -> list[str]:
    """The compiled C modules (Triton's driver utilities and launchers: ``*.so``) written since
    ``since`` below HOME or the Inductor cache dir, less those the bundle shipped (cachelib.in_image.triton_modules
    installs them): what this process had to build with a C compiler."""
    cache_dir = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/nonexistent"))
    part = cache_dir / "compilecache-triton-modules"  # cachelib.in_image.triton_modules.PART_DIR: installed, not built
    shipped = {p.relative_to(part).as_posix() for p in part.rglob("*.so")} if part.is_dir() else set()
    found = []
    for root in (Path.home(), cache_dir):
        if not root.is_dir():
            continue
        for path in root.rglob("*.so"):
            if "compilecache-pycache" in path.parts or part in path.parents:
                continue
            with contextlib.suppress(OSError):
                if path.stat().st_mtime >= since and f"{path.parent.name}/{path.name}" not in shipped:
                    found.append(str(path))
    return sorted(found)


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _call(torch: Any, fn: Any, step_args: tuple[Any, ...], backward: bool, device: str) -> tuple[float, Any]:
    """Seconds of one call, synchronised: inference under ``no_grad`` (as the harness runs it),
    a training step as forward plus ``backward``."""
    t = time.perf_counter()
    if backward:
        out = fn(*step_args)
        out.backward()
    else:
        with torch.no_grad():
            out = fn(*step_args)
    _sync(torch, device)
    return time.perf_counter() - t, out.detach()


def _relative_error(torch: Any, got: Any, want: Any) -> float:
    got, want = got.float(), want.float()
    return float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp_min(1e-12))


def _run_row(torch: Any, args: argparse.Namespace, workload: Any, step_args: tuple[Any, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.row == "eager":
        out["first_call_s"], _ = _call(torch, workload.step, step_args, workload.backward, args.device)
        out["first_output_epoch"] = time.time()
        out["second_call_s"], _ = _call(torch, workload.step, step_args, workload.backward, args.device)
        return out
    if args.precompile_load:  # the fixed imports first, so that load_s holds only the warm start's work
        t = time.perf_counter()
        import torch._dynamo
        import torch._inductor.compile_fx

        out["import_s"] = time.perf_counter() - t
    # A warm start's load happens before the first call: a breakdown profiles it too (in its own file).
    load_profile = args.profile.with_suffix(".load.pstats") if args.profile and args.precompile_load else None
    with _profiled(load_profile):
        if args.warm_start:
            from cachelib import runtime

            t = time.perf_counter()
            out["warm_start"] = runtime.warm_start().to_dict()
            out["warm_start_s"] = time.perf_counter() - t
        # Creating the first torch.compile wrapper imports Dynamo and Inductor: a fixed cost of
        # every compiled process, timed on its own (wrap_s) before anything else, in every row.
        t = time.perf_counter()
        compiled = torch.compile(workload.step, **_compile_options(args.mode))
        out["wrap_s"] = time.perf_counter() - t
    if args.precompile_load:
        out["load_s"] = out.get("warm_start_s", 0.0) + out["wrap_s"]
    if args.row in ("aot-save", "aot-load"):
        return out | _run_aot(torch, args, workload, step_args)
    if args.megacache_load is not None:
        t = time.perf_counter()
        info = torch.compiler.load_cache_artifacts(args.megacache_load.read_bytes())
        out["load_s"] = time.perf_counter() - t
        out["megacache_loaded"] = _cache_info(info)
    if args.row == "breakdown":
        return out | _run_breakdown(torch, args, workload, compiled, step_args)
    if args.wait_preload:  # as a workload beside a sidecar preload does, just before its first call
        from cachelib.handoff import wait_for_preload

        t = time.perf_counter()
        waited = wait_for_preload(timeout=300) or {"result": "no done file configured"}
        out["preload_wait_s"] = time.perf_counter() - t
        out["preload_result"] = waited["result"]
    out["first_call_s"], got = _call(torch, compiled, step_args, workload.backward, args.device)
    out["first_output_epoch"] = time.time()
    out["second_call_s"], _ = _call(torch, compiled, step_args, workload.backward, args.device)
    out["rel_error_vs_eager"] = _relative_error(torch, got, _eager_reference(torch, workload, step_args))
    if args.megacache_save is not None:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            raise RuntimeError("save_cache_artifacts() returned nothing: no artifacts were recorded")
        args.megacache_save.write_bytes(saved[0])
        out["megacache_bytes"] = len(saved[0])
        out["megacache_saved"] = _cache_info(saved[1])
    return out


def _compile_options(mode: str) -> dict[str, Any]:
    return {} if mode == "default" else {"mode": mode}


def _eager_reference(torch: Any, workload: Any, step_args: tuple[Any, ...]) -> Any:
    with torch.no_grad():
        return workload.step(*step_args).detach()


def _cache_info(info: Any) -> dict[str, int]:
    if info is None:
        return {}
    return {name: len(value) for name, value in vars(info).items() if isinstance(value, list)}


def _run_aot(torch: Any, args: argparse.Namespace, workload: Any, step_args: tuple[Any, ...]) -> dict[str, Any]:
    from bench import precompile

    out: dict[str, Any] = {}
    if args.row == "aot-save":
        t = time.perf_counter()
        with contextlib.nullcontext() if workload.backward else torch.no_grad():
            out["artifact_bytes"] = precompile.save(workload.step, step_args, args.aot, **_compile_options(args.mode))
        out["compile_and_save_s"] = time.perf_counter() - t
        return out
    with _profiled(args.profile):
        t = time.perf_counter()
        fn = precompile.load(args.aot)
        out["load_s"] = time.perf_counter() - t
        out["first_call_s"], got = _call(torch, fn, step_args, workload.backward, args.device)
    out["second_call_s"], _ = _call(torch, fn, step_args, workload.backward, args.device)
    out["rel_error_vs_eager"] = _relative_error(torch, got, _eager_reference(torch, workload, step_args))
    return out


@contextlib.contextmanager
def _profiled(path: Path | None) -> Iterator[None]:
    """cProfile the block into ``path`` (nothing when ``path`` is None)."""
    if path is None:
        yield
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(str(path))


def _run_breakdown(
    torch: Any, args: argparse.Namespace, workload: Any, compiled: Any, step_args: tuple[Any, ...]
) -> dict[str, Any]:
    """Where a warm first call spends its time: torch's own compile timers, optionally cProfile."""
    from torch._dynamo import utils as dynamo_utils

    with _profiled(args.profile):
        first, _ = _call(torch, compiled, step_args, workload.backward, args.device)
    second, _ = _call(torch, compiled, step_args, workload.backward, args.device)
    phases = {name: sum(times) for name, times in dynamo_utils.compilation_time_metrics.items()}
    metrics = [
        {k: v for k, v in vars(m).items() if isinstance(v, int | float | bool) and v is not None}
        for m in dynamo_utils.get_compilation_metrics()
    ]
    return {
        "first_call_s": first,
        "second_call_s": second,
        "phases_s": phases,
        "compilation_metrics": metrics,
    }


def _counters(torch: Any) -> dict[str, dict[str, int]]:
    """torch's cache and graph counters of this process (empty when dynamo never loaded)."""
    if "torch._dynamo" not in sys.modules:
        return {}
    from torch._dynamo.utils import counters

    wanted = ("inductor", "aot_autograd", "stats", "dynamo_cache", "frames")
    return {section: dict(counters[section]) for section in wanted if counters.get(section)}


# =======================================================================================
# Parent: plan, run the processes, collect, render.


@dataclass(frozen=True)
class Config:
    """One model under one compile mode."""

    model: str
    mode: str = "default"

    @property
    def label(self) -> str:
        return self.model if self.mode == "default" else f"{self.model} [{self.mode}]"

    @property
    def slug(self) -> str:
        """A name usable as a directory and as a CompileCache name."""
        name = self.model if self.mode == "default" else f"{self.model}-{self.mode}"
        return name.replace("_", "-")


@dataclass
class Bench:
    device: str
    tiny: bool
    work: Path
    store_url: str
    redis: tuple[str, int] | None
    jobs: int
    selected: frozenset[str] = frozenset(ROWS)
    repeat: int = 1
    python: str = sys.executable
    image_pycache: Path | None = None
    cpus: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    _homes: int = 0

    # -- processes -------------------------------------------------------------------
    def env(self, cache_dir: Path | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_CACHE"))}
        env.pop("TORCH_COMPILE_JOB_ID", None)
        env.pop("PYTHONPYCACHEPREFIX", None)
        if self.image_pycache is not None:  # an image with byte code of its own
            env["PYTHONPYCACHEPREFIX"] = str(self.image_pycache)
        self._homes += 1  # a fresh container: nothing cached in HOME by earlier processes
        home = self.work / "homes" / str(self._homes)
        home.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(home)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        env["PYTHONUNBUFFERED"] = "1"
        if self.tiny:
            env["WARM_START_TINY"] = "1"
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        if self.redis is not None:
            env["TORCHINDUCTOR_REDIS_HOST"], env["TORCHINDUCTOR_REDIS_PORT"] = self.redis[0], str(self.redis[1])
        env.update(extra or {})
        for name in ("CC", "CXX"):  # an empty value unsets it (the image without a compiler)
            if env.get(name) == "":
                del env[name]
        return env

    def child(
        self,
        cfg: Config,
        row: str,
        name: str,
        cache_dir: Path | None,
        *extra_args: str,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        result = self.work / cfg.slug / f"{name}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        cmd = [self.python, str(Path(__file__).resolve()), "child", row, "--model", cfg.model, "--mode", cfg.mode]
        cmd += ["--device", self.device, "--result", str(result), *extra_args]
        if self.tiny:
            cmd.append("--tiny")
        if self.cpus:  # a pod with that many CPUs: the process and every one it starts
            cmd = ["taskset", "-c", f"0-{self.cpus - 1}", *cmd]
        spawned = time.time()
        t = time.perf_counter()
        proc = run_isolated(cmd, self.env(cache_dir, env))
        wall = time.perf_counter() - t
        record: dict[str, Any] = json.loads(result.read_text()) if result.exists() else {"ok": False}
        record.update(config=cfg.label, model=cfg.model, mode=cfg.mode, name=name, process_wall_s=wall)
        if "first_output_epoch" in record:
            record["to_first_output_s"] = record["first_output_epoch"] - spawned
        if proc.returncode != 0:
            record["ok"] = False
            record.setdefault("error", f"exit {proc.returncode}")
            record["stderr_tail"] = proc.stderr[-3000:]
        _log(f"{cfg.label:40s} {name:14s} {_brief(record)}")
        return record

    def tool(self, cfg: Config, name: str, cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
        """Run a compilecache command (harness, publish, preload) and time the whole process; with a CPU
        share (``--cpus``), under the same share as the pods (a warm-up Job of the pods' shape)."""
        if self.cpus:
            cmd = ["taskset", "-c", f"0-{self.cpus - 1}", *cmd]
        spawned = time.time()
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t
        record: dict[str, Any] = {
            "config": cfg.label,
            "model": cfg.model,
            "mode": cfg.mode,
            "name": name,
            "process_wall_s": wall,
            "spawned_epoch": spawned,
            "ok": proc.returncode == 0,
            "command": " ".join(cmd),
        }
        last = _last_json_line(proc.stdout)
        if last is not None:
            record["output"] = last
        if proc.returncode != 0:
            record["error"] = f"exit {proc.returncode}"
            record["stderr_tail"] = proc.stderr[-3000:]
        _log(f"{cfg.label:40s} {name:14s} {'ok' if record['ok'] else record['error']} wall {wall:.2f}s")
        return record

    # -- the flow for one config ---------------------------------------------------------
    def dirs(self, cfg: Config, name: str) -> Path:
        return self.work / cfg.slug / name

    def timed_cold(self, cfg: Config) -> None:
        if "eager" in self.selected:  # kept apart: the machine's first process reads the CUDA libraries from disk
            self.rows.append(self.child(cfg, "eager", "eager-first-process", self.dirs(cfg, "eager-cache")))
        if self.selected & {"cold", "hot", "megacache"}:
            mega = self.work / cfg.slug / "megacache.bin"
            local = self.dirs(cfg, "local")
            self.rows.append(self.child(cfg, "compile", "cold", local, "--megacache-save", str(mega)))

    def warmups(self, cfg: Config, precompile: bool) -> list[tuple[str, Any]]:
        """(name, thunk) pairs of the unmeasured warm-up processes of one config."""
        todo: list[tuple[str, Any]] = []
        if self.selected & {"preloaded", "precompiled"}:
            todo.append(("harness+publish", lambda: self.harness_publish(cfg)))
        if self.selected & set(WARMSTART_ROWS):
            todo.append(("harness+publish auto", lambda: self.harness_publish(cfg, precompile=True)))
        if "shared" in self.selected:  # another node compiles into the shared directory first
            todo.append(
                ("shared-warmup", lambda: [self.child(cfg, "compile", "shared-warmup", self.dirs(cfg, "shared"))])
            )
        if self.redis is not None and "remote" in self.selected:
            todo.append(
                (
                    "remote-warmup",
                    lambda: [self.child(cfg, "compile", "remote-warmup", self.dirs(cfg, "r1"), env=REMOTE_ENV)],
                )
            )
        if precompile:
            aot = str(self.work / cfg.slug / "precompiled.bin")
            todo.append(
                ("aot-save", lambda: [self.child(cfg, "aot-save", "aot-save", self.dirs(cfg, "s"), "--aot", aot)])
            )
        return todo

    def harness_publish(self, cfg: Config, precompile: bool = False) -> list[dict[str, Any]]:
        out = self.dirs(cfg, "harness-out-auto" if precompile else "harness-out")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [self.python, str(REPO / "cachelib" / "harness.py"), "--target", f"bench.models:{cfg.model}_target"]
        cmd += ["--out", str(out), "--namespace", "bench", "--name", cfg.slug + ("-auto" if precompile else "")]
        if precompile:
            cmd += ["--precompile", "auto"]
        if cfg.mode != "default":
            cmd += ["--mode", cfg.mode]
        if _models().get(cfg.model).backward:
            cmd.append("--backward")
        records = [self.tool(cfg, "harness", cmd, self.env(None))]
        if records[0]["ok"]:
            publish = [self.python, *CLI, "publish", str(out), "--store", self.store_url]
            records.append(self.tool(cfg, "publish", publish, self.env(None)))
        return records

    def timed_warm(self, cfg: Config, precompile: bool) -> None:
        for sample in range(self.repeat):  # rounds of the rows the goals are read against
            if "eager" in self.selected:  # the floor, measured in the same rounds as the warm rows
                self.rows.append(self.child(cfg, "eager", "eager", self.dirs(cfg, "eager-cache")))
            if "hot" in self.selected:
                self.rows.append(self.child(cfg, "compile", "hot", self.dirs(cfg, "local")))
            if "shared" in self.selected:
                self.rows.append(self.child(cfg, "compile", "shared", self.dirs(cfg, "shared")))
            if self.selected & {"preloaded", "precompiled"} and (sample == 0 or "preloaded" in self.selected):
                self.rows.extend(self.preload_then_compile(cfg, compile_after="preloaded" in self.selected))
            if "sidecar" in self.selected:
                self.rows.extend(self.preload_beside_compile(cfg))
            for name in WARMSTART_ROWS:
                if name in self.selected:
                    self.rows.extend(self.preload_then_warm_start(cfg, name))
            if self.redis is not None and "remote" in self.selected:
                remote_dir = self.dirs(cfg, f"r2-{sample}")  # empty: every lookup goes to Redis
                self.rows.append(self.child(cfg, "compile", "remote", remote_dir, env=REMOTE_ENV))
        mega = self.work / cfg.slug / "megacache.bin"
        if mega.exists() and "megacache" in self.selected:
            self.rows.append(
                self.child(cfg, "compile", "megacache", self.dirs(cfg, "m"), "--megacache-load", str(mega))
            )
        aot = self.work / cfg.slug / "precompiled.bin"
        if precompile and aot.exists():
            self.rows.append(self.child(cfg, "aot-load", "precompiled", self.dirs(cfg, "l"), "--aot", str(aot)))
            # The third part next to the bundle's cache dir: autotuning results and kernels are there.
            beside = self.dirs(cfg, "l2")
            shutil.rmtree(beside, ignore_errors=True)
            if self.dirs(cfg, "preloaded").is_dir():
                shutil.copytree(self.dirs(cfg, "preloaded"), beside)
                self.rows.append(self.child(cfg, "aot-load", "precompiled+cachedir", beside, "--aot", str(aot)))

    def preload_then_warm_start(self, cfg: Config, name: str) -> list[dict[str, Any]]:
        """The init-container mode with a ``precompile: Auto`` bundle: the preload, then the
        process that calls ``runtime.warm_start()`` (``warmstart``) or has only the env set."""
        target = self.dirs(cfg, name)
        cmd = self.preload_command(cfg, target, "--strict", auto=True)
        preload = self.tool(cfg, f"preload-{name}", cmd, self.preload_env(cfg))
        if not preload["ok"]:
            return [preload]
        flags = ["--precompile-load"] + (["--warm-start"] if name != "warmstart-env" else [])
        extra = {"TORCH_CACHING_PRECOMPILE": "1", **bytecode_env(target)}
        if name == "warmstart-pool":
            extra["TORCH_WARM_POOL"] = "1"
        if name == "warmstart-1thread":
            extra["OMP_NUM_THREADS"] = "1"
        if name == "warmstart-nocc":
            extra.update(PATH=str(self.path_without_compilers()), CC="", CXX="")
        env = self.job_env(cfg, extra, auto=True)
        return [preload, self.child(cfg, "compile", name, target, *flags, env=env)]

    def path_without_compilers(self) -> Path:
        """A directory of links to every program on PATH except the C and C++ compilers."""
        bare = self.work / "path-without-compilers"
        if not bare.is_dir():
            bare.mkdir(parents=True)
            for directory in os.environ.get("PATH", "").split(os.pathsep):
                if not directory or not Path(directory).is_dir():
                    continue
                for program in Path(directory).iterdir():
                    name = program.name
                    compiler = name in COMPILERS or name.startswith(("gcc-", "g++-", "clang-", "cc-"))
                    if not compiler and not (bare / name).exists() and os.access(program, os.X_OK):
                        (bare / name).symlink_to(program)
        return bare

    def preload_command(self, cfg: Config, target: Path, *options: str, auto: bool = False) -> list[str]:
        """`compilecache preload` of the harness's bundle into ``target`` (an empty directory)."""
        shutil.rmtree(target, ignore_errors=True)
        cmd = [self.python, *CLI, "preload", "--store", self.store_url]
        key = self._harness_result(cfg, auto).get("key_string")
        cmd += ["--key", str(key)] if key else ["--cache", f"bench/{cfg.slug}" + ("-auto" if auto else "")]
        return [*cmd, "--target", str(target), *options]

    def preload_env(self, cfg: Config) -> dict[str, str]:
        return self.env(None, {"COMPILECACHE_TERMINATION_LOG": str(self.work / cfg.slug / "termination-log")})

    def job_env(self, cfg: Config, extra: dict[str, str] | None = None, auto: bool = False) -> dict[str, str]:
        job_id = self._harness_result(cfg, auto).get("job_id")
        return ({"TORCH_COMPILE_JOB_ID": str(job_id)} if job_id else {}) | (extra or {})

    def preload_then_compile(self, cfg: Config, compile_after: bool = True) -> list[dict[str, Any]]:
        """The init-container mode: the preload process, then the compiling process."""
        target = self.dirs(cfg, "preloaded")
        preload = self.tool(cfg, "preload", self.preload_command(cfg, target, "--strict"), self.preload_env(cfg))
        if not preload["ok"] or not compile_after:
            return [preload]
        return [preload, self.child(cfg, "compile", "preloaded", target, env=self.job_env(cfg, bytecode_env(target)))]

    def preload_beside_compile(self, cfg: Config) -> list[dict[str, Any]]:
        """The sidecar mode: the preload and the compiling process start together; the latter
        waits for the preload's done file just before its first call. (``--done-file`` without
        ``--sidecar``: the same work, but the process exits instead of idling until SIGTERM.)"""
        target = self.dirs(cfg, "sidecar")
        done = target / ".compilecache-preload.json"
        cmd = self.preload_command(cfg, target, "--done-file", str(done))
        target.mkdir(parents=True)  # the pod's emptyDir exists before either container starts
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            preload = pool.submit(self.tool, cfg, "preload-beside", cmd, self.preload_env(cfg))
            row = self.child(cfg, "compile", "sidecar", target, "--wait-preload",
                             env=self.job_env(cfg, {DONE_FILE_ENV: str(done)}))  # fmt: skip
            return [preload.result(), row]

    def _harness_result(self, cfg: Config, auto: bool = False) -> dict[str, Any]:
        """The warm-up harness's result.json (key, job id, counters), empty when it did not run."""
        result = self.dirs(cfg, "harness-out-auto" if auto else "harness-out") / "result.json"
        return json.loads(result.read_text()) if result.exists() else {}

    def breakdown(self, cfg: Config) -> None:
        """The hot first call again, once with torch's timers and once under cProfile."""
        warm = self.dirs(cfg, "local")
        if not warm.is_dir():  # no cold row in this run: a copy of the preloaded bundle
            warm = self.dirs(cfg, "breakdown-cache")
            shutil.rmtree(warm, ignore_errors=True)
            shutil.copytree(self.dirs(cfg, "preloaded"), warm)
        self.rows.append(self.child(cfg, "breakdown", "breakdown", warm))
        prof = self.work / cfg.slug / "breakdown.pstats"
        self.rows.append(self.child(cfg, "breakdown", "breakdown-cprofile", warm, "--profile", str(prof)))
        if prof.exists():
            self.rows[-1]["profile_buckets_s"] = profile_buckets(prof)
            self.rows[-1]["profile_top"] = profile_top(prof)
        if self.dirs(cfg, "warmstart").is_dir():  # the same first call with the Auto bundle
            warm = self.dirs(cfg, "breakdown-warmstart-cache")
            shutil.rmtree(warm, ignore_errors=True)
            shutil.copytree(self.dirs(cfg, "warmstart"), warm)
            env = self.job_env(cfg, {"TORCH_CACHING_PRECOMPILE": "1", **bytecode_env(warm)}, auto=True)
            flags = ("--warm-start", "--precompile-load")
            self.rows.append(self.child(cfg, "breakdown", "breakdown-warmstart", warm, *flags, env=env))
            prof = self.work / cfg.slug / "breakdown-warmstart.pstats"
            shutil.rmtree(warm, ignore_errors=True)
            shutil.copytree(self.dirs(cfg, "warmstart"), warm)
            self.rows.append(self.child(cfg, "breakdown", "breakdown-warmstart-cprofile", warm, *flags,
                                        "--profile", str(prof), env=env))  # fmt: skip
            if prof.exists():
                self.rows[-1]["profile_buckets_s"] = profile_buckets(prof)
                self.rows[-1]["profile_top"] = profile_top(prof)
            if prof.with_suffix(".load.pstats").exists():
                self.rows[-1]["load_profile_top"] = profile_top(prof.with_suffix(".load.pstats"), limit=60)
                self.rows[-1]["load_profile_self"] = profile_top(prof.with_suffix(".load.pstats"), 40, by_self=True)
                self.rows[-1]["load_profile_keys"] = profile_named(prof.with_suffix(".load.pstats"), KEY_FUNCTIONS)
        aot = self.work / cfg.slug / "precompiled.bin"
        if aot.exists():
            prof = self.work / cfg.slug / "precompiled.pstats"
            name = "precompiled-cprofile"
            self.rows.append(
                self.child(cfg, "aot-load", name, self.dirs(cfg, "l3"), "--aot", str(aot), "--profile", str(prof))
            )
            if prof.exists():
                self.rows[-1]["profile_buckets_s"] = profile_buckets(prof)
                self.rows[-1]["profile_top"] = profile_top(prof, limit=60)


def bytecode_env(cache_dir: Path) -> dict[str, str]:
    """``PYTHONPYCACHEPREFIX`` on the preloaded bundle's byte-code part, as the webhook sets it for an
    init-container preload; nothing when the bundle has none (an image with byte code of its own)."""
    tree = cache_dir / "compilecache-pycache"  # cachelib.in_image.bytecode.PYCACHE_DIR, without importing it here
    return {"PYTHONPYCACHEPREFIX": str(tree)} if tree.is_dir() else {}


def run_isolated(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a measured child in its own session; once it exits, kill what it left behind.

    A child leaves with os._exit() as soon as its figures are written; inductor's compile
    workers it started are still importing torch then, and would steal the CPU from the
    next measured process. Killing the child's process group ends them.
    """
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_parallel(todo: list[tuple[str, Any]], jobs: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for result in pool.map(lambda item: item[1](), todo):
            records.extend(result)
    return records


# -- cProfile of the warm first call, bucketed by what the time is for -----------------
# (bucket, file suffix, function name). The first matching entry's cumulative time counts;
# nested buckets are reported as they are (cumulative), not subtracted.
PROFILE_BUCKETS = (
    ("dynamo: whole frame compile (_compile)", "_dynamo/convert_frame.py", "_compile"),
    ("dynamo: InstructionTranslator.run (tracing + backend call)", "_dynamo/symbolic_convert.py", "run"),
    ("dynamo: guard building (CheckFunctionManager)", "_dynamo/guards.py", "__init__"),
    ("backend: call_user_compiler", "_dynamo/output_graph.py", "call_user_compiler"),
    ("aot_autograd: cache load", "_aot_autograd/autograd_cache.py", "try_load"),
    ("inductor: FX graph cache lookup", "_inductor/codecache.py", "_lookup_graph"),
    ("inductor: load output code (PyCodeCache.load_by_key_path)", "_inductor/codecache.py", "load_by_key_path"),
    ("triton: kernel load (CachingAutotuner.precompile)", "_inductor/runtime/triton_heuristics.py", "precompile"),
    ("triton: static launcher load", "_inductor/runtime/static_cuda_launcher.py", "load_kernel"),
    ("triton: bundle read (TritonBundler.read_and_emit)", "_inductor/triton_bundler.py", "read_and_emit"),
    ("async compile pool start", "_inductor/async_compile.py", "warm_pool"),
)


def profile_buckets(path: Path) -> dict[str, float]:
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    buckets: dict[str, float] = {}
    for label, suffix, func in PROFILE_BUCKETS:
        total = sum(v[3] for (file, _, name), v in stats.items() if file.endswith(suffix) and name == func)
        buckets[label] = round(total, 4)
    tracing = buckets[PROFILE_BUCKETS[1][0]] - buckets[PROFILE_BUCKETS[3][0]]
    buckets["dynamo: tracing alone (run - call_user_compiler)"] = round(tracing, 4)
    return buckets


def profile_top(path: Path, limit: int = 40, by_self: bool = False) -> list[dict[str, Any]]:
    """The profile's top functions by cumulative seconds, or by their own seconds (``by_self``)."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    column = 2 if by_self else 3
    rows = sorted(stats.items(), key=lambda kv: kv[1][column], reverse=True)[:limit]
    return [
        {"function": f"{_short(file)}:{line}:{name}", "cumulative_s": round(v[3], 4), "self_s": round(v[2], 4),
         "calls": v[1]}
        for (file, line, name), v in rows
    ]  # fmt: skip


KEY_FUNCTIONS = ("triton_key", "torch_key", "get_code_hash", "build_code_hash")
"""The source hashes a warm start may still pay for, looked up by name in a profile."""


def profile_named(path: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """Every profiled function whose name is one of ``names``, with its cumulative seconds."""
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    return [
        {"function": f"{_short(file)}:{line}:{name}", "cumulative_s": round(v[3], 4), "calls": v[1]}
        for (file, line, name), v in stats.items()
        if name in names
    ]


def _short(file: str) -> str:
    marker = "site-packages/"
    return file.split(marker, 1)[1] if marker in file else file


# -- redis-server ------------------------------------------------------------------------
@contextlib.contextmanager
def redis_server(binary: str | None, work: Path) -> Iterator[tuple[str, int] | None]:
    """A throwaway redis-server on a free loopback port, or None when no binary is found."""
    path = binary or shutil.which("redis-server")
    if path is None:
        yield None
        return
    port = _free_port()
    log = work / "redis.log"
    cmd = [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    cmd += ["--dir", str(work), "--protected-mode", "no"]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc, log)
        yield ("127.0.0.1", port)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not listen on port {port} within 10 s")


# -- environment facts -------------------------------------------------------------------
def environment(python: str) -> dict[str, Any]:
    probe = (
        "import json, torch, platform; t = None\n"
        "try:\n import triton; t = triton.__version__\nexcept ImportError: pass\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'torch': torch.__version__, 'triton': t, 'cuda': torch.version.cuda,"
        " 'python': platform.python_version(), 'gpu': torch.cuda.get_device_name() if cuda else None,"
        " 'capability': '.'.join(map(str, torch.cuda.get_device_capability())) if cuda else None}))"
    )
    facts: dict[str, Any] = json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout)
    facts["host"] = {"machine": platform.machine(), "cpus": os.cpu_count(), "kernel": platform.release()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        facts["nvidia_smi"] = q.stdout.strip()
    return facts


# -- summary -----------------------------------------------------------------------------
def cache_verdict(record: dict[str, Any]) -> str:
    """'hit' when every cache lookup hit, 'miss (N)' otherwise; '' when the row has no lookups."""
    c = record.get("counters", {})
    ind, aot, dyn = c.get("inductor", {}), c.get("aot_autograd", {}), c.get("dynamo_cache", {})
    hits = ind.get("fxgraph_cache_hit", 0) + aot.get("autograd_cache_hit", 0) + dyn.get("dynamo_cache_hit", 0)
    misses = ind.get("fxgraph_cache_miss", 0) + aot.get("autograd_cache_miss", 0) + dyn.get("dynamo_cache_miss", 0)
    if misses:
        return f"MISS ({misses} miss, {hits} hit)"
    if dyn.get("dynamo_cache_hit") and c.get("frames", {}).get("ok"):  # loaded, yet Dynamo compiled a frame
        return f"recompiled ({c['frames']['ok']} frames)"
    return "hit" if hits else "no lookups"


def print_and_save(result: dict[str, Any], out: Path | None) -> None:
    """A probe's result: printed as JSON, and written to ``out`` too when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        out.write_text(text)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summarise_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One row's figures over its samples: medians; a cache verdict or preload result other than
    hit in any sample is reported as that row's (a miss is never averaged away)."""
    failed = [r for r in samples if not r.get("ok")]
    if failed:
        return {"error": failed[0].get("error", "failed"), "samples": len(samples)}
    verdicts = [cache_verdict(r) for r in samples]
    out: dict[str, Any] = {
        "first_call_s": median([r["first_call_s"] for r in samples]) if "first_call_s" in samples[0] else None,
        "cache": next((v for v in verdicts if v != "hit"), verdicts[0]),
        "samples": len(samples),
    }
    if len(samples) > 1 and out["first_call_s"] is not None:
        out["first_call_all_s"] = [round(r["first_call_s"], 3) for r in samples]
    for extra in ("load_s", "to_first_output_s", "preload_wait_s", *BREAKDOWN):
        if all(extra in r for r in samples):
            out[extra] = median([r[extra] for r in samples])
    out["triton_modules_built"] = max(len(r.get("triton_modules_built", [])) for r in samples)
    results = [r["preload_result"] for r in samples if "preload_result" in r]
    if results:
        out["preload_result"] = next((x for x in results if x != "hit"), results[0])
    return out


BREAKDOWN = ("import_torch_s", "build_s", "import_s", "wrap_s")
"""A process's own steps before its first call (see the child's record)."""


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per config with the figures the goals are read against (medians over samples)."""
    configs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        configs.setdefault(r["config"], {}).setdefault(r["name"], []).append(r)
    out = []
    for label, by in configs.items():
        s: dict[str, Any] = {"config": label}
        for name in (
            "eager",
            "cold",
            "hot",
            "shared",
            "preloaded",
            "sidecar",
            "megacache",
            "remote",
            *WARMSTART_ROWS,
            "precompiled",
            "precompiled+cachedir",
        ):
            if name in by:
                s[name] = summarise_samples(by[name])
        for name, key in (
            ("preload", "preload"),
            ("preload-beside", "preload_beside"),
            *((f"preload-{n}", f"preload_{n}") for n in WARMSTART_ROWS),
        ):
            tools = by.get(name)
            if tools:
                s[key] = {
                    "wall_s": median([t["process_wall_s"] for t in tools]),
                    "ok": all(t["ok"] for t in tools),
                    "samples": len(tools),
                    "output": tools[-1].get("output"),
                }
        s["goals"] = goals(s)
        out.append(s)
    return out


def _first(s: dict[str, Any], name: str) -> float | None:
    v = s.get(name)
    return v.get("first_call_s") if isinstance(v, dict) else None


def preloaded_total(s: dict[str, Any]) -> float | None:
    first, pre = _first(s, "preloaded"), s.get("preload")
    if first is None or not pre or not pre.get("ok"):
        return None
    return float(pre["wall_s"]) + first


def sidecar_total(s: dict[str, Any]) -> float | None:
    """The sidecar mode's share of the first call: the wait for the preload plus the call."""
    v = s.get("sidecar")
    if not isinstance(v, dict) or v.get("first_call_s") is None or "preload_wait_s" not in v:
        return None
    return float(v["preload_wait_s"]) + float(v["first_call_s"])


def warm_first(s: dict[str, Any], name: str) -> float | None:
    """A row's warm first call; for the warmstart rows with the load (runtime call and wrapper)."""
    v = s.get(name)
    if not isinstance(v, dict) or v.get("first_call_s") is None:
        return None
    return float(v["first_call_s"]) + float(v.get("load_s", 0.0) if name in WARMSTART_ROWS else 0.0)


def to_first_output(s: dict[str, Any], name: str) -> float | None:
    """Seconds from the spawn of a row's first process to its first output; for the
    init-container mode the preload process's wall time comes first."""
    v = s.get(name)
    if not isinstance(v, dict) or v.get("to_first_output_s") is None:
        return None
    if name in ("preloaded", *WARMSTART_ROWS):
        pre = s.get("preload" if name == "preloaded" else f"preload_{name}")
        return float(pre["wall_s"]) + float(v["to_first_output_s"]) if pre and pre.get("ok") else None
    return float(v["to_first_output_s"])


def goals(s: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    total, hot, remote = preloaded_total(s), _first(s, "hot"), _first(s, "remote")
    side = sidecar_total(s)
    eager = _first(s, "eager")

    def hit(name: str) -> bool:
        return isinstance(s.get(name), dict) and s[name].get("cache") == "hit"

    if total is not None and hot is not None:
        out["preloaded <= 1.1 x hot"] = {"met": total <= 1.1 * hot and hit("preloaded"), "ratio": total / hot}
    if side is not None and hot is not None:
        out["sidecar: wait + 1st <= 1.1 x hot"] = {"met": side <= 1.1 * hot and hit("sidecar"), "ratio": side / hot}
    if total is not None and remote is not None:
        out["preloaded <= remote"] = {"met": total <= remote and hit("preloaded"), "ratio": total / remote}
    if side is not None and remote is not None:
        out["sidecar <= remote"] = {"met": side <= remote and hit("sidecar"), "ratio": side / remote}
    hot_e2e = to_first_output(s, "hot")
    for name in ("preloaded", "sidecar", "remote"):
        e2e = to_first_output(s, name)
        if e2e is not None and hot_e2e:
            out[f"to first output: {name} <= 1.1 x hot"] = {"met": e2e <= 1.1 * hot_e2e and hit(name),
                                                              "ratio": e2e / hot_e2e}  # fmt: skip
    for name in ("hot", "preloaded", *WARMSTART_ROWS):  # the goal: warm first call <= 1.5 x eager
        first = warm_first(s, name)
        if first is not None and eager:
            met = first <= 1.5 * eager and hit(name)
            out[f"{name}: 1st call <= 1.5 x eager"] = {"met": met, "ratio": first / eager}
    eager_e2e = to_first_output(s, "eager")
    for name in ("hot", "preloaded", *WARMSTART_ROWS):
        e2e = to_first_output(s, name)
        if e2e is not None and eager_e2e:
            out[f"to first output: {name} / eager"] = {"met": hit(name), "ratio": e2e / eager_e2e}
    preload = s["preload"]["wall_s"] if s.get("preload", {}).get("ok") else None
    for name, before in (("precompiled", 0.0), ("precompiled+cachedir", preload)):
        pre = s.get(name)
        if not eager or not isinstance(pre, dict) or pre.get("first_call_s") is None or before is None:
            continue
        first = pre["first_call_s"]
        with_load = before + pre.get("load_s", 0.0) + first
        out[f"{name} <= 3 x eager"] = {
            "met": with_load <= 3 * eager,
            "ratio_first_call": first / eager,
            "ratio_load_plus_first_call": with_load / eager,
        }
    return out


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | eager | cold | local hot (3) | preload | preloaded 1st call | (4) = preload + 1st | "
        "sidecar: wait + 1st | Mega-Cache load + 1st | PyTorch remote (6) | precompiled: load + 1st | "
        "precompiled + cachedir: load + 1st | warmstart: load + 1st | warmstart-env: load + 1st |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for s in res["summary"]:
            pre = s.get("preload")
            total = preloaded_total(s)
            lines.append(
                "| "
                + " | ".join(
                    [
                        s["config"],
                        _cell(s, "eager", verdict=False),
                        _cell(s, "cold", verdict=False),
                        _cell(s, "hot"),
                        f"{pre['wall_s']:.2f}" if pre and pre.get("ok") else ("failed" if pre else "—"),
                        _cell(s, "preloaded"),
                        f"**{total:.2f}**" if total is not None else "—",
                        _sidecar_cell(s),
                        _cell(s, "megacache", with_load=True),
                        _cell(s, "remote"),
                        _cell(s, "precompiled", with_load=True, verdict=False),
                        _cell(s, "precompiled+cachedir", with_load=True, verdict=False),
                        _cell(s, "warmstart", with_load=True),
                        _cell(s, "warmstart-env", with_load=True),
                    ]
                )
                + " |"
            )
    names = ("eager", "hot", "preloaded", "sidecar", "remote", *WARMSTART_ROWS)
    lines += [
        "",
        "Seconds to first output (from the spawn of the row's first process; for the init-container rows,",
        "of the preload's), and in brackets ÷ eager's:",
        "",
        "| model | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for res in results:
        for s in res["summary"]:
            cells = [to_first_output(s, n) for n in names]
            eager = cells[0]
            text = ["—" if c is None else f"{c:.2f}" + (f" ({c / eager:.2f})" if eager and c is not eager else "")
                    for c in cells]  # fmt: skip
            lines.append(f"| {s['config']} | " + " | ".join(text) + " |")
    lines += [
        "",
        "Where a process's time goes (seconds, medians): preload, import torch, build the model, import Dynamo",
        "and Inductor, load (warm_start() and the wrapper), first call; Triton modules built with a C compiler:",
        "",
        "| model | row | preload | import torch | build | import Dynamo/Inductor | load | 1st call | to first output "
        "| C modules built |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for s in res["summary"]:
            for name in names:
                lines.extend(_breakdown_line(s, name))
    lines += ["", "| model | goal | met | ratio |", "|---|---|---|---|"]
    for res in results:
        for s in res["summary"]:
            for goal, g in s["goals"].items():
                ratio = g.get("ratio", g.get("ratio_load_plus_first_call"))
                extra = f" (1st call alone {g['ratio_first_call']:.2f})" if "ratio_first_call" in g else ""
                lines.append(f"| {s['config']} | {goal} | {'yes' if g['met'] else 'NO'} | {ratio:.2f}{extra} |")
    return "\n".join(lines) + "\n"


def render_simpler(results: list[dict[str, Any]]) -> str:
    """The simpler ways beside compilecache: each row's first call (median, seconds; a row that did not hit
    every lookup says so), and for compilecache the preload before it."""
    head = ("eager (the floor)", "cold compile", "node's own hot cache", "shared cache dir",
            "PyTorch's Redis remote cache", "compilecache: preload + 1st call")  # fmt: skip
    lines = ["| model | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for res in results:
        for s in res["summary"]:
            pre, total = s.get("preload"), preloaded_total(s)
            ours = "—" if total is None else f"{pre['wall_s']:.2f} + {_cell(s, 'preloaded')} = {total:.2f}"
            cells = [_cell(s, n, verdict=n not in ("eager", "cold")) for n in SIMPLER[:-1]]
            lines.append(f"| {s['config']} | " + " | ".join([*cells, ours]) + " |")
    return "\n".join(lines) + "\n"


def _breakdown_line(s: dict[str, Any], name: str) -> list[str]:
    v = s.get(name)
    if not isinstance(v, dict) or "error" in v:
        return []
    pre = s.get("preload" if name == "preloaded" else f"preload_{name}")
    preload = f"{pre['wall_s']:.2f}" if isinstance(pre, dict) and pre.get("ok") else "—"
    load = v.get("load_s", v.get("wrap_s"))
    imports = v.get("import_s")
    cells = [v.get("import_torch_s"), v.get("build_s"), imports, load, v.get("first_call_s"), to_first_output(s, name)]
    text = " | ".join("—" if c is None else f"{c:.2f}" for c in cells)
    return [f"| {s['config']} | {name} | {preload} | {text} | {v.get('triton_modules_built', 0)} |"]


def _sidecar_cell(s: dict[str, Any]) -> str:
    v = s.get("sidecar")
    if not isinstance(v, dict):
        return "—"
    if "error" in v:
        return f"error: {v['error'][:60]}"
    text = f"{v.get('preload_wait_s', 0.0):.2f} + {v['first_call_s']:.2f}"
    if v.get("preload_result") != "hit":
        text += f" (preload {v.get('preload_result')})"
    return text + (f" ({v.get('cache')})" if v.get("cache") != "hit" else "")


def _cell(s: dict[str, Any], name: str, with_load: bool = False, verdict: bool = True) -> str:
    v = s.get(name)
    if v is None:
        return "—"
    if "error" in v:
        return f"error: {v['error'][:60]}"
    first = v["first_call_s"]
    text = f"{v['load_s']:.2f} + {first:.2f}" if with_load and "load_s" in v else f"{first:.2f}"
    if verdict and v.get("cache") != "hit":
        text += f" ({v.get('cache')})"
    return text


# -- helpers -----------------------------------------------------------------------------
def _models() -> Any:
    sys.path.insert(0, str(REPO))
    from bench import models

    return models


def _last_json_line(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return None


def _brief(r: dict[str, Any]) -> str:
    if not r.get("ok"):
        return f"FAILED {r.get('error', '')[:200]}"
    keys = ("load_s", "preload_wait_s", "first_call_s", "compile_and_save_s", "to_first_output_s")
    parts = [f"{k}={r[k]:.2f}s" for k in keys if k in r]
    parts.append(cache_verdict(r))
    parts.append(f"wall {r['process_wall_s']:.1f}s")
    return " ".join(parts)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="small models (a CPU check of the whole flow)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated, from bench/models.py")
    p.add_argument("--autotune-model", default="gpt2", help=f"model also run under mode={AUTOTUNE_MODE!r} ('' = none)")
    p.add_argument("--precompile", default="all", help="models that get the precompiled row: 'all', 'none' or a list")
    p.add_argument("--breakdown", default="gpt2", help="model whose warm first call is broken down ('' = none)")
    p.add_argument("--redis-server", help="redis-server binary (default: from PATH); none found = file store")
    p.add_argument("--rows", default=",".join(ROWS), help="rows to measure (default: all)")
    p.add_argument("--jobs", type=int, default=4, help="parallel unmeasured warm-up processes")
    p.add_argument(
        "--repeat", type=int, default=1,
        help="samples of hot, preloaded, sidecar and remote, interleaved; figures are their medians",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="directory for results.json, results.md and work files")
    p.add_argument("--cpus", type=int, default=0, help="run every measured process on CPUs 0..N-1 (a pod's share)")
    p.add_argument(
        "--image-bytecode", action="store_true",
        help="measure an image that carries byte code: compile every installed package and the standard "
             "library into one PYTHONPYCACHEPREFIX tree first, read by every process",
    )  # fmt: skip
    return p.parse_args(argv)


def compile_image_bytecode(python: str, tree: Path) -> dict[str, Any]:
    """What an image built with byte code has: every module of the interpreter's standard library and
    site-packages compiled (checked-hash pycs) into ``tree``, used as the run's PYTHONPYCACHEPREFIX."""
    code = "import sys, sysconfig; print(sysconfig.get_paths()['stdlib']); print(sysconfig.get_paths()['purelib'])"
    dirs = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(tree))
    t = time.perf_counter()
    cmd = [python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "checked-hash", *dirs]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    files = sum(1 for _ in tree.rglob("*.pyc"))
    return {"dirs": dirs, "seconds": time.perf_counter() - t, "pyc_files": files, "exit": proc.returncode}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "child":
        return child_main(argv[1:])
    if argv and argv[0] in ("render", "simpler"):
        results = [json.loads(Path(p).read_text()) for p in argv[1:]]
        for res in results:
            res["summary"] = summarise(res["rows"])
        print((render if argv[0] == "render" else render_simpler)(results), end="")
        return 0
    args = parse_args(argv)
    configs = [Config(m) for m in args.models.split(",") if m]
    if args.autotune_model:
        configs.append(Config(args.autotune_model, AUTOTUNE_MODE))
    for cfg in configs:
        _models().get(cfg.model)
    precompiled = {c.model for c in configs} if args.precompile == "all" else set(args.precompile.split(","))
    selected = frozenset(r for r in args.rows.split(",") if r)
    if not selected <= set(ROWS):
        raise SystemExit(f"--rows: unknown {', '.join(sorted(selected - set(ROWS)))}; choose from {', '.join(ROWS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    started = time.time()
    result: dict[str, Any] = {
        "command": " ".join(["python", "bench/warm_start.py", *argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    with redis_server(args.redis_server, work) as redis:
        store = f"redis://{redis[0]}:{redis[1]}/0" if redis else f"file://{(work / 'store').resolve()}"
        bench = Bench(args.device, args.tiny, work.resolve(), store, redis, args.jobs, selected, max(1, args.repeat))
        bench.cpus = max(0, args.cpus)
        result["cpus"] = bench.cpus or os.cpu_count()
        if args.image_bytecode:
            bench.image_pycache = (args.out / "image-pycache").resolve()
            result["image_bytecode"] = compile_image_bytecode(bench.python, bench.image_pycache)
            _log(f"image byte code: {json.dumps(result['image_bytecode'])}")
        result["environment"] = environment(bench.python)
        result["store"] = "redis (redis-server on the same machine)" if redis else "file (no redis-server found)"
        _log(f"environment: {json.dumps(result['environment'])}; store {store}")
        with_aot = {c: "precompiled" in selected and c.mode == "default" and c.model in precompiled for c in configs}
        for cfg in configs:
            bench.timed_cold(cfg)
        todo = [item for cfg in configs for item in bench.warmups(cfg, with_aot[cfg])]
        write_results(args.out, result, bench.rows, started)
        result["warmups"] = run_parallel(todo, args.jobs)
        write_results(args.out, result, bench.rows, started)
        for cfg in configs:
            bench.timed_warm(cfg, with_aot[cfg])
            if cfg == Config(args.breakdown):
                bench.breakdown(cfg)
            write_results(args.out, result, bench.rows, started)  # partial results survive a time limit
    print(write_results(args.out, result, bench.rows, started))
    return 0


def write_results(out: Path, result: dict[str, Any], rows: list[dict[str, Any]], started: float) -> str:
    """Write results.json and results.md (the table); return the table."""
    result.update(rows=rows, summary=summarise(rows), seconds=time.time() - started)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    table = render([result])
    (out / "results.md").write_text(table)
    return table


if __name__ == "__main__":
    sys.exit(main())
