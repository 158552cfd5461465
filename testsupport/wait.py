"""Polling with a deadline, for tests that wait on a real API server."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """Call ``probe`` until it returns something truthy and return that; raise TimeoutError naming ``what``.

    Exceptions raised by ``probe`` count as "not yet"; the last one is chained to the TimeoutError.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    last_value: object = None
    while True:
        try:
            value = probe()
        except Exception as error:
            last_error = error
        else:
            if value:
                return value
            last_value = value
        if time.monotonic() >= deadline:
            detail = f"last error: {last_error!r}" if last_error else f"last value: {last_value!r}"
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} ({detail})") from last_error
        time.sleep(interval)


def answers_ok(url: str, timeout: float = 1) -> bool:
    """Whether ``url`` answers 200 now (a probe such as ``/readyz``); no answer, or another status, is False."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:
        return False
