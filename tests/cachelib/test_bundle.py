"""Bundle format v1: streaming round trip and one distinct error for each way a bundle can be bad."""

from __future__ import annotations

import io
import json
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from cachelib.bundle import (
    CACHEDIR_PART,
    MAGIC,
    MEGACACHE_PART,
    PREAMBLE,
    BadMagic,
    CorruptHeader,
    CorruptPart,
    DigestMismatch,
    HashingWriter,
    MissingPart,
    TruncatedBundle,
    UnsupportedCodec,
    UnsupportedVersion,
    write_bundle,
    write_bundle_file,
)
from cachelib.bundlereader import BundleReader, read_header, verify_bundle_file
from tests.cachelib.helpers import make_key

CACHEDIR_BYTES = b"tar-like payload " * 5000
MEGACACHE_BYTES = os.urandom(10_000)


class OneWay:
    """A stream that only reads forward (like a network response): no seek, no tell."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._inner.read(size)


def _producer(data: bytes) -> Any:
    def produce(sink: HashingWriter) -> None:
        for start in range(0, len(data), 4096):
            sink.write(data[start : start + 4096])

    return produce


def build(cachedir: bytes = CACHEDIR_BYTES, megacache: bytes = MEGACACHE_BYTES) -> bytes:
    out = io.BytesIO()
    write_bundle(
        out,
        key=make_key(),
        parts=[(CACHEDIR_PART, _producer(cachedir)), (MEGACACHE_PART, _producer(megacache))],
        versions={"torch": "2.13.0+cu128", "python": "3.11.7"},
        created="2026-01-01T00:00:00+00:00",
        producer="test",
        job_id="compilecache-team-a.llama",
        result={"compile_seconds": 1.0},
    )
    return out.getvalue()


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    _, _, length = PREAMBLE.unpack(data[: PREAMBLE.size])
    header = json.loads(data[PREAMBLE.size : PREAMBLE.size + length])
    return header, data[PREAMBLE.size + length :]


def join(header: dict[str, Any], body: bytes, version: int = 1) -> bytes:
    encoded = json.dumps(header).encode()
    return PREAMBLE.pack(MAGIC, version, len(encoded)) + encoded + body


def read_all(data: bytes, prefetch: bool = False) -> dict[str, bytes]:
    reader = BundleReader(OneWay(data))  # type: ignore[arg-type]
    parts = {}
    for part in reader.header.parts:
        with reader.open_part(part.name, prefetch=prefetch) as stream:
            parts[part.name] = stream.read()
    return parts


# -- round trip ---------------------------------------------------------------------------------
def test_round_trip_through_a_forward_only_stream() -> None:
    data = build()
    assert data.startswith(MAGIC + struct.pack(">H", 1))
    parts = read_all(data)
    assert parts == {CACHEDIR_PART: CACHEDIR_BYTES, MEGACACHE_PART: MEGACACHE_BYTES}
    header = read_header(OneWay(data))  # type: ignore[arg-type]
    assert header.key == make_key()
    assert header.job_id == "compilecache-team-a.llama"
    assert [p.name for p in header.parts] == [CACHEDIR_PART, MEGACACHE_PART]
    cachedir = header.part(CACHEDIR_PART)
    assert cachedir.size == len(CACHEDIR_BYTES)
    assert cachedir.stored_size < cachedir.size  # compressed
    assert header.part(MEGACACHE_PART).offset == cachedir.stored_size


def test_header_carries_key_as_string_and_fields() -> None:
    header, _ = split(build())
    assert header["format"] == 1
    assert header["key"] == str(make_key())
    assert header["key_fields"] == make_key().to_dict()
    for field in ("versions", "created", "producer", "job_id", "result", "parts"):
        assert field in header
    assert set(header["parts"][0]) == {"name", "codec", "size", "stored_size", "offset", "sha256", "stored_sha256"}


def test_reading_a_later_part_skips_the_earlier_one() -> None:
    reader = BundleReader(OneWay(build()))  # type: ignore[arg-type]
    assert reader.read_part(MEGACACHE_PART) == MEGACACHE_BYTES
    with pytest.raises(ValueError, match="file order"), reader.open_part(CACHEDIR_PART):
        pass


def test_empty_part_round_trips() -> None:
    assert read_all(build(megacache=b""))[MEGACACHE_PART] == b""


def test_file_written_atomically_and_verified(tmp_path: Path) -> None:
    path = tmp_path / "b.ccb"
    written = write_bundle_file(
        path,
        key=make_key(),
        parts=[(CACHEDIR_PART, _producer(b"abc")), (MEGACACHE_PART, _producer(b""))],
        versions={},
        created="now",
        producer="test",
        job_id="",
        result={},
    )
    assert path.stat().st_size == written.bytes
    assert verify_bundle_file(path).key == make_key()
    assert [p.name for p in tmp_path.iterdir()] == ["b.ccb"]  # no partial or spool files left


def test_writing_and_reading_stream_in_bounded_memory(tmp_path: Path) -> None:
    """A 48 MiB incompressible part never sits in memory as a whole, writing or reading."""
    size, block = 48 * 1024 * 1024, os.urandom(1024 * 1024)

    def produce(sink: HashingWriter) -> None:
        for _ in range(size // len(block)):
            sink.write(block)

    path = tmp_path / "big.ccb"
    tracemalloc.start()
    try:
        write_bundle_file(path, key=make_key(), parts=[(CACHEDIR_PART, produce)], versions={}, created="now",
                          producer="test", job_id="", result={})  # fmt: skip
        _, write_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with open(path, "rb") as stream:
            reader = BundleReader(stream)
            with reader.open_part(CACHEDIR_PART) as part:
                total = 0
                while chunk := part.read(1024 * 1024):
                    total += len(chunk)
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == size
    assert write_peak < 12 * 1024 * 1024, write_peak
    assert read_peak < 12 * 1024 * 1024, read_peak


# -- rejections ---------------------------------------------------------------------------------
def test_bad_magic() -> None:
    data = build()
    with pytest.raises(BadMagic, match="not a compilecache bundle"):
        read_all(b"PK\x03\x04" + data[4:])


def test_unknown_format_version() -> None:
    header, body = split(build())
    with pytest.raises(UnsupportedVersion, match="version 2"):
        read_all(join(header, body, version=2))


@pytest.mark.parametrize(
    ("cut", "where"),
    [(0, "preamble"), (5, "preamble"), (PREAMBLE.size + 10, "header"), (-100, MEGACACHE_PART)],
)
def test_truncated(cut: int, where: str) -> None:
    data = build()
    if cut == -100:
        header, _ = split(data)
        cut = len(data) - header["parts"][1]["stored_size"] // 2  # inside the megacache part
    with pytest.raises(TruncatedBundle, match=where):
        read_all(data[:cut])


def test_truncated_inside_the_first_part() -> None:
    data = build()
    header, body = split(data)
    cut = len(data) - len(body) + header["parts"][0]["stored_size"] // 2
    with pytest.raises(TruncatedBundle, match=CACHEDIR_PART):
        read_all(data[:cut])


def test_corrupt_part_is_a_zstd_error() -> None:
    header, body = split(build())
    damaged = bytearray(body)
    middle = header["parts"][0]["stored_size"] // 2
    damaged[middle : middle + 16] = bytes(16)
    with pytest.raises(CorruptPart, match=f"part '{CACHEDIR_PART}'.*zstd"):
        read_all(join(header, bytes(damaged)))


@pytest.mark.parametrize("field", ["sha256", "stored_sha256"])
def test_digest_mismatch_names_part_and_field(field: str) -> None:
    header, body = split(build())
    header["parts"][1][field] = "0" * 64
    with pytest.raises(DigestMismatch, match=f"'{MEGACACHE_PART}'.*'{field}'"):
        read_all(join(header, body))


def test_size_mismatch_is_corrupt_part() -> None:
    header, body = split(build())
    header["parts"][1]["size"] += 1
    with pytest.raises(CorruptPart, match="'size'"):
        read_all(join(header, body))


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda h: h.pop("job_id"), CorruptHeader, "job_id"),
        (lambda h: h.update(key="cc1/x"), CorruptHeader, "'key'"),
        (lambda h: h.update(key_fields={**h["key_fields"], "gpu": "cpu"}), CorruptHeader, "disagree"),
        (lambda h: h["parts"][0].update(offset=7), CorruptHeader, "offset"),
        (lambda h: h["parts"][0].update(sha256="xyz"), CorruptHeader, "sha256"),
        (lambda h: h["parts"][1].update(codec="lz4"), UnsupportedCodec, "lz4"),
        (lambda h: h.update(format=2), CorruptHeader, "format"),
    ],
)
def test_bad_header_fields(change: Any, error: type[Exception], match: str) -> None:
    header, body = split(build())
    change(header)
    with pytest.raises(error, match=match):
        read_all(join(header, body))


def test_header_not_json() -> None:
    garbage = b"{not json"
    with pytest.raises(CorruptHeader, match="JSON"):
        read_all(PREAMBLE.pack(MAGIC, 1, len(garbage)) + garbage)


def test_missing_part() -> None:
    reader = BundleReader(OneWay(build()))  # type: ignore[arg-type]
    with pytest.raises(MissingPart, match="'extra'"):
        reader.read_part("extra")


def test_trailing_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.ccb"
    path.write_bytes(build() + b"junk")
    with pytest.raises(CorruptHeader, match="after the last part"):
        verify_bundle_file(path)


def test_errors_are_distinct_classes() -> None:
    classes = {BadMagic, UnsupportedVersion, TruncatedBundle, CorruptHeader, CorruptPart, DigestMismatch}
    for cls in classes:
        assert not any(issubclass(cls, other) for other in classes - {cls})


# -- the preloader's fast path: background fetch, stored digest only ------------------------------
def test_prefetching_reader_round_trips_and_reports_the_same_errors() -> None:
    assert read_all(build(), prefetch=True) == read_all(build())
    data = build()
    header, body = split(data)
    with pytest.raises(TruncatedBundle, match=CACHEDIR_PART):
        read_all(data[: len(data) - len(body) + header["parts"][0]["stored_size"] // 2], prefetch=True)
    header["parts"][0]["stored_sha256"] = "0" * 64
    with pytest.raises(DigestMismatch, match="stored_sha256"):
        read_all(join(header, body), prefetch=True)


def test_content_digest_can_be_left_to_the_stored_digest() -> None:
    header, body = split(build())
    header["parts"][0]["sha256"] = "0" * 64
    reader = BundleReader(OneWay(join(header, body)))  # type: ignore[arg-type]
    with reader.open_part(CACHEDIR_PART, verify_content=False, prefetch=True) as part:
        assert part.read() == CACHEDIR_BYTES
    with pytest.raises(DigestMismatch, match="'sha256'"):
        read_all(join(header, body))


def test_consumer_stopping_early_stops_the_prefetch_thread() -> None:
    import threading

    big = os.urandom(24 * 1024 * 1024)
    reader = BundleReader(OneWay(build(cachedir=big)))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="consumer gave up"), reader.open_part(CACHEDIR_PART, prefetch=True) as part:
        part.read(1024)
        raise RuntimeError("consumer gave up")
    assert not [t for t in threading.enumerate() if t.name.startswith("bundle-prefetch-")]
