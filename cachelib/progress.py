"""A byte-transfer progress bar on stderr, shown only when stderr is a terminal.

Stdlib only. The bar reads ``label [#####-----]  42.0 MiB / 100.0 MiB  85.3 MiB/s  ETA 0:00:01``;
with an unknown total it shows the bytes moved and the rate. Redraws are throttled so that
a fast transfer does not spend its time printing.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from cachelib.units import human_bytes

_REDRAW_SECONDS = 0.1


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``0:01:15``."""
    whole = max(0, int(seconds + 0.5))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_bar(label: str, done: int, total: int | None, elapsed: float, width: int = 30) -> str:
    """One line of progress: the bar (when the total is known), bytes, rate and ETA."""
    rate = done / elapsed if elapsed > 0 else 0.0
    rate_text = f"{human_bytes(rate)}/s"
    if not total:
        return f"{label}  {human_bytes(done)}  {rate_text}"
    fraction = min(1.0, done / total)
    filled = int(fraction * width)
    bar = "#" * filled + "-" * (width - filled)
    eta = format_duration((total - done) / rate) if rate > 0 and done < total else "--:--"
    return f"{label} [{bar}] {human_bytes(done)} / {human_bytes(total)}  {rate_text}  ETA {eta}"


class Progress:
    """Counts bytes and redraws a bar; a no-op unless enabled and the stream is a terminal.

    Thread-safe: parallel transfers may call :meth:`update` from several threads.
    """

    def __init__(self, label: str, total: int | None, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self.shown = enabled and _is_terminal(self._stream)
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._lock = threading.Lock()
        self._closed = False

    def update(self, n: int) -> None:
        """Record ``n`` more bytes moved."""
        with self._lock:
            self.done += n
            if self.shown and time.monotonic() - self._last_draw >= _REDRAW_SECONDS:
                self._draw()

    def close(self) -> None:
        """Draw the final state and end the line."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.shown:
                self._draw()
                self._stream.write("\n")
                self._stream.flush()

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        line = format_bar(self.label, self.done, self.total, self._last_draw - self._start)
        self._stream.write("\r" + line + "\x1b[K")
        self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
