"""The compilecache warm-up harness: compile models into a fresh inductor cache directory.

It runs inside the user's own image, so it needs nothing but the standard library, torch
(imported only once the cache directory is set) and ``compilecache``'s stdlib-only
:mod:`cachelib.compilekey` (the compile options, key fields and digests the operator and the
CLI share), which the warm-up Job copies beside it::

    python harness.py --target mypkg.models:warmup --out /out --namespace team-a --name llama \\
        [--mode M] [--dynamic true|false|auto] [--fullgraph] [--backend inductor] \\
        [--compiled-autograd] [--backward] [--precompile auto|off] [--command "..."]

It writes the output directory that ``compilecache pack`` / ``publish`` turn into a bundle:

- ``OUT/cachedir/`` -- the ``TORCHINDUCTOR_CACHE_DIR`` the compile wrote (triton cache included);
- ``OUT/megacache.bin`` -- the bytes of ``torch.compiler.save_cache_artifacts()`` (empty when none);
- ``OUT/cachedir/compilecache-warm-start.json`` and ``OUT/cachedir/dynamo/`` -- with
  ``--precompile auto``: the warm-start manifest and Dynamo's precompiled entries (see
  ``warmstart.py``, copied beside this file like ``targets.py``);
- ``OUT/result.json`` -- the cache key fields, versions, device, job id, compile seconds per
  target, torch's cache counters and the Mega-Cache size.

A target ``module:function`` (or the short name of a built-in one: ``tiny_mlp``,
``transformer_block``, ``small_convnet``) returns a list of
``(callable_or_module, example_args[, example_kwargs])``; the harness compiles each with
the requested options and calls it once: under ``torch.no_grad()`` by default (inference),
forward and backward with ``--backward``, as one compiled training step (forward, a sum of
the floating outputs as loss, backward) with ``--compiled-autograd``. A target that takes
one parameter receives a ``compile(fn)`` function applying the requested options; a target
may also compile and run its own models and return ``None``.

Exit status: 0 done, 2 bad arguments, 3 target cannot be imported, 4 target (or command)
failed, 5 target returned the wrong shape, 6 output cannot be written.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.harness
    from cachelib import compilekey, podcontract
else:  # run as a script in the warm-up pod: the warm-up Job copies compilekey.py and podcontract.py beside this file
    import compilekey
    import podcontract

HARNESS_VERSION = "1"
RESULT_FORMAT = 1

RESULT_FILE = podcontract.RESULT_FILE
MEGACACHE_FILE = podcontract.MEGACACHE_FILE
CACHEDIR = podcontract.CACHEDIR

CACHE_DIR_ENV = podcontract.CACHE_DIR_ENV
PRECOMPILE_ENV = podcontract.PRECOMPILE_ENV
JOB_ID_ENV = podcontract.JOB_ID_ENV
CHECK_FLAG = "--check-precompile"
"""The harness in its checking role (cachelib.precheck): run by the harness itself, never by users."""

EXIT_OK = 0
EXIT_USAGE = compilekey.EXIT_USAGE
EXIT_IMPORT = 3
EXIT_FAILED = 4
EXIT_SHAPE = 5
EXIT_OUTPUT = 6

COUNTER_GROUPS = ("inductor", "aot_autograd", "dynamo_cache", "compiled_autograd", "frames", "stats")

_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class HarnessError(Exception):
    """A failure with a clear message and the exit status that goes with it."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- environment detection (needs torch) ---------------------------------------------------
def detect_versions() -> dict[str, str]:
    """torch, triton (or "none"), CUDA (or "none") and Python versions of this process."""
    import torch

    try:
        import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = compilekey.NONE
    cuda = torch.version.cuda or (f"hip{torch.version.hip}" if getattr(torch.version, "hip", None) else None)
    return {
        "torch": str(torch.__version__),
        "triton": triton_version,
        "cuda": str(cuda) if cuda else compilekey.NONE,
        "python": platform.python_version(),
    }


