"""Support the tests and the benchmarks share (not shipped): real servers on loopback, a local Kubernetes
control plane, the model zoo."""

from __future__ import annotations

import os
from typing import NoReturn


def unavailable(reason: str) -> NoReturn:
    """Skip the requesting test because ``reason`` (a part not installed or not built), or with CI=true fail it:
    CI never passes by skipping (pytest imported here: the benchmarks use this package without it)."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)
