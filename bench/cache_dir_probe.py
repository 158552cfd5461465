"""Why a warm first call differs between two cache directories: their files, and fresh copies.

Runs after `bench/warm_start.py` (rows cold, hot and preloaded) has left a model's work
directory: `local` (the directory the cold process compiled into, "hot") and `preloaded`
(the bundle unpacked by `compilecache preload`). It lists the files one has and the other
lacks, then measures the first compiled call (each a fresh process, the same child as
warm_start.py) in rounds, interleaved:

  hot               `local` again (as warm_start.py's hot row)
  local-copy        a fresh copy of `local` (the same files, written just now)
  preloaded-again   `preloaded` again (its second use)
  preloaded-copy    a fresh copy of `preloaded`

If local-copy is as fast as hot, the files decide; if it is as slow as preloaded-copy, a
directory's first use does. Two more samples separate the directory from the environment:
the benchmark runs the preloaded rows with the warm-up harness's `TORCH_COMPILE_JOB_ID` (as
the admission webhook does) and the hot row without one:

  hot+job-id        `local` with the harness's job id
  preloaded-no-job-id  `preloaded` without it

`--samples` picks which samples run (default: all six).

    python bench/warm_start.py --device cuda --models gpt2_train --autotune-model '' \\
        --precompile none --rows cold,hot,preloaded --out OUT
    python bench/cache_dir_probe.py --work OUT/work/gpt2-train --model gpt2_train --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.warm_start import Bench, Config, cache_verdict, median, print_and_save

IGNORED = ("locks/", ".lock")
SAMPLES = ("hot", "local-copy", "preloaded-again", "preloaded-copy", "hot+job-id", "preloaded-no-job-id")


def uses_job_id(sample: str) -> bool:
    """Whether a sample runs with the harness's TORCH_COMPILE_JOB_ID (as the benchmark's preloaded rows do)."""
    return sample == "hot+job-id" or (sample.startswith("preloaded") and sample != "preloaded-no-job-id")


def source_dir(sample: str) -> str:
    """Which of the two directories (``local`` or ``preloaded``) a sample reads, or copies."""
    return "local" if sample.startswith(("hot", "local")) else "preloaded"


def files(root: Path) -> dict[str, int]:
    """Relative path -> size of every regular file under ``root`` (lock files left out)."""
    out = {}
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not path.is_symlink() and not rel.startswith(IGNORED[0]) and not rel.endswith(IGNORED[1]):
            out[rel] = path.stat().st_size
    return out


def compare(a: dict[str, int], b: dict[str, int]) -> dict[str, Any]:
    """What ``a`` has that ``b`` lacks and the reverse, and the paths whose sizes differ."""
    return {
        "only_in_first": sorted(set(a) - set(b)),
        "only_in_second": sorted(set(b) - set(a)),
        "size_differs": sorted(k for k in set(a) & set(b) if a[k] != b[k]),
        "counts": [len(a), len(b)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="warm_start.py's work directory of one model")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="small models (as warm_start.py --tiny)")
    p.add_argument("--samples", default=",".join(SAMPLES), help="comma-separated, from: " + ", ".join(SAMPLES))
    p.add_argument("--out", type=Path, help="write the result JSON here too")
    args = p.parse_args(argv)
    chosen = [x for x in args.samples.split(",") if x]
    unknown = sorted(set(chosen) - set(SAMPLES))
    if unknown:
        p.error(f"--samples: unknown {', '.join(unknown)} (choose from {', '.join(SAMPLES)})")
    local, preloaded = args.work / "local", args.work / "preloaded"
    for d in (local, preloaded):
        if not d.is_dir():
            raise SystemExit(f"{d}: missing; run warm_start.py with --rows cold,hot,preloaded first")
    result: dict[str, Any] = {"diff_local_vs_preloaded": compare(files(local), files(preloaded))}
    bench = Bench(args.device, args.tiny, args.work.parent, "file:///unused", None, 1)
    cfg = Config(args.model)
    harness = json.loads((args.work / "harness-out" / "result.json").read_text())
    job = {"TORCH_COMPILE_JOB_ID": str(harness["job_id"])}
    samples: dict[str, list[float]] = {}
    verdicts: dict[str, list[str]] = {}
    for round_ in range(args.rounds):
        for name in chosen:
            source = target = {"local": local, "preloaded": preloaded}[source_dir(name)]
            if name.endswith("-copy"):
                target = args.work / f"probe-{name}"
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(source, target)
            env = job if uses_job_id(name) else None
            row = bench.child(cfg, "compile", f"probe-{name}-{round_}", target, env=env)
            samples.setdefault(name, []).append(row.get("first_call_s", float("nan")))
            verdicts.setdefault(name, []).append(cache_verdict(row))
    result["first_call_s"] = {
        k: {"median": median(v), "all": [round(x, 3) for x in v], "cache": verdicts[k]} for k, v in samples.items()
    }
    print_and_save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
