"""What the byte-code part saves a pod: fresh processes importing what a compiled workload imports.

    python bench/bytecode.py [--repeat 5] [--modules torch,torch._dynamo,torch._inductor.compile_fx]
                             [--extra transformers] [--out results.json]

1. one process imports the modules and writes the byte-code tree the warm-up would ship
   (:func:`cachelib.in_image.bytecode.write_tree` into a temporary cache directory): its files and bytes;
2. ``--repeat`` rounds, each with one fresh process without the tree and one with
   ``PYTHONPYCACHEPREFIX`` on it (both ``PYTHONDONTWRITEBYTECODE=1``, as the pods of such images
   run): seconds of ``import torch`` and of the rest, measured inside the process, and the wall
   time of the whole process.

It tells the truth only where the interpreter has no byte code of its own beside the sources
(the first line printed says how many of the imported sources have one). Medians, and the ratio
measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachelib.in_image import bytecode  # noqa: E402

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
for name in sys.argv[1].split(","):
    if name and name != "torch":
        __import__(name)
t2 = time.perf_counter()
out = {"import_torch": t1 - t0, "import_rest": t2 - t1}
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
    from cachelib.in_image import bytecode
    sources = bytecode.imported_sources()
    has, have, total = bytecode.image_has_bytecode(sources)
    tree = bytecode.write_tree(sources, __import__("pathlib").Path(sys.argv[3]))
    out.update(beside=have, sources=total, tree=tree.to_dict())
print(json.dumps(out))
"""


def run(modules: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, modules, *extra], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    record: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    record["process"] = time.perf_counter() - started
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--modules", default="torch,torch._dynamo,torch._inductor.compile_fx")
    parser.add_argument("--extra", default="", help="more modules, comma-separated (e.g. transformers)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    modules = ",".join(m for m in (args.modules + "," + args.extra).split(",") if m)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    base["PYTHONDONTWRITEBYTECODE"] = "1"
    with tempfile.TemporaryDirectory(prefix="compilecache-bytecode-") as work:
        made = run(modules, base, str(ROOT), work)
        print(f"imported sources: {made['sources']}, with valid byte code beside them: {made['beside']}")
        print(f"tree: {made['tree']['files']} files, {made['tree']['bytes'] / 1e6:.1f} MB ({made['tree']['skipped']})")
        with_tree = {**base, "PYTHONPYCACHEPREFIX": str(Path(work) / bytecode.PYCACHE_DIR)}
        rows: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
        for _ in range(args.repeat):
            rows["without"].append(run(modules, base))
            rows["with"].append(run(modules, with_tree))
    summary = {
        name: {k: statistics.median(r[k] for r in records) for k in ("import_torch", "import_rest", "process")}
        for name, records in rows.items()
    }
    print(f"\nmedians of {args.repeat} fresh processes each, seconds (modules: {modules})")
    print("| | import torch | the rest | whole process |\n|---|---|---|---|")
    for name, values in summary.items():
        cells = " | ".join(f"{values[k]:.2f}" for k in ("import_torch", "import_rest", "process"))
        print(f"| {name} the tree | {cells} |")
    ratio = summary["with"]["process"] / summary["without"]["process"]
    print(f"\nwith ÷ without (whole process): {ratio:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"modules": modules, "made": made, "rows": rows, "summary": summary, "python": sys.version}
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