def detect_device() -> dict[str, Any]:
    """The accelerator compiled for: CUDA device product and compute capability, or the CPU."""
    import torch

    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {
            "type": "cuda",
            "product": torch.cuda.get_device_name(index),
            "capability": f"{major}.{minor}",
            "count": torch.cuda.device_count(),
        }
    return {"type": compilekey.CPU, "product": compilekey.CPU, "capability": None, "count": 0}


def counters_snapshot() -> dict[str, dict[str, int]]:
    """torch's compile counters (``torch._dynamo.utils.counters``) for the groups that matter."""
    from torch._dynamo.utils import counters

    return {group: {k: int(v) for k, v in counters[group].items()} for group in COUNTER_GROUPS if group in counters}


def cache_summary(counters: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """FX-graph and AOTAutograd cache hits and misses out of a counters snapshot."""
    inductor = counters.get("inductor", {})
    aot = counters.get("aot_autograd", {})
    return {
        "fxgraph_hit": int(inductor.get("fxgraph_cache_hit", 0)),
        "fxgraph_miss": int(inductor.get("fxgraph_cache_miss", 0)),
        "fxgraph_bypass": int(inductor.get("fxgraph_cache_bypass", 0)),
        "aotautograd_hit": int(aot.get("autograd_cache_hit", 0)),
        "aotautograd_miss": int(aot.get("autograd_cache_miss", 0)),
        "aotautograd_bypass": int(aot.get("autograd_cache_bypass", 0)),
    }


# -- targets --------------------------------------------------------------------------------
Entry = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def load_precheck() -> Any:
    """``cachelib.precheck``, or ``precheck.py`` beside this file (a warm-up container)."""
    return _import("cachelib.precheck")


def load_warmstart() -> Any:
    """``cachelib.warmstart``, or ``warmstart.py`` beside this file (a warm-up container)."""
    return _import("cachelib.warmstart")


def load_target(target: str) -> Callable[..., Any]:
    """Import ``module:function``; the built-in targets also load from ``targets.py`` beside this file."""
    spec = compilekey.canonical_target(target)
    module_name, _, function_name = spec.partition(":")
    try:
        module = _import(module_name)
    except Exception as exc:  # any import-time failure of the user's module
        raise HarnessError(f"cannot import target {target!r}: {type(exc).__name__}: {exc}", EXIT_IMPORT) from exc
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise HarnessError(
            f"cannot import target {target!r}: {module_name} has no function {function_name!r}", EXIT_IMPORT
        )
    return function  # type: ignore[no-any-return]


def _import(module_name: str) -> Any:
    copied = {
        compilekey.BUILTIN_MODULE: "targets",
        "cachelib.warmstart": "warmstart",
        "cachelib.precheck": "precheck",
        "cachelib.bytecode": "bytecode",
        "cachelib.triton_modules": "triton_modules",
        "cachelib.factors": "factors",
    }
    try:
        return importlib.import_module(module_name)
    except ImportError:
        beside = Path(__file__).with_name(f"{copied.get(module_name, '')}.py")
        if module_name not in copied or not beside.is_file():
            raise
    spec = importlib.util.spec_from_file_location(f"compilecache_{copied[module_name]}", beside)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def normalise_entries(target: str, returned: Any) -> list[Entry] | None:
    """Check what a target returned: ``None`` or a list of (callable, args[, kwargs])."""
    if returned is None:
        return None
    expected = "a list of (callable_or_module, example_args[, example_kwargs]) or None"
    if not isinstance(returned, list | tuple) or not returned:
        raise HarnessError(f"target {target!r} returned {type(returned).__name__}; expected {expected}", EXIT_SHAPE)
    entries: list[Entry] = []
    for index, item in enumerate(returned):
        where = f"target {target!r} item {index}"
        if not isinstance(item, list | tuple) or len(item) not in (2, 3):
            raise HarnessError(f"{where} is {type(item).__name__}; expected {expected}", EXIT_SHAPE)
        fn, args = item[0], item[1]
        kwargs = item[2] if len(item) == 3 else {}
        if not callable(fn):
            raise HarnessError(f"{where}: {type(fn).__name__} is not callable", EXIT_SHAPE)
        if not isinstance(args, list | tuple):
            raise HarnessError(f"{where}: example_args is {type(args).__name__}, expected a tuple", EXIT_SHAPE)
        if not isinstance(kwargs, dict):
            raise HarnessError(f"{where}: example_kwargs is {type(kwargs).__name__}, expected a dict", EXIT_SHAPE)
        entries.append((fn, tuple(args), kwargs))
    return entries


def make_compile(options: compilekey.CompileOptions) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch.compile`` with the options applied (the function given to self-running targets)."""
    import torch

    kwargs = options.compile_kwargs()

    def compile_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, **kwargs)

    return compile_fn


def _scalar_loss(output: Any) -> Any:
    """The sum of every floating tensor in ``output`` (tensors, sequences, dicts, dataclasses)."""
    import torch

    total = None
    stack = [output]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() or item.is_complex():
                total = item.sum() if total is None else total + item.sum()
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    if total is None:
        raise HarnessError("--backward: the target's output holds no floating tensor to take a loss from", EXIT_SHAPE)
    return total


def eager_entry(fn: Callable[..., Any], options: compilekey.CompileOptions) -> Callable[..., Any]:
    """What one entry runs, before compiling: with compiled autograd, a whole training step."""
    if not options.compiled_autograd:
        return fn

    def train_step(*args: Any, **kwargs: Any) -> Any:
        loss = _scalar_loss(fn(*args, **kwargs))
        loss.backward()
        return loss

    return train_step


def compile_entry(fn: Callable[..., Any], options: compilekey.CompileOptions) -> Callable[..., Any]:
    """The compiled callable for one entry; with compiled autograd, a whole training step."""
    return make_compile(options)(eager_entry(fn, options))


def run_entry(
    compiled: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: compilekey.CompileOptions
) -> Any:
    """One call: inference under no_grad, or forward and backward; its output."""
    import torch

    if options.compiled_autograd:
        output = compiled(*args, **kwargs)
    elif options.backward:
        output = compiled(*args, **kwargs)
        _scalar_loss(output).backward()
    else:
        with torch.no_grad():
            output = compiled(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return output


def describe(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)


def run_target(
    target: str, options: compilekey.CompileOptions, function: Callable[..., Any] | None = None
) -> list[dict[str, Any]]:
    """Import (unless given) and run a target; the first-call seconds of each compiled entry."""
    function = function or load_target(target)
    takes_compile = _required_params(function) >= 1
    started = time.perf_counter()
    try:
        returned = function(make_compile(options)) if takes_compile else function()
    except HarnessError:
        raise
    except Exception as exc:
        traceback.print_exc()
        raise HarnessError(f"target {target!r} failed: {type(exc).__name__}: {exc}", EXIT_FAILED) from exc
    entries = normalise_entries(target, returned)
    if entries is None:
        seconds = round(time.perf_counter() - started, 4)
        return [{"index": 0, "name": compilekey.canonical_target(target), "seconds": seconds}]
    timings = []
    for index, (fn, args, kwargs) in enumerate(entries):
        try:
            compiled = compile_entry(fn, options)
            t0 = time.perf_counter()
            run_entry(compiled, args, kwargs, options)
            seconds = time.perf_counter() - t0
        except HarnessError:
            raise
        except Exception as exc:
            traceback.print_exc()
            raise HarnessError(
                f"target {target!r} item {index} ({describe(fn)}) failed to compile or run: "
                f"{type(exc).__name__}: {exc}",
                EXIT_FAILED,
            ) from exc
        timings.append({"index": index, "name": describe(fn), "seconds": round(seconds, 4)})
    return timings


def _required_params(function: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(1 for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def run_command(command: str, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """Run the user's command with the cache environment; its wall seconds."""
    argv = shlex.split(command)
    if not argv:
        raise HarnessError("--command is empty", EXIT_USAGE)
    started = time.perf_counter()
    try:
        status = subprocess.run(argv, env=dict(env), check=False).returncode
    except OSError as exc:
        raise HarnessError(f"--command {argv[0]!r} cannot be started: {exc.strerror or exc}", EXIT_FAILED) from exc
    if status != 0:
        raise HarnessError(f"--command exited with status {status}: {command}", EXIT_FAILED)
    return [{"index": 0, "name": argv[0], "seconds": round(time.perf_counter() - started, 4)}]


# -- the run ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    out: Path
    namespace: str
    name: str
    options: compilekey.CompileOptions
    target: str | None = None
    command: str | None = None
    cache_dir: Path | None = None

    @property
    def cache_path(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.out / CACHEDIR


def prepare_environment(request: Request, job_id: str) -> dict[str, str]:
    """Point inductor (and triton under it) at the cache directory, set the job id; before torch loads."""
    if "torch._inductor" in sys.modules:
        raise HarnessError("torch's inductor was imported before the harness could set its cache directory")
    request.cache_path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_DIR_ENV] = str(request.cache_path)
    os.environ[JOB_ID_ENV] = job_id
    os.environ.pop("TRITON_CACHE_DIR", None)  # keep triton's cache inside the inductor cache dir
    if request.options.precompile == "auto":  # read at import by torch, here and in a --command
        os.environ[PRECOMPILE_ENV] = "1"
    return dict(os.environ)


def apply_options(options: compilekey.CompileOptions, job_id: str) -> None:
    import torch

    torch.compiler.config.job_id = job_id
    torch._dynamo.config.compiled_autograd = options.compiled_autograd
    if options.precompile == "auto":
        load_warmstart().enable_caching_precompile()  # a torch without it compiles as with "off"
    import torch._inductor.config as inductor_config

    for name, value in options.inductor_config:
        if not hasattr(inductor_config, name.split(".")[0]):
            raise HarnessError(f"--inductor-config {name}: torch._inductor.config has no such option", EXIT_USAGE)
        target: Any = inductor_config
        *parents, leaf = name.split(".")
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)


