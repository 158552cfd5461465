"""The hand-off between the preloader and the workload: the done file.

A preload that runs beside the workload (a Kubernetes native sidecar) is off the workload's
critical path: the workload imports torch and builds its model (seconds) while the bundle is
fetched, and waits for the preload only just before its first compiled call::

    from cachelib.handoff import wait_for_preload

    model = build_model()                 # torch and the model load while the preload runs
    compiled = torch.compile(model)
    wait_for_preload()                    # at once when no preload runs beside the workload
    compiled(batch)

When it has finished, whatever the result, the preloader writes its one-line JSON result to
the done file, atomically (a rename), so a reader sees all of it or nothing. The workload finds
the file's path in ``$COMPILECACHE_PRELOAD_DONE`` (the webhook sets it). Standard library
only: a workload needs nothing else from compilecache, and a workload without it can wait with
the same few lines of polling.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachelib.in_image.podcontract import DONE_FILE_ENV
from cachelib.in_image.podcontract import DONE_FILE_NAME as DONE_FILE_NAME

DEFAULT_TIMEOUT = 600.0
POLL_SECONDS = 0.01
TIMEOUT = "timeout"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Waited:
    """The last :func:`wait_for_preload` of this process (exported by :mod:`cachelib.runtime`)."""

    result: str
    seconds: float


last_wait: Waited | None = None


DONE_FILE_MODE = 0o644
"""Readable by every uid: the workload rarely runs as the preloader's user (the file holds no secret)."""


def write_done(path: str | Path, payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as the done file at ``path``: to a temporary name beside it, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".compilecache-done-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(dict(payload), sort_keys=True, separators=(",", ":")) + "\n")
            os.fchmod(out.fileno(), DONE_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_done(path: str | Path) -> dict[str, Any] | None:
    """The preloader's result from the done file; None while there is none. A file that is not
    a JSON object (not ours, or damaged) reads as an ``error`` result naming the file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not isinstance(value.get("result"), str):
        return {"result": "error", "reason": f"{path}: not a preload result: {text[:200]!r}"}
    return value


def done_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The done file named by ``$COMPILECACHE_PRELOAD_DONE``, None when unset."""
    value = (os.environ if env is None else env).get(DONE_FILE_ENV)
    return Path(value) if value else None


def wait_for_preload(
    path: str | Path | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    poll: float = POLL_SECONDS,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """Block until the preloader's done file exists; its result (``result`` is hit, miss or error).

    ``path`` defaults to ``$COMPILECACHE_PRELOAD_DONE``; with neither, there is no preload to
    wait for and the answer is None at once. After ``timeout`` seconds the answer is a
    ``timeout`` result and the workload goes on: it then compiles with whatever the cache holds,
    which is slower but correct (files appear in the cache directory only when complete).
    """
    global last_wait
    target = Path(path) if path is not None else done_file(env)
    if target is None:
        return None
    started = clock()
    deadline = started + timeout
    while True:
        result = read_done(target)
        now = clock()
        if result is not None:
            break
        if now >= deadline:
            result = {"result": TIMEOUT, "reason": f"no preload result at {target} after {timeout:g} s"}
            log.warning("compilecache: %s; compiling without it", result["reason"])
            break
        sleep(min(poll, deadline - now))
    last_wait = Waited(result=str(result["result"]), seconds=now - started)
    return result
