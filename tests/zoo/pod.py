"""A pod's process for a zoo model: build it, make the workload's start-up call, compile, compare.

    python -m tests.zoo.pod TARGET warm_start|env [--backward] [--dynamic] [--state deterministic|grad]

``warm_start``: ``cachelib.runtime.warm_start()`` before the first ``torch.compile``, as the docs
tell users; ``env``: nothing but the environment the webhook sets (the caller passes it). Then each
entry eager and compiled from the same random state (the comparison the warm-up's check makes,
:mod:`cachelib.in_image.precheck`), and with ``--dynamic`` once more on another input shape. ``--state``
gives the process a global state other than the warm-up's, as workloads do: ``deterministic``
(``torch.use_deterministic_algorithms(True)`` at start-up), ``grad`` (inference without
``torch.no_grad()``); another thread count comes from the caller's ``OMP_NUM_THREADS``, as torchrun
sets it. Prints one JSON line: what ``warm_start()`` did, the differences from eager, torch's
counters, the fallbacks counted, the first compiled call's seconds and the pod's verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from cachelib.in_image import compilekey, compilestep, precheck, precompileguard
from testsupport import models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("how", choices=["warm_start", "env"])
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--state", choices=["default", "deterministic", "grad"], default="default")
    args = parser.parse_args(argv)
    if args.state == "deterministic":
        torch.use_deterministic_algorithms(True)
    prepared = None
    if args.how == "warm_start":
        from cachelib import runtime

        prepared = runtime.warm_start(wait=False).to_dict()
    options = compilekey.CompileOptions(backward=args.backward, dynamic=True if args.dynamic else None)
    entries = [(fn, tuple(a), {}) for fn, a in getattr(models, args.target)()]
    first_calls: list[float] = []
    problems, notes = precheck.check_entries(
        entries,
        lambda fn: compilestep.compile_entry(fn, options),
        lambda fn: compilestep.eager_entry(fn, options),
        (lambda fn, a, k: detached(fn(*a, **k))) if args.state == "grad"
        else (lambda fn, a, k: compilestep.run_entry(fn, a, k, options)),
        training=args.backward,
        first_calls=first_calls,
    )
    second = models.SECOND_INPUTS.get(args.target)
    if second is not None:
        fn = entries[0][0]
        compiled = compilestep.compile_entry(fn, options)
        other: Any = second()
        run = compilestep.run_entry
        problems += [f"second input: {p}" for p in precheck.compare(
            run(fn, other, {}, options), run(compiled, other, {}, options))]  # fmt: skip
    from torch._dynamo.utils import counters

    why = None
    if args.how == "warm_start":
        from cachelib import runtime

        why = runtime.why().to_dict()
    print(json.dumps({
        "prepared": prepared, "problems": problems, "notes": notes, "fallbacks": dict(precompileguard.fallbacks),
        "counters": {g: dict(counters[g]) for g in ("dynamo_cache", "frames", "inductor", "aot_autograd")},
        "torch": torch.__version__, "first_call_seconds": round(sum(first_calls), 4), "why": why,
    }))  # fmt: skip
    return 0


def detached(output: Any) -> Any:
    """An output computed with gradients on, without them (for the comparison with eager)."""
    return torch.utils._pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, output)


if __name__ == "__main__":
    sys.exit(main())
