"""Streams shared by the backends: ordered parallel fetch, exact-size reads."""

from __future__ import annotations

import hashlib
import io
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO, cast

from cachelib.stores.base import SizeMismatch


class OrderedFetchStream(io.RawIOBase):
    """A read-only stream over pieces ``0..count-1`` fetched in parallel, delivered in order.

    ``fetch(i)`` returns piece ``i`` (and raises when it cannot). At most ``window`` pieces
    are fetched ahead of the reader, so memory stays below ``(window + 1)`` pieces whatever
    the object's size. Fetching starts at the first read. An error raised by ``fetch``
    surfaces from the read that reaches that piece.
    """

    def __init__(
        self,
        fetch: Callable[[int], bytes],
        count: int,
        *,
        workers: int,
        window: int,
        name: str = "fetch",
        size: int | None = None,
    ) -> None:
        super().__init__()
        self.size = size
        """The object's size in bytes, when the store said it (a progress bar's total)."""
        self._fetch = fetch
        self._count = count
        self._workers = max(1, workers)
        self._window = max(1, window)
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future[bytes]] = deque()
        self._submitted = 0
        self._piece: memoryview = memoryview(b"")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def _submit_ahead(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=max(1, min(self._workers, self._count)), thread_name_prefix=self._name
            )
        while len(self._pending) < self._window and self._submitted < self._count:
            self._pending.append(self._pool.submit(self._fetch, self._submitted))
            self._submitted += 1

    def _next_piece(self) -> bool:
        """Make the next piece current; ``False`` at the end of the object."""
        if self.closed:
            raise ValueError("read from a closed stream")
        self._submit_ahead()
        if not self._pending:
            return False
        piece = self._pending.popleft().result()
        self._submit_ahead()
        self._piece = memoryview(piece)
        self._pos = 0
        return True

    def _take(self, limit: int) -> memoryview | None:
        """Up to ``limit`` bytes of the current piece (fetching the next when it is used up)."""
        while self._pos >= len(self._piece):
            if not self._next_piece():
                return None
        chunk = self._piece[self._pos : self._pos + limit]
        self._pos += len(chunk)
        return chunk

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        target = memoryview(buffer).cast("B")
        chunk = self._take(len(target))
        if chunk is None:
            return 0
        target[: len(chunk)] = chunk
        return len(chunk)

    def read(self, size: int | None = -1) -> bytes:
        """Exactly ``size`` bytes unless the object ends first (all of the rest for ``-1``)."""
        if size is None or size < 0:
            return self.readall()
        parts: list[memoryview] = []
        wanted = size
        while wanted > 0:
            chunk = self._take(wanted)
            if chunk is None:
                break
            parts.append(chunk)
            wanted -= len(chunk)
        if len(parts) == 1 and len(parts[0]) == len(parts[0].obj):  # type: ignore[arg-type]
            return cast(bytes, parts[0].obj)  # a whole piece: hand it over without a copy
        return b"".join(parts)

    def readall(self) -> bytes:
        parts: list[memoryview] = []
        while (chunk := self._take(1 << 62)) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            for future in self._pending:
                future.cancel()
            self._pending.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._piece = memoryview(b"")
        super().close()


def as_binary(stream: io.RawIOBase) -> BinaryIO:
    """View one of the streams above through the ``BinaryIO`` interface the stores return."""
    return cast(BinaryIO, stream)


def stream_size(stream: BinaryIO) -> int | None:
    """The size of what a store's ``get`` returned, when known without a request: a stream above
    that was told it, or a regular file; else None."""
    size = getattr(stream, "size", None)
    if isinstance(size, int):
        return size
    try:
        info = os.fstat(stream.fileno())
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def read_pieces(
    stream: BinaryIO, piece_size: int, expected: int | None, describe: str, digest: Any | None = None
) -> Iterator[bytes]:
    """Yield ``stream`` in pieces of exactly ``piece_size`` bytes (the last may be shorter).

    When ``expected`` is given, a stream that ends early or runs past it raises
    :class:`SizeMismatch` before the piece that proves it is yielded. ``digest`` (a hashlib
    object) is updated with every piece.
    """
    total = 0
    while True:
        piece = read_exactly(stream, piece_size)
        if not piece:
            break
        total += len(piece)
        if digest is not None:
            digest.update(piece)
        if expected is not None and total > expected:
            raise SizeMismatch(f"{describe}: the stream holds more than the announced {expected} bytes")
        yield piece
        if len(piece) < piece_size:
            break
    if expected is not None and total != expected:
        raise SizeMismatch(f"{describe}: the stream ended after {total} of the announced {expected} bytes")


def seekable_sha256(stream: BinaryIO, chunk: int = 1024 * 1024) -> str | None:
    """The sha256 of what is left in ``stream`` when it can seek back (a local file), read ahead of an
    upload whose metadata must be given before its data; None for a stream that cannot."""
    try:
        if not stream.seekable():
            return None
        start = stream.tell()
    except (AttributeError, OSError, ValueError):
        return None
    digest = hashlib.sha256()
    while data := stream.read(chunk):
        digest.update(data)
    stream.seek(start)
    return digest.hexdigest()


def read_exactly(stream: BinaryIO, n: int) -> bytes:
    """Read ``n`` bytes, fewer only at the end of the stream (raw streams may return short reads)."""
    first = stream.read(n)
    if len(first) == n or not first:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        more = stream.read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
