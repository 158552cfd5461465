"""The README's test command passes any pytest arguments through (``scripts/test.sh ARGS...``), as the README says:
options first, ``-k``, a path, a path with ``-k``. Each run is the real script, set-up and all (every step of it is
cached by the run that started this suite), collecting only (``--co``), so that nothing runs twice."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the script's set-up checks, then a collection of the suite

ROOT = Path(__file__).resolve().parents[2]
THIS = "tests/infra/test_test_command.py"


@pytest.mark.parametrize("args", [
    ["--co", "-q"],
    ["--co", "-q", "-k", "test_the_readme_test_command"],
    ["--co", "-q", THIS],
    [THIS, "--co", "-q", "-k", "with-k"],
], ids=["options-only", "with-k", "a-path", "a-path-and-k"])
def test_the_readme_test_command_passes_pytest_arguments_through(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COMPILECACHE_BUILDS"))}
    proc = subprocess.run([str(ROOT / "scripts" / "test.sh"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    collected = re.findall(r"^(tests/\S+::\S+)$", proc.stdout, re.MULTILINE)
    if THIS in args:
        assert collected and all(item.startswith(THIS) for item in collected), out[-4000:]
    else:
        assert len(collected) > 1000 or "-k" in args, len(collected)
    if "-k" in args:
        selected = args[args.index("-k") + 1]
        assert collected and all(selected in item for item in collected), collected
    assert "unrecognized arguments" not in out
