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

Reading is :mod:`cachelib.bundlereader`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

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