def save_megacache(out: Path) -> dict[str, Any]:
    """``torch.compiler.save_cache_artifacts()`` into OUT/megacache.bin (empty when nothing was saved)."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    data, info = (saved[0], saved[1]) if saved else (b"", None)
    _write_atomic(out / MEGACACHE_FILE, data)
    artifacts = {str(k): len(v) for k, v in getattr(info, "artifacts", {}).items()} if info is not None else {}
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "artifacts": artifacts}


def warm_up(request: Request) -> dict[str, Any]:
    """Compile the target (or run the command) and write the output directory; the result."""
    model = compilekey.model_digest(request.target, request.command)
    options_digest = request.options.digest()
    job_id = os.environ.get(JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    env = prepare_environment(request, job_id)
    function = load_target(request.target) if request.target is not None else None
    apply_options(request.options, job_id)
    versions = detect_versions()
    device = detect_device()
    fields = compilekey.key_fields(request.namespace, request.name, model, options_digest, device, versions)
    factors = _import("cachelib.factors")
    factors.install()  # what decides torch's cache keys, per graph (cachelib.factors)

    started = time.perf_counter()
    if request.command is not None:
        timings = run_command(request.command, env)
        counters: dict[str, dict[str, int]] | None = None
    else:
        assert request.target is not None
        timings, precompile_failure = run_target_with_fallback(request, function)
        counters = counters_snapshot()
    total = time.perf_counter() - started
    recorded = write_factors(request.cache_path, factors)
    megacache = save_megacache(request.out)  # with caching precompile, also writes Dynamo's entries
    bytecode = write_bytecode(request)
    triton_modules = _import("cachelib.triton_modules").collect(request.cache_path).to_dict()
    precompile = write_warm_start(request) if request.options.precompile == "auto" else None
    if precompile is not None and request.target is not None and precompile_failure is not None:
        _record_check(request.cache_path, {"verified": False, "reason": precompile_failure})
        precompile["check"] = {"verified": False, "reason": precompile_failure, "seconds": 0.0}
    elif precompile is not None and precompile["dynamo_entries"]:
        precompile.update(prove_precompiled(request, job_id, total))
        megacache = megacache_after_check(request.out, megacache, precompile)
    result = {
        "format": RESULT_FORMAT,
        "producer": f"compilecache-harness/{HARNESS_VERSION}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "key": fields,
        "key_string": compilekey.key_string(fields),
        "job_id": job_id,
        "target": compilekey.canonical_target(request.target) if request.target else None,
        "command": request.command,
        "options": request.options.to_dict(),
        "versions": versions,
        "device": device,
        "cache_dir": str(request.cache_path),
        "targets": timings,
        "compile_seconds": round(total, 4),
        "counters": counters,
        "cache": cache_summary(counters) if counters is not None else None,
        "megacache": megacache,
        "precompile": precompile,
        "bytecode": bytecode,
        "triton_modules": triton_modules,
        "factors": recorded,
    }
    _write_atomic(request.out / RESULT_FILE, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    return result


def write_factors(cache_path: Path, factors: Any) -> dict[str, Any]:
    """The factors of torch's cache keys this warm-up saw (:mod:`cachelib.factors`), into the cache
    directory; how many graphs it holds, or why none were recorded."""
    document = factors.document()
    try:
        factors.write_json(cache_path / factors.FACTORS_NAME, document)
    except OSError as exc:
        raise HarnessError(f"cannot write {factors.FACTORS_NAME}: {exc.strerror or exc}", EXIT_OUTPUT) from exc
    return {"file": factors.FACTORS_NAME, "graphs": len(document["graphs"]), "problem": document["problem"]}


def run_target_with_fallback(
    request: Request, function: Callable[..., Any] | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Run the target; with ``--precompile auto``, once more without Dynamo's caching precompile
    when compiling with it failed (seen: torch 2.13 asserting ``check_fn.guards_state must not be
    None`` on a T5 encoder). The bundle then ships without a precompiled part, and the second value
    says why; the key stays the cache's (the options are unchanged)."""
    assert request.target is not None
    try:
        return run_target(request.target, request.options, function), None
    except HarnessError as exc:
        if request.options.precompile != "auto" or exc.exit_code != EXIT_FAILED:
            raise
        reason = f"compiling with Dynamo's caching precompile failed: {(str(exc).splitlines() or [''])[0][:300]}"
    print(f"harness: {reason}; compiling again without it", file=sys.stderr)
    import torch

    torch._dynamo.reset()
    load_warmstart().disable_caching_precompile()
    return run_target(request.target, request.options, function), reason


