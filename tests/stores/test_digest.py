"""Every backend records the sha256 of what it published, with the object itself (real servers).

The preloader compares it with a node cache's completed-bundle marker before it fetches: the
digest must belong to exactly the bytes a reader would get.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import pytest
import redis

from cachelib.stores import StoreUnavailable, open_store
from cachelib.stores.filestore import SHA256_XATTR
from testsupport.servers import RedisServer, S3Server, start_redis

BIG = 11 * 1024 * 1024 + 5  # three 5 MiB S3 parts


class OneWay(io.RawIOBase):
    """A stream that cannot seek (a pipe)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        return self._data.readinto(buffer)


@pytest.mark.parametrize("size", [0, 1000, BIG])
def test_put_records_the_sha256_and_head_returns_it(store_url: str, size: int) -> None:
    data = os.urandom(size)
    options = "&part=5M" if store_url.startswith("s3://") else ""
    with open_store(store_url + options) as store:
        info = store.put("a/b", io.BytesIO(data), size)
        assert info.sha256 == hashlib.sha256(data).hexdigest()
        head = store.head("a/b")
        assert head is not None and head.sha256 == info.sha256
        store.put("a/b", OneWay(b"replaced"))  # a re-publish replaces the digest with the object
        head = store.head("a/b")
        assert head is not None and head.sha256 == hashlib.sha256(b"replaced").hexdigest()


def test_file_store_keeps_the_digest_on_the_object_file(tmp_path: Path) -> None:
    with open_store(f"file://{tmp_path}") as store:
        store.put("k", io.BytesIO(b"x"), 1)
    assert os.getxattr(tmp_path / "k", SHA256_XATTR).decode() == hashlib.sha256(b"x").hexdigest()
    os.removexattr(tmp_path / "k", SHA256_XATTR)  # an object published before digests were recorded
    with open_store(f"file://{tmp_path}") as store:
        head = store.head("k")
    assert head is not None and head.sha256 is None


@pytest.mark.slow
def test_s3_multipart_from_a_stream_that_cannot_seek_records_none(s3_server: S3Server) -> None:
    with open_store(s3_server.new_bucket(part="5M")) as store:
        info = store.put("k", OneWay(os.urandom(BIG)), BIG)
    assert info.sha256 is None and info.size == BIG


@pytest.mark.slow
def test_redis_object_published_before_digests_reads_as_none(redis_server: RedisServer) -> None:
    url = redis_server.store_url()
    with open_store(url) as store:
        store.put("k", io.BytesIO(b"x"), 1)
    prefix = url.split("prefix=")[1]
    with redis.Redis(host=redis_server.host, port=redis_server.port) as client:
        client.hdel(f"{prefix}:m:k", "sha256")
    with open_store(url) as store:
        head = store.head("k")
    assert head is not None and head.sha256 is None


@pytest.mark.slow
def test_a_refused_password_is_not_retried(tmp_path: Path) -> None:
    """A wrong password fails at once, however many retries the URL allows: one connection."""
    with (
        start_redis(tmp_path / "redis", password="right-pw") as server,
        redis.Redis(host=server.host, port=server.port, password="right-pw") as admin,
    ):
        before = int(admin.info("stats")["total_connections_received"])
        url = f"redis://:wrong-pw@{server.host}:{server.port}/0?retries=5"
        started = time.monotonic()
        with open_store(url) as store, pytest.raises(StoreUnavailable, match="invalid username-password"):
            store.head("k")
        assert time.monotonic() - started < 2
        after = int(admin.info("stats")["total_connections_received"])
    assert after - before == 1
