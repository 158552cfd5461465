"""Fixtures of the cachelib tests: one real CPU warm-up shared by the session (the store servers are the whole
suite's, tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cachelib.in_image import harness

__all__ = ["open_dir", "warmed"]

WARM_TARGET = "tiny_mlp"
WARM_NAMESPACE, WARM_NAME = "default", "warm"


@dataclass(frozen=True)
class Warmed:
    """A real warm-up of a built-in target on the CPU: the harness output directory and its result."""

    out: Path
    result: dict[str, Any]
    seconds: float

    @property
    def key(self) -> str:
        return str(self.result["key_string"])


@pytest.fixture(scope="session")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Warmed:
    """One cold compile of tiny_mlp through ``python harness.py`` (the file, as in a user's image)."""
    out = tmp_path_factory.mktemp("warmup") / "out"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, harness.__file__, "--target", WARM_TARGET, "--out", str(out),
         "--namespace", WARM_NAMESPACE, "--name", WARM_NAME],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    return Warmed(out, result, time.perf_counter() - started)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh directory every uid can reach (pytest's own tmp_path sits below a root-only 0700
    directory), for tests that run processes as other users; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="compilecache-uids-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
