"""One behaviour suite, run against every backend on real servers (file, redis-server, moto S3).

It runs on a three-primary Redis Cluster on loopback too (``redis-cluster``).

The stores are opened with small pieces (64 KiB Redis chunks; 5 MiB S3 parts and 256 KiB
ranges) so that a 6 MiB object spans many chunks, parts and ranges.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator

import pytest

from cachelib.keyformat import CacheKey
from cachelib.progress import stderr_bar
from cachelib.stores import (
    InvalidObjectKey,
    NotFound,
    ObjectChanged,
    SizeMismatch,
    Store,
    open_store,
)
from testsupport.servers import STORE_KINDS, fresh_store_url, store_params

SMALL_PIECES = {
    "file": {},
    "redis": {"chunk": "64K"},
    "redis-cluster": {"chunk": "64K"},
    "s3": {"part": "5M", "range": "256K"},
}
BIG = 6 * 1024 * 1024 + 123
"""More than one S3 part, ~97 Redis chunks, 25 S3 ranges."""
KEY = str(
    CacheKey(
        namespace="team",
        name="llm",
        model="0123456789abcdef",
        options="fedcba9876543210",
        gpu="nvidia-h100-80gb-hbm3",
        capability="sm90",
        torch="2.13.0",
        triton="3.6.0",
        cuda="12.8",
        py="3.11",
    )
)


@pytest.fixture(params=store_params((*STORE_KINDS, "redis-cluster")))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(kind: str, request: pytest.FixtureRequest) -> Iterator[Store]:
    with open_store(fresh_store_url(kind, request, **SMALL_PIECES[kind])) as opened:
        yield opened


def read_all(store: Store, key: str, piece: int = 100_000) -> bytes:
    out = bytearray()
    with store.get(key) as stream:
        while chunk := stream.read(piece):
            out += chunk
    return bytes(out)


def pattern(version: int, size: int) -> bytes:
    """A version's content: one byte value throughout, distinct per version."""
    return bytes([version % 256]) * size


class Failing(io.RawIOBase):
    """A source stream that breaks after ``good`` bytes (a publisher's disk or network failing)."""

    def __init__(self, good: int) -> None:
        self.left = good

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        if self.left <= 0:
            raise OSError("source broke")
        n = min(len(buffer), self.left)
        buffer[:n] = b"x" * n
        self.left -= n
        return n


# -- round trips --------------------------------------------------------------------------------
def test_small_object_round_trips(store: Store) -> None:
    info = store.put("a/b", io.BytesIO(b"hello"), 5)
    assert (info.key, info.size) == ("a/b", 5)
    assert read_all(store, "a/b") == b"hello"


@pytest.mark.parametrize("announce", [True, False], ids=["size-known", "size-unknown"])
def test_multi_chunk_object_round_trips(store: Store, announce: bool) -> None:
    data = os.urandom(BIG)
    info = store.put(KEY, io.BytesIO(data), len(data) if announce else None)
    assert info.size == len(data)
    assert read_all(store, KEY) == data
    with store.get(KEY) as stream:
        assert stream.read() == data


def test_reads_of_any_size_reassemble_the_object(store: Store) -> None:
    data = os.urandom(300_001)
    store.put("k", io.BytesIO(data), len(data))
    for piece in (1, 4095, 65536, 65537, 1 << 20):
        with store.get("k") as stream:
            head = stream.read(piece)
            rest = stream.read()
        assert head + rest == data, piece


def test_empty_object_round_trips(store: Store) -> None:
    assert store.put("empty", io.BytesIO(b""), 0).size == 0
    assert read_all(store, "empty") == b""
    assert store.head("empty") is not None


def test_default_store_url_round_trips_a_large_object(store_url: str) -> None:
    data = os.urandom(9 * 1024 * 1024)
    with open_store(store_url) as store:
        store.put(KEY, io.BytesIO(data), len(data))
        assert read_all(store, KEY, 1 << 20) == data


# -- head / list / delete -----------------------------------------------------------------------
def test_head_reports_size_and_publish_time(store: Store) -> None:
    assert store.head("x/y") is None
    before = time.time()
    store.put("x/y", io.BytesIO(b"12345"), 5)
    info = store.head("x/y")
    assert info is not None
    assert info.size == 5
    assert before - 2 <= info.modified <= time.time() + 2  # S3 keeps whole seconds


def test_list_by_prefix_in_key_order(store: Store) -> None:
    keys = [
        "cc1/ns/name/b",
        "cc1/ns/name/a",
        "cc1/ns/name-2/a",
        "cc1/ns/other/z",
        "cc1/ns2/name/a",
        "zz",
        "a-b/x",
        "a/b",
    ]
    for key in keys:
        store.put(key, io.BytesIO(key.encode()), len(key))
    assert [i.key for i in store.list()] == sorted(keys)
    assert [i.key for i in store.list("")] == sorted(keys)
    assert [i.key for i in store.list("cc1/ns/")] == [
        "cc1/ns/name-2/a",
        "cc1/ns/name/a",
        "cc1/ns/name/b",
        "cc1/ns/other/z",
    ]
    assert [i.key for i in store.list("cc1/ns/name/")] == ["cc1/ns/name/a", "cc1/ns/name/b"]
    assert [i.key for i in store.list("cc1/ns/na")] == ["cc1/ns/name-2/a", "cc1/ns/name/a", "cc1/ns/name/b"]
    assert [i.key for i in store.list("cc1/ns/name/a")] == ["cc1/ns/name/a"]
    assert list(store.list("nothing/")) == []
    sizes = {i.key: i.size for i in store.list()}
    assert sizes == {k: len(k) for k in keys}


