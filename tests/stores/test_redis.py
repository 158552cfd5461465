"""Redis specifics on a real redis-server: layout, TTL, grace period, index upkeep, auth."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cachelib.stores import ObjectChanged, StoreUnavailable, open_store
from cachelib.stores.redisstore import PENDING_SECONDS, RedisStore
from tests.stores.listing import lists_past_one_page
from testsupport.servers import RedisServer, start_redis

pytestmark = pytest.mark.slow  # starts a server

SIZE = 300_000  # 5 chunks of 64 KiB


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis(host=redis_server.host, port=redis_server.port) as raw:
        yield raw


def open_redis(server: RedisServer, **options: str) -> RedisStore:
    store = open_store(server.store_url(chunk="64K", **options))
    assert isinstance(store, RedisStore)
    return store


def chunk_keys(client: redis.Redis, store: RedisStore) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{store.config.prefix}:c:*", count=1000))


def test_layout_manifest_chunks_and_index(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server)
    data = os.urandom(SIZE)
    store.put("a/b", io.BytesIO(data), SIZE)
    manifest = client.hgetall(store.manifest_key("a/b"))
    assert manifest[b"size"] == str(SIZE).encode()
    assert manifest[b"chunks"] == b"5"
    assert manifest[b"chunk_size"] == b"65536"
    upload = manifest[b"upload"].decode()
    chunks = [client.get(store.chunk_key("a/b", upload, i)) for i in range(5)]
    assert b"".join(c or b"" for c in chunks) == data
    assert len(chunk_keys(client, store)) == 5
    assert client.zrange(f"{store.config.prefix}:index", 0, -1) == [b"a/b"]
    assert all(client.ttl(key) == -1 for key in chunk_keys(client, store)), "published chunks must not expire"


def test_ttl_applies_to_manifest_and_chunks(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server, ttl="100")
    store.put("t", io.BytesIO(os.urandom(SIZE)), SIZE)
    assert 95 <= client.ttl(store.manifest_key("t")) <= 100
    assert all(95 <= client.ttl(key) <= 100 for key in chunk_keys(client, store))


def test_expired_object_leaves_the_listing_and_the_index(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server)
    for key in ("x/1", "x/2", "x/3"):
        store.put(key, io.BytesIO(b"v"), 1)
    client.delete(store.manifest_key("x/2"))  # what an expiring TTL does
    assert [i.key for i in store.list("x/")] == ["x/1", "x/3"]
    assert client.zscore(f"{store.config.prefix}:index", "x/2") is None
    assert store.head("x/2") is None


def test_listing_pages_through_a_large_index(redis_server: RedisServer) -> None:
    lists_past_one_page(open_redis(redis_server))


def test_replaced_chunks_get_a_grace_period(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server, grace="30")
    store.put("g", io.BytesIO(b"1" * SIZE), SIZE)
    old = chunk_keys(client, store)
    store.put("g", io.BytesIO(b"2" * SIZE), SIZE)
    assert all(0 < client.ttl(key) <= 30 for key in old)
    store.delete("g")
    assert all(0 < client.ttl(key) <= 30 for key in chunk_keys(client, store))


def test_without_grace_a_racing_reader_fails_cleanly(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server, grace="0", workers="2")  # 4 chunks fetched ahead at most
    size = 64 * 1024 * 20
    store.put("r", io.BytesIO(b"1" * size), size)
    with store.get("r") as stream:
        assert stream.read(10) == b"1" * 10
        store.put("r", io.BytesIO(b"2" * size), size)
        with pytest.raises(ObjectChanged, match="replaced or deleted while being read"):
            stream.read()
    assert len(chunk_keys(client, store)) == 20  # the old version is gone at once


def test_failed_publish_leaves_no_chunks(redis_server: RedisServer, client: redis.Redis) -> None:
    store = open_redis(redis_server)
    store.put("f", io.BytesIO(b"old"), 3)
    before = chunk_keys(client, store)
    with pytest.raises(ValueError, match="announced"):
        store.put("f", io.BytesIO(os.urandom(SIZE)), SIZE + 1)
    assert chunk_keys(client, store) == before
    with store.get("f") as stream:
        assert stream.read() == b"old"


def test_unpublished_chunks_expire(redis_server: RedisServer, client: redis.Redis) -> None:
    """Chunks are written with a pending expiry that the publish script removes."""
    store = open_redis(redis_server)
    seen: list[int] = []
    original = store._publish

    def publish_spy(**kwargs: object) -> object:
        seen.extend(client.ttl(key) for key in chunk_keys(client, store))
        return original(**kwargs)

    store._publish = publish_spy  # type: ignore[assignment]
    store.put("p", io.BytesIO(os.urandom(SIZE)), SIZE)
    assert seen and all(PENDING_SECONDS - 60 < ttl <= PENDING_SECONDS for ttl in seen)
    assert all(client.ttl(key) == -1 for key in chunk_keys(client, store))


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with start_redis(Path(tmp_path_factory.mktemp("redis-auth")), password="s3cret-pw") as server:
        yield server


def test_password_from_the_url(password_server: RedisServer) -> None:
    with open_store(password_server.store_url()) as store:
        store.put("a", io.BytesIO(b"x"), 1)
        assert store.head("a") is not None


def test_password_from_the_environment(password_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPILECACHE_REDIS_PASSWORD", "s3cret-pw")
    url = f"redis://{password_server.host}:{password_server.port}/0?prefix=envpw"
    with open_store(url) as store:
        store.put("a", io.BytesIO(b"x"), 1)
        assert [i.key for i in store.list()] == ["a"]


@pytest.mark.parametrize("auth", ["", ":wrong-pw@"], ids=["no-password", "wrong-password"])
def test_bad_password_is_unavailable_and_masked(password_server: RedisServer, auth: str) -> None:
    url = f"redis://{auth}{password_server.host}:{password_server.port}/0"
    with open_store(url) as store, pytest.raises(StoreUnavailable) as caught:
        store.head("a")
    assert "wrong-pw" not in str(caught.value)


def test_password_from_credentials_wins_over_the_environment(
    password_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPILECACHE_REDIS_PASSWORD", "stale-pw")
    url = f"redis://{password_server.host}:{password_server.port}/0?prefix=credpw"
    with open_store(url, credentials={"COMPILECACHE_REDIS_PASSWORD": "s3cret-pw"}) as store:
        store.put("a", io.BytesIO(b"x"), 1)
        assert store.head("a") is not None
