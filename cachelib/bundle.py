"""Bundle format v1: one file that carries everything a warm start needs.

Layout (all integers big-endian)::

    offset 0   8 bytes   magic b"CCBUNDLE"
    offset 8   u16       format version (1)
    offset 10  u32       header length N
    offset 14  N bytes   header: UTF-8 JSON
    offset 14+N          data: the stored (zstd-compressed) parts, back to back

Each part entry in the header gives ``name``, ``codec`` (``zstd``), ``size`` and
``sha256`` of the uncompressed bytes, ``stored_size`` and ``stored_sha256`` of the bytes
in the file, and ``offset`` from the start of the data section. Parts are contiguous, in
header order, so a reader that cannot seek (a network stream) reads them one after the
other. v1 bundles carry ``cachedir`` (a tar of the ``TORCHINDUCTOR_CACHE_DIR``) first,
because preloading reads only that part, then ``megacache`` (the bytes of
``torch.compiler.save_cache_artifacts()``).

Writing streams: the header precedes the parts but holds their sizes and digests, so the
writer first compresses each part into a temporary file (hashing the uncompressed and the
stored bytes as they pass), then writes preamble, header and the parts. Memory stays at a
few buffers whatever the bundle size; temporary disk is one compressed copy.

Reading streams too: parts are decompressed and hashed as they are read; the digests are
compared when a part has been read to its end (:meth:`PartStream.verify`). Consumers
that write anything (the unpacker) write into a staging area and install only after
``verify`` passed.

A reader may bound the compression ratio (``max_ratio``): a part whose header announces more
than ``max_ratio`` uncompressed bytes per stored byte is refused before any of it is
decompressed, and while a part streams, its output may not run ahead of ``max_ratio`` times
the stored bytes consumed so far (plus :data:`RATIO_SLACK`), so a header that lies about
its stored size cannot make a small stream inflate without bound either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import zstandard

from cachelib.keyformat import CacheKey, InvalidKey

MAGIC = b"CCBUNDLE"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct(">8sHI")
MAX_HEADER_BYTES = 16 * 1024 * 1024
CODEC = "zstd"
CACHEDIR_PART = "cachedir"
MEGACACHE_PART = "megacache"
CHUNK = 1024 * 1024
DEFAULT_LEVEL = 3
PREFETCH_DEPTH = 8
"""Chunks (of CHUNK bytes) a prefetching reader may hold ahead of its consumer."""

RATIO_SLACK = 64 * 1024 * 1024
"""Output a part may produce beyond ``max_ratio`` x its stored bytes read so far, for local
bursts (a run of zeros) in a part whose overall ratio is within the limit."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BundleError(ValueError):
    """A bundle that cannot be used; subclasses say why and the message names the part or field."""


class BadMagic(BundleError):
    """The file does not start with the bundle magic: not a compilecache bundle."""


class UnsupportedVersion(BundleError):
    """A bundle format version this reader does not know."""


class TruncatedBundle(BundleError):
    """The file ends before the header or a part does."""


class CorruptHeader(BundleError):
    """The header is not valid JSON or misses / contradicts a field."""


class UnsupportedCodec(BundleError):
    """A part compressed with a codec this reader does not know."""


class CorruptPart(BundleError):
    """A part's stored bytes do not decompress (zstd error) or decompress to the wrong size."""


class DigestMismatch(BundleError):
    """A part's bytes do not match the sha256 recorded in the header."""


class MissingPart(BundleError):
    """The bundle has no part of the requested name."""


class RatioExceeded(BundleError):
    """A part inflates by more than the allowed compression ratio (a decompression bomb)."""


def check_ratio(part: PartInfo, max_ratio: float | None) -> None:
    """Refuse a part whose header announces more than ``max_ratio`` bytes per stored byte (and more than
    :data:`RATIO_SLACK` bytes in all)."""
    if max_ratio is None or part.size <= RATIO_SLACK:
        return  # small parts cannot bomb anyone (an empty tar alone is 10 KiB stored in a few bytes)
    ratio = part.size / max(part.stored_size, 1)
    if ratio > max_ratio:
        raise RatioExceeded(
            f"part {part.name!r}: {part.stored_size} stored bytes inflate to {part.size} "
            f"(ratio {ratio:.0f}), over the limit of {max_ratio:g} (--max-ratio)"
        )


@dataclass(frozen=True)
class PartInfo:
    name: str
    codec: str
    size: int
    stored_size: int
    offset: int
    sha256: str
    stored_sha256: str


