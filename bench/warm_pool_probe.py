"""What Inductor's compile-worker pool costs a warm first call, and what leaving it cold costs a miss.

The inductor backend starts its pool of compile workers (a helper process, then
`compile_threads` workers, each importing torch: 16 on a 16-CPU machine) when the first
frame reaches the backend, before it knows whether the cache will hit
(`torch._inductor.async_compile.maybe_warm_pool`). A start whose every lookup hits never
submits work to that pool, but it shares the CPUs with it while Dynamo traces and Inductor
loads the cached graph. `TORCH_WARM_POOL=0` leaves the pool to start at its first use.

Runs after `bench/warm_start.py` (rows cold and hot) has left a model's work directory, and
measures the first compiled call, each a fresh process (warm_start.py's child), in rounds,
interleaved:

  hot                the local hot directory, torch's default (pool warmed)
  hot-no-warm-pool   the same directory with TORCH_WARM_POOL=0

and with `--cold-rounds N`, N rounds of cold compiles into fresh empty directories, with and
without the warm pool: what TORCH_WARM_POOL=0 costs a pod whose cache misses.

    python bench/warm_start.py --device cuda --models gpt2 --autotune-model '' \\
        --precompile none --rows cold,hot --breakdown '' --out OUT
    python bench/warm_pool_probe.py --work OUT/work/gpt2 --model gpt2 --rounds 5 --cold-rounds 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.warm_start import Bench, Config, cache_verdict, environment, median, print_and_save

NO_WARM_POOL = {"TORCH_WARM_POOL": "0"}
MEASURES = ("first_call_s", "wrap_s", "to_first_output_s", "process_wall_s")


def plan(rounds: int, cold_rounds: int) -> list[tuple[str, dict[str, str] | None, bool]]:
    """(sample name, extra env, cold?) in the order they run: warm pairs, then cold pairs."""
    order: list[tuple[str, dict[str, str] | None, bool]] = []
    for _ in range(rounds):
        order += [("hot", None, False), ("hot-no-warm-pool", NO_WARM_POOL, False)]
    for _ in range(cold_rounds):
        order += [("cold", None, True), ("cold-no-warm-pool", NO_WARM_POOL, True)]
    return order


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per sample name: the median and every value of each measure, and each sample's cache verdict."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:  # "hot-no-warm-pool-3" -> "hot-no-warm-pool", in the order they ran
        groups.setdefault(r["name"].rsplit("-", 1)[0], []).append(r)
    out: dict[str, Any] = {}
    for name, rows in groups.items():
        entry: dict[str, Any] = {"cache": [cache_verdict(r) for r in rows], "ok": all(r.get("ok") for r in rows)}
        for key in MEASURES:
            values = [float(r[key]) for r in rows if key in r]
            if values:
                entry[key] = {"median": round(median(values), 3), "all": [round(v, 3) for v in values]}
        out[name] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="warm_start.py's work directory of one model")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the two warm samples")
    p.add_argument("--cold-rounds", type=int, default=0, help="rounds of the two cold samples")
    p.add_argument("--tiny", action="store_true", help="small models (as warm_start.py --tiny)")
    p.add_argument("--out", type=Path, help="write the result JSON here too")
    args = p.parse_args(argv)
    local = args.work / "local"
    if not local.is_dir():
        raise SystemExit(f"{local}: missing; run warm_start.py with --rows cold,hot first")
    bench = Bench(args.device, args.tiny, args.work.parent, "file:///unused", None, 1)
    cfg = Config(args.model)
    records: list[dict[str, Any]] = []
    for i, (name, env, cold) in enumerate(plan(args.rounds, args.cold_rounds)):
        target = local
        if cold:
            target = args.work / f"probe-{name}-{i}"
            shutil.rmtree(target, ignore_errors=True)
        records.append(bench.child(cfg, "compile", f"{name}-{i}", target, env=env))
    result = {"model": args.model, "environment": environment(sys.executable), "samples": summary(records)}
    result["records"] = [
        {k: r.get(k) for k in ("name", "ok", *MEASURES, "counters", "peak_rss_bytes", "error")} for r in records
    ]
    print_and_save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