def write_bytecode(request: Request) -> dict[str, Any]:
    """The byte code of every module the warm-up imported, into the cache directory (the bundle's
    byte-code part, :mod:`cachelib.bytecode`), unless the image carries its own; what was written."""
    if request.target is None:
        return {"files": 0, "bytes": 0, "sources": 0, "skipped": "a --command warm-up imports in its own process"}
    started = time.perf_counter()
    module = _import("cachelib.bytecode")
    tree = module.write_tree(module.imported_sources(), request.cache_path).to_dict()
    tree["seconds"] = round(time.perf_counter() - started, 3)
    return dict(tree)


def prove_precompiled(request: Request, job_id: str, compile_seconds: float) -> dict[str, Any]:
    """Check the precompiled part as a pod will load it (:mod:`cachelib.precheck`); when it fails,
    take it out of the cache directory and record why in the manifest. What the check decided."""
    precheck = load_precheck()
    if request.target is None:
        verdict = precheck.Verdict(False, "a --command warm-up cannot be checked; precompile needs --target", 0.0, {})
    else:
        _release_compiled()
        argv = [sys.executable, str(Path(__file__).absolute()), CHECK_FLAG, "--target", request.target,
                "--namespace", request.namespace, "--name", request.name, *request.options.harness_args()]  # fmt: skip
        timeout = max(600.0, 4 * compile_seconds)
        pycache = _import("cachelib.bytecode").PYCACHE_DIR
        verdict = precheck.check_in_fresh_process(argv, request.cache_path, job_id, timeout, pycache)
    check = verdict.to_dict()
    if not verdict.verified:
        print(f"harness: precompiled part left out: {verdict.reason}", file=sys.stderr)
        check["removed_entries"] = precheck.strip_precompiled(request.cache_path)
        warmstart = load_warmstart()
        manifest = warmstart.build_manifest(request.cache_path)
        manifest["precompile_check"] = {"verified": False, "reason": verdict.reason}
        warmstart.write_manifest(request.cache_path, manifest)
    else:
        _record_check(request.cache_path, {"verified": True, "reason": None})
    return {"check": check, "dynamo_entries": load_warmstart().dynamo_entries(request.cache_path)}


