"""What a preloaded pod on the CPU still compiles: Inductor's precompiled header.

On the CPU, Inductor builds its C++ kernels with a precompiled header of ATen's vectorized headers, kept under
``<temp dir>/torchinductor_<user>/precompiled_headers``, outside ``TORCHINDUCTOR_CACHE_DIR``. A fresh process
preprocesses the header and, when that directory lacks it, builds it (about 150 MB) before it loads a kernel from
the cache, even when every kernel is already there. A pod has a /tmp of its own, so every preloaded CPU pod pays
it. Fresh processes, each compiling the same small model:

- cold: an empty cache directory and an empty temp directory (a warm-up);
- preloaded: the cache directory the cold one filled, an empty temp directory (a pod);
- header kept: the same cache directory and the cold one's temp directory (a second process on the same machine);
- cold, header kept: an empty cache directory and the cold one's temp directory (a new model on that machine);
- and the first two again with ``TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0`` (no header: the kernels compile
  without it), on a cache directory of their own (the setting is in Inductor's cache keys).

Each line: the first call's seconds (import excluded) and the process's CPU seconds with its children's
(``TORCHINDUCTOR_COMPILE_THREADS=1``, so that every compiler runs as a child that is waited for).

    python bench/cpu_pod_header.py [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = """
import json, resource, time
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))
started = time.perf_counter()
with torch.no_grad():
    torch.compile(model)(torch.randn(16, 64))
first_call = time.perf_counter() - started
own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
print(json.dumps({"first_call": first_call, "cpu": cpu}))
"""


NO_HEADER = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def run(cache: Path, tmp: Path, **settings: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TORCH_COMPILE"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TMPDIR=str(tmp), TORCHINDUCTOR_COMPILE_THREADS="1", **settings)
    proc = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the workload failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="rounds of the six processes (default 2)")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    for round_ in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as work:
            names = ("cache", "tmp-warm-up", "tmp-pod", "cache-new", "cache-off", "tmp-warm-up-off", "tmp-pod-off")
            dirs = [Path(work) / name for name in names]
            for d in dirs:
                d.mkdir()
            cache, first_tmp, pod_tmp, cache_new, cache_off, first_off, pod_off = dirs
            rows = [("cold", run(cache, first_tmp)), ("preloaded", run(cache, pod_tmp)),
                    ("header kept", run(cache, first_tmp)), ("cold, header kept", run(cache_new, first_tmp)),
                    ("no header, cold", run(cache_off, first_off, **NO_HEADER)),
                    ("no header, preloaded", run(cache_off, pod_off, **NO_HEADER))]  # fmt: skip
            header = sum(f.stat().st_size for f in first_tmp.rglob("*") if f.is_file())
            for name, row in rows:
                print(f"round {round_}  {name:<20} first call {row['first_call']:6.2f} s   CPU {row['cpu']:6.2f} s")
            print(f"round {round_}  the temp directory's header: {header / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
