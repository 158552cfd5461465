"""The warm-up's compile step: load the target, compile each entry it returns with the requested options, run it once.

Also what the harness reads of the process (versions, device, torch's cache counters) and how it fails
(:class:`HarnessError`, with the harness's exit statuses). Standard library only at import, torch once
called; copied beside ``harness.py`` into warm-up containers with :mod:`cachelib.in_image.compilekey`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.compilestep
    from cachelib.in_image import compilekey
else:  # beside harness.py in the warm-up pod: the warm-up Job copies compilekey.py there too
    import compilekey



EXIT_OK = 0
EXIT_USAGE = compilekey.EXIT_USAGE
EXIT_IMPORT = 3
EXIT_FAILED = 4
EXIT_SHAPE = 5
EXIT_OUTPUT = 6
COUNTER_GROUPS = ("inductor", "aot_autograd", "dynamo_cache", "compiled_autograd", "frames", "stats")


class HarnessError(Exception):
    """A failure with a clear message and the exit status that goes with it."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- environment detection (needs torch) ---------------------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a partial file beside it, renamed); :class:`HarnessError` when it cannot."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)
    except OSError as exc:
        raise HarnessError(f"cannot write {path}: {exc.strerror or exc}", EXIT_OUTPUT) from exc


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


def load_target(target: str) -> Callable[..., Any]:
    """Import ``module:function``; the built-in targets also load from ``targets.py`` beside this file."""
    spec = compilekey.canonical_target(target)
    module_name, _, function_name = spec.partition(":")
    try:
        module = load_companion(module_name)
    except Exception as exc:  # any import-time failure of the user's module
        raise HarnessError(f"cannot import target {target!r}: {type(exc).__name__}: {exc}", EXIT_IMPORT) from exc
    function = getattr(module, function_name, None)
    if function is None or not callable(function):
        raise HarnessError(
            f"cannot import target {target!r}: {module_name} has no function {function_name!r}", EXIT_IMPORT
        )
    return function  # type: ignore[no-any-return]


def load_companion(module_name: str) -> Any:
    copied = {
        compilekey.BUILTIN_MODULE: "targets",
        "cachelib.in_image.warmstart": "warmstart",
        "cachelib.in_image.precheck": "precheck",
        "cachelib.in_image.bytecode": "bytecode",
        "cachelib.in_image.triton_modules": "triton_modules",
        "cachelib.in_image.factors": "factors",
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
    target: str,
    options: compilekey.CompileOptions,
    function: Callable[..., Any] | None = None,
    on_entry: Callable[[int, int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Import (unless given) and run a target; the first-call seconds of each compiled entry.
    ``on_entry(index, count, name)`` is told before each entry compiles (the harness's progress)."""
    function = function or load_target(target)
    takes_compile = required_params(function) >= 1
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
        if on_entry is not None:
            on_entry(index, len(entries), describe(fn))
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


def required_params(function: Callable[..., Any]) -> int:
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
