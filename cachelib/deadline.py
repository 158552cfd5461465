"""A preload's work under a deadline: run in a worker thread, called off when the deadline passes (its gate
closed, its staging directories removed), and the worker threads that were left blocked."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable

from cachelib.unpack import LOCK_SUFFIX, Gate

_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()


def abandoned_work() -> bool:
    """Whether a preload called off by its deadline left a worker thread blocked (in a socket read,
    say). A command line that is done should then leave with ``os._exit``: the interpreter would
    otherwise wait for that worker's thread pools at exit."""
    with _abandoned_lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        return bool(_abandoned)


def within_deadline(name: str, gate: Gate, work: Callable[[], None], deadline: float | None) -> bool:
    """Run ``work``; with a deadline in a worker thread. False when the deadline passed first:
    the gate is then closed (an install under way is waited for, later ones never happen) and
    the worker's staging directories are removed."""
    if deadline is None:
        work()
        return True
    finished = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            finished.set()

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        if finished.wait(max(0.0, deadline)):
            return True
    except KeyboardInterrupt:
        _call_off(gate, worker, finished)
        raise
    return _call_off(gate, worker, finished)


def _call_off(gate: Gate, worker: threading.Thread, finished: threading.Event) -> bool:
    """Close the gate (an install under way ends first, later ones never happen) and remove the
    worker's staging directories; True when it had finished its last install after all."""
    leftovers = gate.close()
    if finished.wait(0.05):
        return True  # it was finishing its last install: the result is complete
    for staging in leftovers:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(f"{staging}{LOCK_SUFFIX}")
    with _abandoned_lock:
        _abandoned.append(worker)
    return False