@dataclass(frozen=True)
class BundleHeader:
    key: CacheKey
    versions: dict[str, str]
    created: str
    producer: str
    job_id: str
    result: dict[str, Any]
    parts: tuple[PartInfo, ...]
    format: int = FORMAT_VERSION

    def part(self, name: str) -> PartInfo:
        for part in self.parts:
            if part.name == name:
                return part
        raise MissingPart(f"bundle {self.key}: no part {name!r} (has {', '.join(p.name for p in self.parts)})")

    @property
    def stored_size(self) -> int:
        return sum(p.stored_size for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "key": str(self.key),
            "key_fields": self.key.to_dict(),
            "versions": dict(self.versions),
            "created": self.created,
            "producer": self.producer,
            "job_id": self.job_id,
            "result": self.result,
            "parts": [asdict(p) for p in self.parts],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: Any) -> BundleHeader:
        """Validate a decoded header; :class:`CorruptHeader` names the first bad field."""
        if not isinstance(data, dict):
            raise CorruptHeader(f"header: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_VERSION:
            raise CorruptHeader(f"header field 'format': expected {FORMAT_VERSION}, got {data.get('format')!r}")
        for name, kind in _HEADER_FIELDS:
            _field(data, name, kind)
        try:
            key = CacheKey.parse(data["key"])
            fields_key = CacheKey.from_dict(data["key_fields"])
        except InvalidKey as exc:
            raise CorruptHeader(f"header field 'key': {exc}") from None
        if key != fields_key:
            raise CorruptHeader(f"header fields 'key' and 'key_fields' disagree: {key} vs {fields_key}")
        parts = _parse_parts(data["parts"])
        versions = {str(k): str(v) for k, v in data["versions"].items()}
        return cls(key, versions, data["created"], data["producer"], data["job_id"], data["result"], parts)


_HEADER_FIELDS: tuple[tuple[str, type], ...] = (
    ("key", str),
    ("key_fields", dict),
    ("versions", dict),
    ("created", str),
    ("producer", str),
    ("job_id", str),
    ("result", dict),
    ("parts", list),
)


def _field(data: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in data:
        raise CorruptHeader(f"header field {name!r} is missing")
    if not isinstance(data[name], kind):
        raise CorruptHeader(f"header field {name!r}: expected {kind.__name__}, got {type(data[name]).__name__}")
    return data[name]


def _parse_parts(raw: list[Any]) -> tuple[PartInfo, ...]:
    parts: list[PartInfo] = []
    offset = 0
    for index, entry in enumerate(raw):
        where = f"header parts[{index}]"
        if not isinstance(entry, dict):
            raise CorruptHeader(f"{where}: expected an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise CorruptHeader(f"{where} field 'name' is missing")
        where = f"header part {name!r}"
        if any(p.name == name for p in parts):
            raise CorruptHeader(f"{where}: appears twice")
        if entry.get("codec") != CODEC:
            raise UnsupportedCodec(f"{where}: codec {entry.get('codec')!r} is not supported (only {CODEC!r})")
        for number in ("size", "stored_size", "offset"):
            value = entry.get(number)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CorruptHeader(f"{where} field {number!r}: expected a non-negative integer, got {value!r}")
        for digest in ("sha256", "stored_sha256"):
            if not isinstance(entry.get(digest), str) or not _SHA256.match(entry[digest]):
                raise CorruptHeader(f"{where} field {digest!r}: expected 64 hex digits")
        if entry["offset"] != offset:
            raise CorruptHeader(
                f"{where} field 'offset': expected {offset} (parts are contiguous), got {entry['offset']}"
            )
        offset += entry["stored_size"]
        parts.append(
            PartInfo(
                name,
                CODEC,
                entry["size"],
                entry["stored_size"],
                entry["offset"],
                entry["sha256"],
                entry["stored_sha256"],
            )
        )
    return tuple(parts)


# -- hashing stream wrappers -----------------------------------------------------------------
class HashingWriter:
    """Forwards writes to ``sink`` while counting and hashing them."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.hash = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.hash.update(data)
        self.count += len(data)
        self.sink.write(data)
        return len(data)

    def flush(self) -> None:
        self.sink.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return False


# -- writing ---------------------------------------------------------------------------------
PartProducer = Callable[[HashingWriter], None]
"""Writes a part's uncompressed bytes into the given writer."""


@dataclass(frozen=True)
class WrittenBundle:
    header: BundleHeader
    bytes: int
    sha256: str
    """Digest of the whole bundle file."""


@dataclass
class _Spooled:
    name: str
    spool: IO[bytes]
    size: int = 0
    stored_size: int = 0
    sha256: str = ""
    stored_sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def compress_part(name: str, produce: PartProducer, spool: IO[bytes], level: int = DEFAULT_LEVEL) -> _Spooled:
    """Stream ``produce``'s output through zstd into ``spool``, hashing both sides."""
    stored = HashingWriter(spool)
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=True, threads=-1)
    with compressor.stream_writer(stored, closefd=False) as zwriter:  # type: ignore[arg-type]
        raw = HashingWriter(zwriter)
        produce(raw)
    return _Spooled(name, spool, raw.count, stored.count, raw.hash.hexdigest(), stored.hash.hexdigest())


def write_bundle(
    out: IO[bytes],
    *,
    key: CacheKey,
    parts: Sequence[tuple[str, PartProducer]],
    versions: Mapping[str, str],
    created: str,
    producer: str,
    job_id: str,
    result: Mapping[str, Any],
    level: int = DEFAULT_LEVEL,
    tmpdir: Path | None = None,
) -> WrittenBundle:
    """Write a v1 bundle to ``out`` (which need not seek); parts are spooled to temporary files first."""
    with contextlib.ExitStack() as spools:
        spooled = [
            compress_part(
                name,
                produce,
                spools.enter_context(tempfile.TemporaryFile(dir=tmpdir, prefix=f"compilecache-{name}-")),
                level,
            )
            for name, produce in parts
        ]
        infos: list[PartInfo] = []
        offset = 0
        for s in spooled:
            infos.append(PartInfo(s.name, CODEC, s.size, s.stored_size, offset, s.sha256, s.stored_sha256))
            offset += s.stored_size
        header = BundleHeader(key, dict(versions), created, producer, job_id, dict(result), tuple(infos))
        encoded = header.to_json()
        sink = HashingWriter(out)
        sink.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(encoded)))
        sink.write(encoded)
        for s in spooled:
            s.spool.seek(0)
            shutil.copyfileobj(s.spool, sink, CHUNK)
        sink.flush()
        return WrittenBundle(header, sink.count, sink.hash.hexdigest())


def write_bundle_file(path: Path, **kwargs: Any) -> WrittenBundle:
    """:func:`write_bundle` into ``path`` atomically: a partial file is renamed into place when complete."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "wb") as out:
            written = write_bundle(out, tmpdir=kwargs.pop("tmpdir", None) or path.parent, **kwargs)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return written


# -- reading ---------------------------------------------------------------------------------
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