def _record_check(cache_path: Path, check: Mapping[str, Any]) -> None:
    warmstart = load_warmstart()
    manifest = warmstart.read_manifest(cache_path) or warmstart.build_manifest(cache_path)
    manifest["precompile_check"] = dict(check)
    warmstart.write_manifest(cache_path, manifest)


def _release_compiled() -> None:
    """Free what the compile holds (models, device memory) before the check loads them again."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def megacache_after_check(out: Path, megacache: dict[str, Any], precompile: Mapping[str, Any]) -> dict[str, Any]:
    """The Mega-Cache less its precompiled entries when the check left them out (else unchanged)."""
    if precompile["check"]["verified"] or not megacache["artifacts"].get("precompile"):
        return megacache
    data = (out / MEGACACHE_FILE).read_bytes()
    kept = load_precheck().without_precompiled_artifacts(data)
    kept = b"" if kept is None else kept
    _write_atomic(out / MEGACACHE_FILE, kept)
    artifacts = {k: v for k, v in megacache["artifacts"].items() if k != "precompile"} if kept else {}
    return {"bytes": len(kept), "sha256": hashlib.sha256(kept).hexdigest(), "artifacts": artifacts}


def check_precompiled(request: Request) -> int:
    """The checking process (``--check-precompile``): the pod's ``warm_start()``, then each entry
    eager and compiled; writes :data:`cachelib.precheck.CHECK_FILE` into ``--out``."""
    precheck = load_precheck()
    warmstart = load_warmstart()
    options = request.options
    job_id = os.environ.get(JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    prepared = warmstart.prepare(request.cache_path)  # what cachelib.runtime.warm_start() does in a pod
    function = load_target(request.target or "")
    apply_options(dataclasses.replace(options, precompile="off"), job_id)  # prepare() decided precompile
    import torch

    torch.manual_seed(precheck.SEED)
    try:
        returned = function(make_compile(options)) if _required_params(function) >= 1 else function()
        entries = normalise_entries(request.target or "", returned) or []
        problems, notes = precheck.check_entries(
            entries,
            lambda fn: compile_entry(fn, options),
            lambda fn: eager_entry(fn, options),
            lambda fn, args, kwargs: run_entry(fn, args, kwargs, options),
            training=options.backward or options.compiled_autograd,
        )
    except Exception as exc:
        traceback.print_exc()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        problems, notes = [f"{precheck.RAISED}{type(exc).__name__}: {first_line}"], []
        entries = []
    counters = counters_snapshot()
    fell_back = [d.split(": fell back ", 1)[1] for d in prepared.declined if ": fell back " in d]
    reason = precheck.judge(counters, fell_back, problems)
    if not entries and reason is None:
        reason = "the target compiled its own models (returned None): nothing to check"
    precheck.write_check(request.out, {
        "verified": reason is None, "reason": reason, "notes": notes, "entries": len(entries),
        "prepared": prepared.to_dict(), "counters": {g: counters.get(g, {}) for g in ("dynamo_cache", "frames")},
    })  # fmt: skip
    return EXIT_OK


def write_warm_start(request: Request) -> dict[str, Any]:
    """The warm-start manifest into the cache directory; what it says (without the long keys)."""
    warmstart = load_warmstart()
    manifest = warmstart.build_manifest(request.cache_path)
    try:
        warmstart.write_manifest(request.cache_path, manifest)
    except OSError as exc:
        raise HarnessError(f"cannot write the warm-start manifest: {exc.strerror or exc}", EXIT_OUTPUT) from exc
    return {
        "manifest": warmstart.MANIFEST_NAME,
        "dynamo_entries": warmstart.dynamo_entries(request.cache_path),
        "source_keys": sorted(k for k, v in manifest["source_keys"].items() if v is not None),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as exc:
        raise HarnessError(f"cannot write {path}: {exc.strerror or exc}", EXIT_OUTPUT) from exc


def write_termination_log(message: Mapping[str, Any]) -> None:
    """Write the outcome where Kubernetes reads a container's termination message, when it exists."""
    podcontract.write_termination_message(message)


