"""Expected installed size of an image's Python packages, from the wheel set pip resolves.

Builds the project's wheel, lets pip resolve ``compilecache[EXTRA]`` to binary wheels for the
image's platform (Linux x86_64, CPython 3.11 by default) and sums the uncompressed size of every
wheel: what ``pip install`` writes to site-packages, before byte-compilation. With ``--slim`` the
sizes are those after images/slim.py, as the Dockerfiles run it: removed files left out and native
extensions measured after ``strip --strip-unneeded``. The Python base image itself is not counted.

    python images/wheel-size.py --extra store --slim       # the preloader image
    python images/wheel-size.py --extra operator --slim    # the operator image
"""

from __future__ import annotations

import argparse
import importlib.util
import marshal
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


@dataclass(frozen=True)
class WheelSize:
    """One wheel: its file name, download size, installed (uncompressed) size and its .pyc files' size."""

    name: str
    download_bytes: int
    installed_bytes: int
    bytecode_bytes: int = 0


def installed_size(wheel: Path, slim: ModuleType | None = None) -> WheelSize:
    """Sum the uncompressed sizes of the wheel's members; with ``slim``, as images/slim.py leaves them."""
    total = bytecode = 0
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        for info in archive.infolist():
            if info.is_dir() or (slim and slim.is_removed(info.filename)):
                continue
            if slim and info.filename.endswith(".so"):
                extracted = Path(archive.extract(info, tmp))
                total += extracted.stat().st_size - slim.strip_binary(extracted)
            else:
                total += info.file_size
            if info.filename.endswith(".py"):
                bytecode += pyc_size(archive.read(info), info.filename)
    return WheelSize(wheel.name, wheel.stat().st_size, total, bytecode)


def pyc_size(source: bytes, filename: str) -> int:
    """Size of the .pyc that byte-compiling ``source`` writes (16-byte header + marshalled code); 0 if it fails."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return 0
    return 16 + len(marshal.dumps(code))


def summarize(sizes: Iterable[WheelSize]) -> tuple[list[WheelSize], int, int]:
    """Wheels sorted by installed size (largest first) with the download and installed totals."""
    ordered = sorted(sizes, key=lambda s: s.installed_bytes, reverse=True)
    return ordered, sum(s.download_bytes for s in ordered), sum(s.installed_bytes for s in ordered)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def load_slim() -> ModuleType:
    """images/slim.py, the reductions the Dockerfiles apply."""
    spec = importlib.util.spec_from_file_location("slim", REPO_ROOT / "images" / "slim.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed:\n{proc.stderr.strip()[-2000:]}")


def resolve_wheels(extra: str, python_version: str, dest: Path) -> list[Path]:
    """Build the project wheel and download the binary wheels of ``compilecache[extra]`` into ``dest``."""
    build = dest / "project"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(build), str(REPO_ROOT)])
    project = next(build.glob("compilecache-*.whl"))
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
          "--only-binary=:all:", *platform_args, "--python-version", python_version,
          "--implementation", "cp", "-d", str(dest / "wheels"), f"{project}[{extra}]"])
    return sorted((dest / "wheels").glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extra", default="store", help="the project extra the image installs (default: store)")
    parser.add_argument("--python-version", default="3.11", help="target CPython version (default: 3.11)")
    parser.add_argument("--slim", action="store_true", help="sizes after images/slim.py --strip")
    args = parser.parse_args(argv)
    if args.slim and shutil.which("strip") is None:
        parser.error("--slim needs binutils' strip on PATH")
    slim = load_slim() if args.slim else None
    with tempfile.TemporaryDirectory() as tmp:
        wheels = resolve_wheels(args.extra, args.python_version, Path(tmp))
        rows, download, installed = summarize(installed_size(w, slim) for w in wheels)
    print(f"compilecache[{args.extra}] for linux x86_64, CPython {args.python_version}"
          f"{', after images/slim.py --strip' if slim else ''}: {len(rows)} wheels")
    bytecode = sum(r.bytecode_bytes for r in rows)
    print(f"{'wheel':<60} {'download MB':>11} {'installed MB':>12} {'+ .pyc MB':>9}")
    for r in rows:
        print(f"{r.name[:60]:<60} {_mb(r.download_bytes):>11} {_mb(r.installed_bytes):>12} {_mb(r.bytecode_bytes):>9}")
    print(f"{'total':<60} {_mb(download):>11} {_mb(installed):>12} {_mb(bytecode):>9}")
    print(f"installed with byte-compiled .pyc: {_mb(installed + bytecode)} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
