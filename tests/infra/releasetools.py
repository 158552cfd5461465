"""The tools scripts/release.py uses beyond helm and podman, for its tests: ``cyclonedx-py`` (PyPI's cyclonedx-bom,
which writes the images' SBOMs) in a virtualenv of its own, installed once and cached outside the checkout, keyed by
version::

    ${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/tools-cyclonedx-bom-<version>/bin/cyclonedx-py

gpg (GnuPG, which signs the chart and the sums) comes from Debian (``gnupg``).

Shell entry (used by scripts/test.sh)::

    python -m tests.infra.releasetools           # install what is missing, print the tool paths
    python -m tests.infra.releasetools --check   # exit 1 when something is not installed yet
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testsupport import unavailable

CYCLONEDX_VERSION = "7.5.0"


def cache_dir() -> Path:
    return Path(os.environ.get("COMPILECACHE_TEST_CACHE") or Path.home() / ".cache" / "compilecache-test")


def cyclonedx_path() -> Path:
    return cache_dir() / f"tools-cyclonedx-bom-{CYCLONEDX_VERSION}" / "bin" / "cyclonedx-py"


def install_cyclonedx() -> Path:
    """The cached ``cyclonedx-py``, installed from PyPI into its own virtualenv when missing."""
    path = cyclonedx_path()
    if path.exists():
        return path
    venv = path.parent.parent
    partial = venv.with_name(venv.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    # From PyPI: no wheelhouse of this machine's pip configuration.
    env = {**os.environ, "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}
    subprocess.run([str(partial / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    f"cyclonedx-bom=={CYCLONEDX_VERSION}"], check=True, env=env)
    shutil.rmtree(venv, ignore_errors=True)
    partial.rename(venv)
    # The venv's scripts name its interpreter by the path it was made at: make them again at the final path.
    subprocess.run([sys.executable, "-m", "venv", "--upgrade", str(venv)], check=True)
    script = path.read_text()
    path.write_text(script.replace(str(partial), str(venv)))
    return path


@pytest.fixture(scope="session")
def cyclonedx() -> Path:
    """``cyclonedx-py``: skipped when not installed (``python -m tests.infra.releasetools``), failed with CI=true."""
    path = cyclonedx_path()
    if not path.exists():
        unavailable(f"{path} is not installed: python -m tests.infra.releasetools")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.releasetools")
    parser.add_argument("--check", action="store_true", help="exit 1 when a tool is not installed")
    args = parser.parse_args(argv)
    if args.check:
        missing = not cyclonedx_path().exists()
        print(f"{cyclonedx_path()}: {'missing' if missing else 'ok'}")
        return 1 if missing else 0
    print(install_cyclonedx())
    return 0


if __name__ == "__main__":
    sys.exit(main())