def test_delete(store: Store) -> None:
    store.put("d/1", io.BytesIO(b"one"), 3)
    store.put("d/2", io.BytesIO(b"two"), 3)
    assert store.delete("d/1") is True
    assert store.delete("d/1") is False
    assert store.head("d/1") is None
    with pytest.raises(NotFound):
        store.get("d/1")
    assert [i.key for i in store.list("d/")] == ["d/2"]
    assert store.delete("never/was") is False


def test_overwrite_replaces_the_object(store: Store) -> None:
    store.put(KEY, io.BytesIO(pattern(1, BIG)), BIG)
    store.put(KEY, io.BytesIO(b"short"), 5)
    assert read_all(store, KEY) == b"short"
    assert [(i.key, i.size) for i in store.list()] == [(KEY, 5)]


def test_missing_object_is_not_found_naming_the_key(store: Store) -> None:
    with pytest.raises(NotFound, match="no/such"):
        store.get("no/such")


# -- bad input: nothing half-written ------------------------------------------------------------
@pytest.mark.parametrize("key", ["", "../x", "a/../b", "/abs", "a//b", "a/", ".hidden", "a/.tmp", "sp ace", "a\\b"])
def test_invalid_keys_are_refused(store: Store, key: str) -> None:
    with pytest.raises(InvalidObjectKey):
        store.put(key, io.BytesIO(b"x"), 1)
    for call in (store.get, store.head, store.delete):
        with pytest.raises(InvalidObjectKey):
            call(key)
    assert list(store.list()) == []


@pytest.mark.parametrize("actual", [BIG - 1, BIG + 1], ids=["short", "long"])
def test_stream_not_matching_the_announced_size_publishes_nothing(store: Store, actual: int) -> None:
    store.put("k", io.BytesIO(b"old"), 3)
    with pytest.raises(SizeMismatch, match=str(BIG)):
        store.put("k", io.BytesIO(os.urandom(actual)), BIG)
    assert read_all(store, "k") == b"old"
    assert [i.key for i in store.list()] == ["k"]


def test_failing_source_publishes_nothing(store: Store) -> None:
    with pytest.raises(OSError, match="source broke"):
        store.put("k", io.BufferedReader(Failing(BIG - 1000)), BIG)
    assert store.head("k") is None
    assert list(store.list()) == []


# -- atomicity ------------------------------------------------------------------------------------
def test_concurrent_readers_see_one_whole_version(store: Store) -> None:
    """Readers racing re-publishes get one version's bytes or ObjectChanged, never a mix."""
    size = 700_000  # 11 Redis chunks, 3 S3 ranges
    store.put("race", io.BytesIO(pattern(0, size)), size)
    stop = threading.Event()
    seen: dict[int, int] = {}
    failures: list[str] = []
    changed = 0
    lock = threading.Lock()

    def publish() -> None:
        version = 1
        while not stop.is_set():
            store.put("race", io.BytesIO(pattern(version, size)), size)
            version += 1

    def read() -> None:
        nonlocal changed
        while not stop.is_set():
            try:
                data = read_all(store, "race", piece=8192)
            except ObjectChanged:
                with lock:
                    changed += 1
                continue
            with lock:
                if len(data) != size or data != data[:1] * size:
                    failures.append(f"{len(data)} bytes, values {sorted(set(data))[:5]}")
                else:
                    seen[data[0]] = seen.get(data[0], 0) + 1

    threads = [threading.Thread(target=publish)] + [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert sum(seen.values()) >= 3
    assert len(seen) >= 2, f"readers saw only versions {sorted(seen)} (and {changed} clean failures)"
    print(f"versions read whole: {len(seen)}, reads: {sum(seen.values())}, clean failures: {changed}")


def test_reader_keeps_its_version_across_a_republish(store: Store, kind: str) -> None:
    """File and Redis readers finish the version they opened (open inode; chunks kept for a
    grace period); an S3 reader's later ranges are refused by If-Match: ObjectChanged."""
    store.put(KEY, io.BytesIO(pattern(1, BIG)), BIG)
    with store.get(KEY) as stream:
        first = stream.read(1000)
        store.put(KEY, io.BytesIO(pattern(2, BIG)), BIG)
        if kind == "s3":
            with pytest.raises(ObjectChanged, match="replaced or deleted"):
                stream.read()
        else:
            assert first + stream.read() == pattern(1, BIG)
    assert read_all(store, KEY) == pattern(2, BIG)


def test_reader_of_a_deleted_object_finishes_or_fails_cleanly(store: Store) -> None:
    store.put(KEY, io.BytesIO(pattern(3, BIG)), BIG)
    with store.get(KEY) as stream:
        first = stream.read(1000)
        store.delete(KEY)
        try:
            rest = stream.read()
        except ObjectChanged:
            return
    assert first + rest == pattern(3, BIG)


# -- progress --------------------------------------------------------------------------------------
def test_progress_is_silent_without_a_terminal(store: Store, capfd: pytest.CaptureFixture[str]) -> None:
    data = os.urandom(200_000)
    with stderr_bar("put p", io.BytesIO(data), len(data)) as watched:
        store.put("p", watched, len(data))
    with store.get("p") as stream, stderr_bar("get p", stream, len(data)) as watched:
        assert watched.read() == data
    assert capfd.readouterr().err == ""
