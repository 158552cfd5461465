"""Tests that need a binary still being built wait for it.

On a machine without its builds cached, scripts/test.sh runs the Go builds (tests/infra/builds.sh) in the background
while the tests that need no build run, and tells the tests where the builds stand: ``COMPILECACHE_BUILDS`` names a
file where each finished step's name is appended (``linters``, ``kube``, ``node``, ``oldest``; ``failed <step>`` when
one failed; ``all`` at the end), ``COMPILECACHE_BUILDS_PID`` the builder's process. A fixture calls
:func:`wait_for_build` with the step it needs before it looks for its binaries; the seconds it waited are left out
of pytest's own time for the time budget (testsupport/timing.py), and from the test's timeout: pytest-timeout's
alarm (its signal method arms ``ITIMER_REAL`` for each test) is held while it waits, so that a test waiting for a
26-minute build on a new machine is not stopped at 15 minutes. Without those variables nothing waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STEPS = ("linters", "kube", "node", "oldest")
POLL_SECONDS = 2.0


class BuildFailed(RuntimeError):
    """The background build of a step failed; its log is beside the progress file."""


def step_state(lines: list[str], step: str, builder_alive: bool) -> str:
    """``done``, ``failed`` or ``pending`` for ``step``, from the progress file's lines; a step the builder ended
    without reaching (it died) counts as ``failed``."""
    if f"failed {step}" in lines:
        return "failed"
    if step in lines:
        return "done"
    if "all" in lines or not builder_alive:
        return "failed"
    return "pending"


def _alive(pid: str | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True


@contextlib.contextmanager
def alarm_held() -> Iterator[None]:
    """Hold the process's ``ITIMER_REAL`` alarm (pytest-timeout's, armed for the current test) while inside, and
    arm it again with the time it had left on the way out: the time inside does not count against the test."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    if left > 0:
        signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left, interval)


def wait_for_build(step: str, log: Callable[[str], None] = print, poll: float = POLL_SECONDS) -> float:
    """Wait until the background build of ``step`` has finished (when one runs); returns the seconds waited.
    Raises BuildFailed naming the log when that step failed."""
    if step not in STEPS:
        raise ValueError(f"unknown build step {step!r} (one of {', '.join(STEPS)})")
    progress = os.environ.get("COMPILECACHE_BUILDS")
    if not progress:
        return 0.0
    path = Path(progress)
    started = time.monotonic()
    told = False
    with alarm_held():
        while True:
            lines = path.read_text().splitlines() if path.is_file() else []
            state = step_state(lines, step, _alive(os.environ.get("COMPILECACHE_BUILDS_PID")))
            if state != "pending":
                break
            if not told:
                log(f"\nwaiting for the background build of {step} ({path.with_name('builds.log')})")
                told = True
            time.sleep(poll)
    waited = time.monotonic() - started if told else 0.0
    if told:
        from testsupport import timing  # not at import: tests/conftest.py loads timing as a plugin, rewritten

        timing.note_build_wait(waited)
        log(f"the build of {step} finished after {waited:.0f}s of waiting")
    if state == "failed":
        raise BuildFailed(f"the background build of {step} failed or did not run: see {path.with_name('builds.log')}")
    return waited


CLUSTER_FIXTURES = frozenset({"kube_cluster", "kube_client", "real_node", "api_for_pods"})


def build_stage(path: str, fixtures: frozenset[str] | set[str]) -> int:
    """Which build a test waits for, in the order tests/infra/builds.sh makes them: 0 none, 1 the linters, 2 the
    control plane and the node (every test of tests/e2e), 3 the oldest API server."""
    if "oldest_cluster" in fixtures:
        return 3
    if "/e2e/" in f"/{path}" or fixtures & CLUSTER_FIXTURES:
        return 2
    return 1 if "linters" in fixtures else 0


def in_build_order(items: list[tuple[str, str, frozenset[str]]]) -> list[int]:
    """The indexes of (module, path, fixtures) items, stably sorted so that whole modules run in the order their
    builds come (a module goes where its latest-built need puts it: its module fixtures are set up once)."""
    module_stage: dict[str, int] = {}
    for module, path, fixtures in items:
        module_stage[module] = max(module_stage.get(module, 0), build_stage(path, fixtures))
    return sorted(range(len(items)), key=lambda i: module_stage[items[i][0]])
