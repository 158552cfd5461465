"""Reading a bundle (:mod:`cachelib.bundle`'s format v1) as a stream: its header, then each part, checked.

Reading streams: parts are decompressed and hashed as they are read; the digests are
compared when a part has been read to its end (:meth:`PartStream.verify`). Consumers
that write anything (the unpacker) write into a staging area and install only after
``verify`` passed.

A reader may bound the compression ratio (``max_ratio``): a part whose header announces more
than ``max_ratio`` uncompressed bytes per stored byte is refused before any of it is
decompressed, and while a part streams, its output may not run ahead of ``max_ratio`` times
the stored bytes consumed so far (plus :data:`cachelib.bundle.RATIO_SLACK`), so a header that lies about
its stored size cannot make a small stream inflate without bound either.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, cast

import zstandard

from cachelib.bundle import (
    CHUNK,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_BYTES,
    PREAMBLE,
    RATIO_SLACK,
    BadMagic,
    BundleError,
    BundleHeader,
    CorruptHeader,
    CorruptPart,
    DigestMismatch,
    PartInfo,
    RatioExceeded,
    TruncatedBundle,
    UnsupportedVersion,
    check_ratio,
)

PREFETCH_DEPTH = 8
"""Chunks (of :data:`cachelib.bundle.CHUNK` bytes) a prefetching reader may hold ahead of its consumer."""



def _read_exactly(stream: BinaryIO, size: int, what: str) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            got = size - remaining
            raise TruncatedBundle(f"bundle ends in the {what}: expected {size} bytes, got {got}")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_header(stream: BinaryIO) -> BundleHeader:
    """Read and validate the preamble and header; the stream is left at the start of the data."""
    first = stream.read(len(MAGIC))
    if first != MAGIC[: len(first)]:
        raise BadMagic(f"not a compilecache bundle: starts with {first[:8]!r}, expected {MAGIC!r}")
    rest = _read_exactly(stream, PREAMBLE.size - len(first), "preamble") if len(first) < PREAMBLE.size else b""
    magic, version, length = PREAMBLE.unpack(first + rest)
    if magic != MAGIC:
        raise BadMagic(f"not a compilecache bundle: starts with {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(
            f"bundle format version {version} is not supported (this reader knows {FORMAT_VERSION})"
        )
    if length > MAX_HEADER_BYTES:
        raise CorruptHeader(f"header length {length} exceeds the limit of {MAX_HEADER_BYTES} bytes")
    raw = _read_exactly(stream, length, "header")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptHeader(f"header is not valid JSON: {exc}") from None
    return BundleHeader.from_dict(data)


class _StoredReader:
    """Reads exactly ``part.stored_size`` bytes of one part from the bundle stream, hashing them."""

    def __init__(self, stream: BinaryIO, part: PartInfo) -> None:
        self.stream = stream
        self.part = part
        self.remaining = part.stored_size
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        if self.remaining == 0:
            return b""
        want = self.remaining if size < 0 else min(size, self.remaining)
        data = self.stream.read(want)
        if not data:
            got = self.part.stored_size - self.remaining
            raise TruncatedBundle(
                f"bundle ends in part {self.part.name!r}: {got} of {self.part.stored_size} stored bytes present"
            )
        self.remaining -= len(data)
        self.hash.update(data)
        return data

    @property
    def consumed(self) -> int:
        """Stored bytes handed to the consumer so far."""
        return self.part.stored_size - self.remaining

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

    def check(self) -> None:
        self.drain()
        if self.hash.hexdigest() != self.part.stored_sha256:
            raise DigestMismatch(
                f"part {self.part.name!r}: stored bytes have sha256 {self.hash.hexdigest()}, "
                f"header field 'stored_sha256' says {self.part.stored_sha256}"
            )


class _PrefetchingStoredReader(_StoredReader):
    """A :class:`_StoredReader` that fetches and hashes a few chunks ahead in a background thread,
    so that the network or disk and sha256 work while the consumer decompresses and writes."""

    def __init__(self, stream: BinaryIO, part: PartInfo, depth: int = PREFETCH_DEPTH) -> None:
        super().__init__(stream, part)
        self._queue: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._pending = b""
        self._done = False
        self._handed = 0
        self._thread = threading.Thread(target=self._fetch, name=f"bundle-prefetch-{part.name}", daemon=True)
        self._thread.start()

    def _fetch(self) -> None:
        try:
            while not self._stop.is_set():
                data = super().read(CHUNK)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1) -> bytes:
        if not self._pending and not self._done:
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._done = True
                raise item
            self._pending = item
            self._done = not item
        if size < 0 or size >= len(self._pending):
            data, self._pending = self._pending, b""
        else:
            data, self._pending = self._pending[:size], self._pending[size:]
        self._handed += len(data)
        return data

    @property
    def consumed(self) -> int:
        return self._handed

    def drain(self) -> None:
        while self.read(CHUNK):
            pass
        self._thread.join()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class PartStream:
    """The uncompressed bytes of one part, read as a stream; :meth:`verify` checks sizes and digests.

    ``verify_content=False`` skips the sha256 of the uncompressed bytes: they are a
    deterministic function of the stored bytes, whose sha256 is always checked (and zstd
    checks its own content checksum). ``prefetch`` reads and hashes the stored bytes in a
    background thread.
    """

    def __init__(
        self,
        stream: BinaryIO,
        part: PartInfo,
        *,
        verify_content: bool = True,
        prefetch: bool = False,
        max_ratio: float | None = None,
    ) -> None:
        check_ratio(part, max_ratio)
        self.part = part
        self.max_ratio = max_ratio
        self._stored = _PrefetchingStoredReader(stream, part) if prefetch else _StoredReader(stream, part)
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            cast(IO[bytes], self._stored), read_size=CHUNK, closefd=False
        )
        self._hash = hashlib.sha256() if verify_content else None
        self.count = 0
        self.verified = False

    def close(self) -> None:
        """Stop any background fetch (the stream is not closed: it belongs to the caller)."""
        if isinstance(self._stored, _PrefetchingStoredReader):
            self._stored.close()

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._reader.read(size) if size >= 0 else self._reader.readall()
        except zstandard.ZstdError as exc:
            raise CorruptPart(f"part {self.part.name!r}: zstd cannot decompress it: {exc}") from None
        self.count += len(data)
        if self.count > self.part.size:
            raise CorruptPart(
                f"part {self.part.name!r}: decompresses to more than its header field 'size' {self.part.size}"
            )
        if self.max_ratio is not None and self.count > self.max_ratio * self._stored.consumed + RATIO_SLACK:
            raise RatioExceeded(
                f"part {self.part.name!r}: {self._stored.consumed} stored bytes have inflated to {self.count} "
                f"so far, over the limit of {self.max_ratio:g} per byte (--max-ratio)"
            )
        if self._hash is not None:
            self._hash.update(data)
        return data

    def readable(self) -> bool:
        return True

    def verify(self) -> None:
        """Read what is left, then compare sizes and sha256 digests with the header."""
        while self.read(CHUNK):
            pass
        self._stored.check()
        if self.count != self.part.size:
            raise CorruptPart(
                f"part {self.part.name!r}: decompressed {self.count} bytes, header field 'size' says {self.part.size}"
            )
        if self._hash is not None and self._hash.hexdigest() != self.part.sha256:
            raise DigestMismatch(
                f"part {self.part.name!r}: uncompressed bytes have sha256 {self._hash.hexdigest()}, "
                f"header field 'sha256' says {self.part.sha256}"
            )
        self.verified = True


class _HashingReader:
    """Reads from ``stream`` while hashing what passes (the preamble and header of a bundle)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.hash = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.hash.update(data)
        return data


