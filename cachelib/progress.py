"""A byte-transfer progress bar on stderr, shown only when stderr is a terminal.

Stdlib only. The bar reads ``get team-a/llama cpu [#####-----] 42.0 MiB / 100.0 MiB  85.3 MiB/s  ETA 0:00:01``;
with an unknown total it shows the bytes moved and the rate. A label that names a bundle key
is shown as the cache and GPU it is for (the full key is some 110 characters), and the line is
cut to the terminal's width, so that a redraw never wraps into stale lines. Redraws are
throttled so that a fast transfer does not spend its time printing.

A transfer is watched from outside, by wrapping the stream it reads (the stores know nothing of
it): :func:`stderr_bar` is the :data:`Watch` the CLI passes to ``publish`` and ``preload``,
:func:`unwatched` the default that shows nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO, TextIO, cast

from cachelib.units import human_bytes

_REDRAW_SECONDS = 0.1
_BAR_WIDTH = 30
_MIN_BAR_WIDTH = 10
_DEFAULT_COLUMNS = 80


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``0:01:15``."""
    whole = max(0, int(seconds + 0.5))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def display_label(label: str) -> str:
    """``get cc1/team-a/llama/<digests>/nvidia-h100/sm90/torch-…`` -> ``get team-a/llama nvidia-h100``.

    A label whose last word is a bundle key is shown as the cache and GPU the bundle is for;
    any other label is shown as it is.
    """
    from cachelib.keyformat import CacheKey, InvalidKey

    verb, _, last = label.rpartition(" ")
    try:
        key = CacheKey.parse(last)
    except InvalidKey:
        return label
    return f"{verb} {key.namespace}/{key.name} {key.gpu}".lstrip()


def format_bar(
    label: str, done: int, total: int | None, elapsed: float, width: int = _BAR_WIDTH, columns: int | None = None
) -> str:
    """One line of progress: the bar (when the total is known), bytes, rate and ETA.

    With ``columns``, the line fits in ``columns - 1`` characters (the last column is left free,
    where a terminal would wrap): the bar narrows first, then the label is cut with ``…``.
    """
    rate = done / elapsed if elapsed > 0 else 0.0
    rate_text = f"{human_bytes(rate)}/s"
    if not total:
        return _fit(label, f"  {human_bytes(done)}  {rate_text}", columns)
    fraction = min(1.0, done / total)
    eta = format_duration((total - done) / rate) if rate > 0 and done < total else "--:--"
    figures = f" {human_bytes(done)} / {human_bytes(total)}  {rate_text}  ETA {eta}"
    if columns is not None:
        spare = columns - 1 - len(label) - len(figures) - len(" []")
        width = max(_MIN_BAR_WIDTH, min(width, spare))
    filled = int(fraction * width)
    bar = "#" * filled + "-" * (width - filled)
    return _fit(label, f" [{bar}]{figures}", columns)


def _fit(label: str, rest: str, columns: int | None) -> str:
    """``label + rest``, the label cut with ``…`` (then the rest too) to fit ``columns - 1``."""
    if columns is None or len(label) + len(rest) < columns:
        return label + rest
    room = columns - 1 - len(rest)
    if room >= 2:
        return label[: room - 1] + "…" + rest
    return (label + rest)[: max(0, columns - 1)]


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal behind ``stream`` (80 when it cannot be told)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or _DEFAULT_COLUMNS
    except (AttributeError, ValueError, OSError):
        return _DEFAULT_COLUMNS


class Progress:
    """Counts bytes and redraws a bar; a no-op unless enabled and the stream is a terminal.

    Thread-safe: parallel transfers may call :meth:`update` from several threads.
    """

    def __init__(self, label: str, total: int | None, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.label = display_label(label)
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
        columns = terminal_columns(self._stream)  # asked at each redraw: the window may be resized
        line = format_bar(self.label, self.done, self.total, self._last_draw - self._start, columns=columns)
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


# -- watching a stream -------------------------------------------------------------------------------
Watch = Callable[[str, BinaryIO, "int | None"], AbstractContextManager[BinaryIO]]
"""``watch(label, stream, total)``: a context giving the stream to read instead of ``stream``."""


class ProgressReader(io.RawIOBase):
    """Reads from ``inner`` and reports every byte read to a :class:`Progress` (``inner`` stays open).

    A seekable ``inner`` stays seekable (a store may read a local file ahead, e.g. to hash it, and
    seek back): a seek moves the bar to the new position."""

    def __init__(self, inner: BinaryIO, progress: Progress) -> None:
        super().__init__()
        self._inner = inner
        self._progress = progress

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._inner.seekable()

    def tell(self) -> int:
        return self._inner.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        before = self._inner.tell()
        after = self._inner.seek(offset, whence)
        self._progress.update(after - before)
        return after

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        self._progress.update(len(data))
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        data = self._inner.read(-1 if size is None else size)
        self._progress.update(len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)


def unwatched(label: str, stream: BinaryIO, total: int | None) -> AbstractContextManager[BinaryIO]:
    """The stream as it is: no progress shown."""
    return contextlib.nullcontext(stream)


@contextlib.contextmanager
def stderr_bar(label: str, stream: BinaryIO, total: int | None) -> Iterator[BinaryIO]:
    """A bar on stderr while ``stream`` is read, when stderr is a terminal (else the stream as it is)."""
    with Progress(label, total) as bar:
        yield cast(BinaryIO, ProgressReader(stream, bar)) if bar.shown else stream
