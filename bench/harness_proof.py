"""End-to-end proof of the warm-up harness on whatever device torch finds (CUDA when there is one).

For each built-in target (the three in parallel, each in its own directories): the harness
compiles it into a fresh cache directory, `compilecache publish` turns the output into a
bundle in the store, `compilecache preload` fetches, verifies and unpacks it into an empty
directory in a new process, and the harness compiles the same target again in a third
process against that directory (``--cache-dir``). That last process's torch counters must
show FX-graph and AOTAutograd cache hits and no misses.

    python bench/harness_proof.py --out out/harness-proof [--redis-server PATH]

Writes OUT/harness-proof.json and prints one line per target.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.warm_start import CLI, REPO, _last_json_line, environment, redis_server

TARGETS = ("tiny_mlp", "transformer_block", "small_convnet")


def run(cmd: list[str]) -> dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    record: dict[str, Any] = {"exit": proc.returncode, "wall_s": round(time.perf_counter() - t, 3)}
    record["output"] = _last_json_line(proc.stdout)
    if proc.returncode != 0:
        record["stderr_tail"] = proc.stderr[-2000:]
    return record


def prove(target: str, work: Path, store: str, python: str) -> dict[str, Any]:
    name = f"{target.replace('_', '-')}-proof"
    warm, check, preloaded = work / target / "warm", work / target / "check", work / target / "preloaded"
    for path in (warm, check, preloaded):
        shutil.rmtree(path, ignore_errors=True)
    harness = [python, str(REPO / "cachelib" / "in_image" / "harness.py"), "--target", target]
    harness += ["--namespace", "bench", "--name", name]
    steps: dict[str, Any] = {"warm-up": run([*harness, "--out", str(warm)])}
    key = (steps["warm-up"]["output"] or {}).get("key")
    if steps["warm-up"]["exit"] == 0 and key:
        steps["publish"] = run([python, *CLI, "publish", str(warm), "--store", store])
        preload = [python, *CLI, "preload", "--store", store, "--key", key, "--target", str(preloaded), "--strict"]
        steps["preload"] = run(preload)
        steps["compile-again"] = run([*harness, "--out", str(check), "--cache-dir", str(preloaded)])
    cache = (steps.get("compile-again", {}).get("output") or {}).get("cache") or {}
    hits = cache.get("fxgraph_hit", 0) + cache.get("aotautograd_hit", 0)
    misses = cache.get("fxgraph_miss", 0) + cache.get("aotautograd_miss", 0)
    verdict = "hit" if hits and not misses else ("MISS" if misses else "no result")
    return {"target": target, "key": key, "verdict": verdict, "steps": steps}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--redis-server", help="redis-server binary (default: from PATH); none found = file store")
    args = p.parse_args(argv)
    work = (args.out / "work").resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    python = sys.executable
    with redis_server(args.redis_server, work) as redis:
        store = f"redis://{redis[0]}:{redis[1]}/0" if redis else f"file://{work / 'store'}"
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(TARGETS)) as pool:
            results = list(pool.map(lambda t: prove(t, work, store, python), TARGETS))
    summary = {"environment": environment(python), "store": store.split(":")[0], "targets": results}
    (args.out / "harness-proof.json").write_text(json.dumps(summary, indent=1))
    for r in results:
        again = (r["steps"].get("compile-again", {}).get("output") or {}).get("cache")
        print(f"{r['target']:18s} {r['verdict']:8s} key={r['key']} compile-again cache={again}")
    return 0 if all(r["verdict"] == "hit" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
