"""How much real bundles inflate: the measurement behind the preloader's default ``--max-ratio``.

Compiles targets with the warm-up harness (a fresh process each, as a warm-up Job does), packs
each output into a bundle, and reports for every part its stored (zstd) size, its uncompressed
size and their ratio, the figure ``--max-ratio`` bounds. The ``cachedir`` part is a tar, so its
uncompressed size counts the tar's 512-byte headers and padding as well as the files.

    python bench/bundle_ratio.py                                  # the built-in targets on this machine
    python bench/bundle_ratio.py --targets tiny_mlp --backward    # also forward+backward compiles
    python bench/bundle_ratio.py --outdirs OUT1 OUT2              # harness outputs made elsewhere (a GPU)
    python bench/bundle_ratio.py --json ratios.json

The result table goes to stdout; ``--json`` also writes the rows and the largest ratio seen.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cachelib.bundle import BundleHeader
from cachelib.in_image import harness
from cachelib.publish import pack

DEFAULT_TARGETS = ("tiny_mlp", "transformer_block", "small_convnet")


@dataclass(frozen=True)
class Row:
    """One part of one measured bundle."""

    bundle: str
    part: str
    stored: int
    size: int
    files: int

    @property
    def ratio(self) -> float:
        return self.size / max(self.stored, 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": round(self.ratio, 2)}


def rows_of(name: str, header: BundleHeader, files: int) -> list[Row]:
    """The measured rows of one bundle's header (pure)."""
    return [Row(name, p.name, p.stored_size, p.size, files if p.name == "cachedir" else 0) for p in header.parts]


def count_files(cachedir: Path) -> int:
    return sum(1 for p in cachedir.rglob("*") if p.is_file() and "locks" not in p.relative_to(cachedir).parts)


def warm_up(target: str, out: Path, backward: bool) -> float:
    """Run the harness in a fresh process; its wall time in seconds."""
    name = "ratio-" + re.sub(r"[^a-z0-9]+", "-", target.lower()).strip("-")
    argv = [sys.executable, harness.__file__, "--target", target, "--out", str(out),
            "--namespace", "bench", "--name", name]  # fmt: skip
    if backward:
        argv.append("--backward")
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"harness failed for {target}:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def measure(outdir: Path, name: str, scratch: Path) -> list[Row]:
    written = pack(outdir, scratch / f"{name}.ccb")
    return rows_of(name, written.header, count_files(outdir / "cachedir"))


def format_table(rows: list[Row]) -> str:
    lines = [f"{'bundle':34} {'part':10} {'stored':>10} {'size':>11} {'ratio':>7} {'files':>6}"]
    for r in rows:
        lines.append(f"{r.bundle:34} {r.part:10} {r.stored:>10} {r.size:>11} {r.ratio:>7.2f} {r.files:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="built-in or module:function targets")
    parser.add_argument("--backward", action="store_true", help="also compile each target forward+backward")
    parser.add_argument("--outdirs", nargs="*", default=[], help="existing harness output directories to measure")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bundle-ratio-") as scratch:
        work = Path(scratch)
        for outdir in args.outdirs:
            rows += measure(Path(outdir), Path(outdir).name, work)
        targets = [t for t in args.targets.split(",") if t]
        for target in targets:
            for backward in (False, True) if args.backward else (False,):
                name = target + ("+backward" if backward else "")
                seconds = warm_up(target, work / name, backward)
                print(f"warmed {name} in {seconds:.1f} s", file=sys.stderr)
                rows += measure(work / name, name, work)
    print(format_table(rows))
    cachedir = [r for r in rows if r.part == "cachedir"]
    largest = max((r.ratio for r in cachedir), default=0.0)
    print(f"largest cachedir ratio: {largest:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [r.to_dict() for r in rows], "largest_cachedir_ratio": largest}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