def read_header_and_digest(stream: BinaryIO) -> tuple[BundleHeader, str]:
    """The header, and the bundle digest: the sha256 of the preamble and header bytes. The header
    holds every part's sha256 (stored and uncompressed), so this digest stands for the whole bundle
    once each part has been verified against the header; it is what a bundle signature covers."""
    hashing = _HashingReader(stream)
    header = read_header(cast(BinaryIO, hashing))
    return header, hashing.hash.hexdigest()


class BundleReader:
    """Sequential reader of a bundle stream: the header, then parts in order."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.header, self.digest = read_header_and_digest(stream)
        """``digest``: see :func:`read_header_and_digest`."""
        self._next = 0

    @contextmanager
    def open_part(
        self, name: str, *, verify_content: bool = True, prefetch: bool = False, max_ratio: float | None = None
    ) -> Iterator[PartStream]:
        """The uncompressed stream of part ``name``, verified when the block ends without error.

        Parts before it are skipped (their stored digests still checked); parts must be
        opened in file order. ``verify_content``, ``prefetch`` and ``max_ratio``: see
        :class:`PartStream`.
        """
        index = self.header.parts.index(self.header.part(name))
        if index < self._next:
            raise ValueError(f"part {name!r} was already passed; open parts in file order")
        for skipped in self.header.parts[self._next : index]:
            _StoredReader(self.stream, skipped).check()
        self._next = index + 1
        part = PartStream(
            self.stream, self.header.parts[index], verify_content=verify_content, prefetch=prefetch, max_ratio=max_ratio
        )
        try:
            yield part
            if not part.verified:
                part.verify()
        finally:
            part.close()

    def read_part(self, name: str, limit: int | None = None, max_ratio: float | None = None) -> bytes:
        """The whole verified part in memory (for small parts such as the Mega-Cache)."""
        size = self.header.part(name).size
        if limit is not None and size > limit:
            raise BundleError(f"part {name!r} is {size} bytes, over the limit of {limit}")
        with self.open_part(name, max_ratio=max_ratio) as part:
            data = part.read()
        return data

    def verify_all(self) -> None:
        """Read and verify every part."""
        for part in self.header.parts[self._next :]:
            with self.open_part(part.name):
                pass


def verify_bundle_file(path: Path) -> BundleHeader:
    """Read a whole bundle file and verify every part; its header."""
    with open(path, "rb") as stream:
        reader = BundleReader(stream)
        reader.verify_all()
        trailing = stream.read(1)
    if trailing:
        raise CorruptHeader(f"{path}: bytes after the last part (the header's parts do not cover the file)")
    return reader.header


def read_header_file(path: Path) -> BundleHeader:
    with open(path, "rb") as stream:
        return read_header(stream)


def bundle_digest_file(path: Path) -> str:
    """The bundle digest of a bundle file (see :func:`read_header_and_digest`)."""
    with open(path, "rb") as stream:
        return read_header_and_digest(stream)[1]