# -- command line ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness.py",
        description="Compile models with torch.compile into a fresh cache directory and write "
        "OUT/{result.json,megacache.bin,cachedir/} for `compilecache publish`.",
        epilog="examples:\n"
        "  python harness.py --target tiny_mlp --out /tmp/out --namespace default --name demo\n"
        "  python harness.py --target mypkg.models:warmup --out /out --namespace ml --name llama "
        "--mode max-autotune --backward\n"
        '  python harness.py --command "python serve.py --warmup-only" --out /out --namespace ml --name serve',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compilekey.add_model_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="output directory (created; must be empty)")
    parser.add_argument("--namespace", required=True, help="namespace of the CompileCache")
    parser.add_argument("--name", required=True, help="name of the CompileCache")
    compilekey.add_compile_arguments(parser)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="compile into this cache directory instead of OUT/cachedir (to measure a preloaded cache)",
    )
    parser.add_argument(CHECK_FLAG, action="store_true", help=argparse.SUPPRESS)
    return parser


def request_from_args(args: argparse.Namespace) -> Request:
    options = compilekey.options_from_args(args)
    if args.target is not None:
        compilekey.canonical_target(args.target)
    for label, value in (("namespace", args.namespace), ("name", args.name)):
        if not _K8S_NAME.fullmatch(value) or (label == "namespace" and "." in value):
            raise HarnessError(f"--{label} {value!r} is not a Kubernetes name", EXIT_USAGE)
    out = args.out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HarnessError(f"--out {out}: exists and is not an empty directory", EXIT_USAGE)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"--out {out}: {exc.strerror or exc}", EXIT_OUTPUT) from exc
    return Request(
        out=out,
        namespace=args.namespace,
        name=args.name,
        options=options,
        target=args.target,
        command=args.command,
        cache_dir=args.cache_dir.absolute() if args.cache_dir else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # targets import like `python -m` would find them
    args = build_parser().parse_args(argv)
    try:
        if args.check_precompile:
            return check_precompiled(request_from_args(args))
        result = warm_up(request_from_args(args))
    except (HarnessError, compilekey.UsageError) as exc:
        print(f"harness: error: {exc}", file=sys.stderr)
        write_termination_log({"result": "error", "stage": "compile", "reason": str(exc)})
        return exc.exit_code
    summary = {
        "result": "compiled",
        "key": result["key_string"],
        "job_id": result["job_id"],
        "compile_seconds": result["compile_seconds"],
        "cache": result["cache"],
        "megacache_bytes": result["megacache"]["bytes"],
    }
    print(json.dumps(summary, sort_keys=True))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
