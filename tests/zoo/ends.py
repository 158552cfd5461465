"""The two ends of the supported torch range the zoo runs on: the suite's venv (its torch is the oldest the
CPU tests have) and the venv ``scripts/test.sh`` makes with the newest torch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from testsupport import unavailable

CACHE = Path(os.environ.get("COMPILECACHE_TEST_CACHE", Path.home() / ".cache" / "compilecache-test"))
NEWEST_TORCH = "2.15"
NEWEST_VENV = CACHE / f"venv-torch-{NEWEST_TORCH}"
ENDS = ("oldest", "newest")


def interpreter(end: str) -> str:
    """The Python of an end; the newest's missing venv skips (fails with CI=true) naming what makes it."""
    if end == "oldest":
        return sys.executable
    python = NEWEST_VENV / "bin" / "python"
    if not python.exists():
        unavailable(f"{python} (scripts/test.sh makes it: torch {NEWEST_TORCH} for the zoo's newest end)")
    return str(python)
