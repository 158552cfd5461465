"""The stage lines of a long run on stderr: one line per stage with the seconds since the start, and a
heartbeat while a stage lasts (the warm-up harness, ``compilecache warmup``).

Standard library only: the warm-up Job copies this module beside the harness into the user's image.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import TextIO

PROGRESS_ENV = "COMPILECACHE_PROGRESS_SECONDS"
"""Seconds between the heartbeat lines while a stage runs (default 15; 0: stage lines only)."""
DEFAULT_HEARTBEAT = 15.0


def progress_line(prefix: str, elapsed: float, text: str) -> str:
    """``harness: [  42s] compiling entry 1 of 2 (GPT2Model)`` (pure)."""
    return f"{prefix}: [{elapsed:5.0f}s] {text}"


def heartbeat_text(stage: str, in_stage: float) -> str:
    """What the heartbeat says while ``stage`` runs (pure)."""
    return f"still {stage} ({in_stage:.0f} s in this stage)"


def heartbeat_seconds(environ: Mapping[str, str]) -> float:
    """The heartbeat period from the environment: 0 (none) for a value that is not a positive number."""
    text = environ.get(PROGRESS_ENV, "")
    try:
        value = float(text) if text else DEFAULT_HEARTBEAT
    except ValueError:
        return DEFAULT_HEARTBEAT
    return value if 0 < value < float("inf") else 0.0


class Stages:
    """What a long run is doing, on stderr: one line per stage with the seconds since the start, and
    while a stage lasts, a heartbeat every few seconds (``$COMPILECACHE_PROGRESS_SECONDS``, default 15).
    In a Job's log (stderr not a terminal) every line is a plain line; on a terminal the heartbeat
    redraws one line in place. Torch compiles for minutes without a word: this says it is alive."""

    def __init__(self, prefix: str, stream: TextIO | None = None, every: float | None = None) -> None:
        self.prefix = prefix
        self._stream = stream
        self._every = every
        self.started: float | None = None
        """When the first stage began (the clock of every line)."""
        self.stage_started = 0.0
        self.current: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redrawn = False

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    @property
    def every(self) -> float:
        return heartbeat_seconds(os.environ) if self._every is None else self._every

    @property
    def tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty()) if callable(isatty) else False
        except ValueError:  # a closed stream
            return False

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def stage(self, text: str) -> None:
        """A new stage begins: its line, and the heartbeat from now on says it."""
        with self._lock:
            now = time.monotonic()
            self.started = now if self.started is None else self.started
            self.current, self.stage_started = text, now
            self._write(progress_line(self.prefix, self.elapsed(), text), redraw=False)
            every = self.every
            if every and self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._beat, args=(every, self._stop),
                                                name="compilecache-progress", daemon=True)
                self._thread.start()

    def done(self, text: str | None = None) -> None:
        """The run is over (its last line, when given): no more heartbeats."""
        self._stop.set()
        with self._lock:
            if text is not None:
                self._write(progress_line(self.prefix, self.elapsed(), text), redraw=False)
            elif self._redrawn:
                self._write("", redraw=False)
            self.current, self._thread = None, None

    def _beat(self, every: float, stop: threading.Event) -> None:
        """A heartbeat each ``every`` seconds a stage lasts (the first one ``every`` after it began)."""
        last = 0.0
        while True:
            with self._lock:
                due = max(self.stage_started, last) + every
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            with self._lock:
                now = time.monotonic()
                if self.current is None or now < max(self.stage_started, last) + every:
                    continue  # a new stage began meanwhile: its own heartbeats come later
                last = now
                text = heartbeat_text(self.current, now - self.stage_started)
                self._write(progress_line(self.prefix, self.elapsed(), text), redraw=self.tty)

    def _write(self, line: str, redraw: bool) -> None:
        with contextlib.suppress(OSError, ValueError):
            if redraw:  # a terminal: the heartbeat rewrites its own line
                self.stream.write("\r\033[K" + line)
            else:
                self.stream.write(("\r\033[K" if self._redrawn else "") + line + ("\n" if line else ""))
            self._redrawn = redraw
            self.stream.flush()
