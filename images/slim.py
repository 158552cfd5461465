"""Trim an image's site-packages to what compilecache runs.

Three reductions, each safe for the code paths the images use:
- botocore ships a model for every AWS service (about 400); the store talks to S3 only, and the
  credential chain may call STS (web identity, assume role), SSO, SSO-OIDC and Sign-In. The other
  service directories under ``botocore/data/`` go; the shared files at its top stay.
- zstandard ships two backends; its default import policy uses the C extension, so the CFFI
  build (``zstandard/_cffi.*.so``) goes.
- Native extensions in wheels often carry debug info: ``strip --strip-unneeded`` every ``*.so``
  (with ``--strip``, when binutils' ``strip`` is on PATH).

    python images/slim.py /opt/venv/lib/python3.11/site-packages --strip   # in the image builds
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

KEEP_BOTOCORE_SERVICES = frozenset({"s3", "sts", "sso", "sso-oidc", "signin"})
REMOVED_GLOBS = ("zstandard/_cffi.*.so",)


def is_removed(relative: str) -> bool:
    """Whether a file, given relative to site-packages with forward slashes, is removed."""
    parts = PurePosixPath(relative).parts
    if len(parts) >= 4 and parts[:2] == ("botocore", "data") and parts[2] not in KEEP_BOTOCORE_SERVICES:
        return True
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in REMOVED_GLOBS)


def strip_binary(path: Path) -> int:
    """``strip --strip-unneeded`` one shared object in place; returns the bytes saved."""
    before = path.stat().st_size
    subprocess.run(["strip", "--strip-unneeded", str(path)], check=True, capture_output=True)
    return before - path.stat().st_size


def slim(site_packages: Path, strip: bool = False) -> int:
    """Apply the reductions to ``site_packages``; returns the bytes freed."""
    if not site_packages.is_dir():
        raise FileNotFoundError(f"{site_packages} is not a directory")
    data = site_packages / "botocore" / "data"
    if data.is_dir():
        missing = sorted(s for s in KEEP_BOTOCORE_SERVICES if not (data / s).is_dir())
        if missing:
            raise FileNotFoundError(f"{data} lacks the models {missing}: refusing to prune an unexpected layout")
    freed = 0
    for path in sorted(site_packages.rglob("*")):
        if path.is_file() and not path.is_symlink() and is_removed(path.relative_to(site_packages).as_posix()):
            freed += path.stat().st_size
            path.unlink()
    if data.is_dir():
        for service in data.iterdir():
            if service.is_dir() and service.name not in KEEP_BOTOCORE_SERVICES:
                shutil.rmtree(service)
    if strip:
        if shutil.which("strip") is None:
            raise FileNotFoundError("strip (binutils) is not on PATH")
        freed += sum(strip_binary(p) for p in sorted(site_packages.rglob("*.so")) if p.is_file())
    return freed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site_packages", type=Path)
    parser.add_argument("--strip", action="store_true", help="also strip debug info from native extensions")
    args = parser.parse_args(argv)
    try:
        freed = slim(args.site_packages, strip=args.strip)
    except (FileNotFoundError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"slim: {freed / 1e6:.1f} MB freed in {args.site_packages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
