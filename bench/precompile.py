"""Past Mega-Cache: a prototype bundle part made with torch's ahead-of-time compile.

A warm cache still leaves Dynamo to re-trace the model and rebuild its guards in every
new process. Ahead-of-time compile saves the traced bytecode, the guards and the compiled
graph (Inductor's output code with its Triton kernels) in one artifact, so that a new
process loads and calls it without tracing.

The entry point on torch 2.11 (and 2.13) is experimental and off by default:

    torch._dynamo.config.enable_aot_compile = True       # else the attribute is absent
    compiled = torch.compile(step, fullgraph=True)       # step: a plain module-level function
    artifact = compiled.aot_compile(((model, *inputs), {}))
    artifact.save_compiled_function(path)
    ...
    fn = torch.compiler.load_compiled_function(open(path, "rb"))   # new process
    fn(model, *inputs)

``aot_compile`` is attached to the wrapper ``torch.compile`` returns for a *function*, and
only while ``enable_aot_compile`` is set when ``torch.compile`` is called: that is why it
was not found on an ``OptimizedModule``'s bound ``forward``. Modules have their own private
methods (``OptimizedModule._aot_compile([ModelInput])``, ``_save_aot_compiled_module``),
but the function form is enough and keeps the model out of the artifact: the model is an
argument, its parameters are graph inputs, so one artifact serves any instance of the same
architecture. A graph break is an error (``fullgraph=True`` is required); guards on
globals are dropped when saving.

    python bench/precompile.py save --model gpt2 --out gpt2.aot [--tiny --device cpu]
    python bench/precompile.py load --model gpt2 --artifact gpt2.aot [--tiny --device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PART_NAME = "precompiled"
"""The name this artifact would carry as a third part of a bundle (next to megacache, cachedir)."""


def enable() -> None:
    """Turn on torch's experimental ahead-of-time compile (must precede ``torch.compile``)."""
    import torch

    torch._dynamo.config.enable_aot_compile = True


def save(step: Callable[..., Any], step_args: tuple[Any, ...], path: Path, **compile_options: Any) -> int:
    """Compile ``step(*step_args)`` ahead of time and write the artifact; returns its size in bytes."""
    import torch

    enable()
    compiled = torch.compile(step, fullgraph=True, **compile_options)
    if not hasattr(compiled, "aot_compile"):
        raise RuntimeError(f"torch {torch.__version__}: torch.compile(...) has no aot_compile on this version")
    artifact = compiled.aot_compile((tuple(step_args), {}))
    tmp = path.with_name(path.name + ".tmp")
    artifact.save_compiled_function(str(tmp))
    tmp.replace(path)
    return path.stat().st_size


def load(path: Path) -> Callable[..., Any]:
    """The compiled function saved by :func:`save`, ready to call with the same kind of arguments."""
    import torch

    with path.open("rb") as fh:
        fn: Callable[..., Any] = torch.compiler.load_compiled_function(fh)
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["save", "load"])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", type=Path, help="save: artifact path")
    p.add_argument("--artifact", type=Path, help="load: artifact path")
    args = p.parse_args(argv)
    import torch

    from bench import models

    workload = models.get(args.model)
    _, step_args = workload.make(args.device, args.tiny)
    if args.action == "save":
        if args.out is None:
            p.error("save needs --out")
        t = time.perf_counter()
        with contextlib.nullcontext() if workload.backward else torch.no_grad():  # trace as it will be called
            size = save(workload.step, step_args, args.out)
        print(json.dumps({"artifact": str(args.out), "bytes": size, "seconds": time.perf_counter() - t}))
        return 0
    if args.artifact is None:
        p.error("load needs --artifact")
    t = time.perf_counter()
    fn = load(args.artifact)
    loaded = time.perf_counter() - t
    with contextlib.nullcontext() if workload.backward else torch.no_grad():
        out = fn(*step_args)
    if workload.backward:
        out.backward()
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({"load_s": loaded, "first_call_s": time.perf_counter() - t - loaded}))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
