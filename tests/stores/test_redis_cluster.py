"""The Redis store on a real Redis Cluster: three redis-server primaries on loopback.

Key layout and slots, listing across every primary, the bundle flow through the CLI
(publish, ls, preload, gc), authentication, the wrong kind of server on either side, and a
primary that goes down (clean errors, nothing partial).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cachelib.cli import main
from cachelib.stores import StoreError, StoreUnavailable, open_store
from cachelib.stores.redisstore import RedisStore
from tests.cachelib.helpers import last_json, make_key, make_outdir, run_cli
from tests.stores.listing import lists_past_one_page
from testsupport.servers import RedisCluster, RedisServer, free_port, start_redis_cluster

pytestmark = pytest.mark.slow  # starts servers

SIZE = 300_000  # 5 chunks of 64 KiB


def open_cluster_store(cluster: RedisCluster, **options: str) -> RedisStore:
    store = open_store(cluster.store_url(chunk="64K", **options))
    assert isinstance(store, RedisStore)
    return store


def node_client(node: RedisServer) -> redis.Redis:
    """A plain client of one node (it sees only the keys of that node's slots)."""
    return redis.Redis(host=node.host, port=node.port, password=node.password)


def keys_on(node: RedisServer, pattern: str) -> set[bytes]:
    with node_client(node) as raw:
        return set(raw.scan_iter(match=pattern, count=1000))


def owner(cluster: RedisCluster, name: str) -> RedisServer:
    """The primary that serves ``name``'s slot (asked of the cluster, not computed here)."""
    with node_client(cluster.nodes[0]) as raw:
        slot = int(raw.execute_command("CLUSTER", "KEYSLOT", name))
        for start, end, primary, *_ in raw.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                port = int(primary[1])
                return next(node for node in cluster.nodes if node.port == port)
    raise AssertionError(f"slot {slot} is served by no node")


def spread_keys(cluster: RedisCluster, store: RedisStore, count: int = 3) -> list[str]:
    """Bundle keys of one group (torch 2.0.0, 2.1.0, ...) until every primary holds ``count`` of them."""
    keys: list[str] = []
    held: dict[int, int] = {}
    index = 0
    while len(held) < len(cluster.nodes) or min(held.values()) < count:
        key = str(make_key(torch=f"2.{index}.0"))
        port = owner(cluster, store.manifest_key(key)).port
        held[port] = held.get(port, 0) + 1
        keys.append(key)
        index += 1
    return keys


# -- layout -------------------------------------------------------------------------------------
def test_manifest_and_chunks_share_one_slot(redis_cluster: RedisCluster) -> None:
    store = open_cluster_store(redis_cluster)
    data = os.urandom(SIZE)
    store.put("a/b", io.BytesIO(data), SIZE)
    prefix = store.config.prefix
    manifest = store.manifest_key("a/b")
    assert manifest == f"{prefix}:m:{{a/b}}"
    node = owner(redis_cluster, manifest)
    with node_client(node) as raw:
        fields = raw.hgetall(manifest)
        upload = fields[b"upload"].decode()
        chunks = [store.chunk_key("a/b", upload, i) for i in range(5)]
        assert chunks[0] == f"{prefix}:c:{{a/b}}:{upload}:0"
        slots = {int(raw.execute_command("CLUSTER", "KEYSLOT", name)) for name in [manifest, *chunks]}
        assert len(slots) == 1
        assert b"".join(raw.get(name) or b"" for name in chunks) == data  # all on this node
        assert all(raw.ttl(name) == -1 for name in chunks), "published chunks must not expire"
    for other in redis_cluster.nodes:
        assert not keys_on(other, f"{prefix}:index*"), "a cluster store keeps no index"
        if other is not node:
            assert not keys_on(other, f"{prefix}:*")


def test_listing_gathers_every_primary_in_key_order(redis_cluster: RedisCluster) -> None:
    store = open_cluster_store(redis_cluster)
    keys = spread_keys(redis_cluster, store)
    for key in keys:
        store.put(key, io.BytesIO(key.encode()), len(key))
    store.put("other/x", io.BytesIO(b"x"), 1)
    group = keys[0].rsplit("/", 4)[0] + "/"
    assert [(i.key, i.size) for i in store.list(group)] == [(k, len(k)) for k in sorted(keys)]
    assert [i.key for i in store.list()] == sorted([*keys, "other/x"])
    assert [i.key for i in store.list(keys[1])] == [keys[1]]


def test_listing_pages_through_many_objects(redis_cluster: RedisCluster) -> None:
    lists_past_one_page(open_cluster_store(redis_cluster))


def test_ttl_and_grace_on_the_object_slot(redis_cluster: RedisCluster) -> None:
    store = open_cluster_store(redis_cluster, ttl="100", grace="30")
    store.put("t", io.BytesIO(os.urandom(SIZE)), SIZE)
    node = owner(redis_cluster, store.manifest_key("t"))
    with node_client(node) as raw:
        assert 95 <= raw.ttl(store.manifest_key("t")) <= 100
        first = keys_on(node, f"{store.config.prefix}:c:*")
        assert len(first) == 5 and all(95 <= raw.ttl(name) <= 100 for name in first)
        store.put("t", io.BytesIO(os.urandom(SIZE)), SIZE)
        assert all(0 < raw.ttl(name) <= 30 for name in first)  # the replaced version's grace
    assert store.delete("t") is True and store.head("t") is None


# -- the bundle flow --------------------------------------------------------------------------------
def test_publish_ls_preload_gc_across_the_cluster(redis_cluster: RedisCluster, tmp_path: Path) -> None:
    url = redis_cluster.store_url(chunk="64K")
    keys = [make_key(torch=f"2.{minor}.0") for minor in range(8, 14)] + [make_key(name="other")]
    for index, key in enumerate(keys):
        assert main(["publish", str(make_outdir(tmp_path / f"out{index}", key)), "--store", url]) == 0
    with open_store(url) as store:
        assert isinstance(store, RedisStore)
        holders = {owner(redis_cluster, store.manifest_key(str(key))).port for key in keys}
    assert len(holders) > 1, "the bundles should span primaries for this test to mean anything"

    listed = run_cli("ls", "--store", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(line)["key"] for line in listed.stdout.splitlines()) == sorted(map(str, keys))

    newest = make_key(torch="2.13.0")
    target = tmp_path / "cache"
    first = run_cli("preload", "--store", url, "--key", str(newest), "--target", str(target))
    assert first.returncode == 0, first.stderr
    assert (last_json(first.stdout)["result"], last_json(first.stdout)["source"]) == ("hit", "store")
    assert (target / "fxgraph/ab/fabc/entry").read_bytes() == b"graph" * 100

    pruned = run_cli("gc", "--store", url, "--keep", "1")
    assert pruned.returncode == 0, pruned.stderr
    with open_store(url) as store:
        assert sorted(i.key for i in store.list()) == sorted([str(newest), str(make_key(name="other"))])


def test_more_seeds_when_the_first_does_not_answer(redis_cluster: RedisCluster) -> None:
    nodes = ",".join(f"{node.host}:{node.port}" for node in redis_cluster.nodes[1:])
    url = f"redis-cluster://127.0.0.1:{free_port()}?prefix=seeds&retries=0&nodes={nodes}"
    with open_store(url) as store:
        store.put("a", io.BytesIO(b"x"), 1)
        assert [i.key for i in store.list()] == ["a"]
    with open_store(url.split("&nodes=")[0]) as store, pytest.raises(StoreUnavailable, match="cannot be connected"):
        store.head("a")


# -- the wrong kind of server, authentication -----------------------------------------------------
def test_cluster_url_at_a_standalone_server(redis_server: RedisServer) -> None:
    url = f"redis-cluster://{redis_server.host}:{redis_server.port}?prefix=wrongkind"
    with open_store(url) as store:  # opening does no I/O
        with pytest.raises(StoreError, match=r"not a Redis Cluster.*use a redis:// or rediss:// URL") as caught:
            store.put("a", io.BytesIO(b"x"), 1)
        assert not isinstance(caught.value, StoreUnavailable)
        with pytest.raises(StoreError, match="not a Redis Cluster"):
            list(store.list())
    with node_client(redis_server) as raw:
        assert not list(raw.scan_iter(match="wrongkind:*"))


def test_standalone_url_at_a_cluster_node(redis_cluster: RedisCluster) -> None:
    node = redis_cluster.nodes[0]
    url = f"redis://{node.host}:{node.port}/0?prefix=wrongkind"
    with open_store(url) as store:
        with pytest.raises(StoreError, match=r"is a Redis Cluster node .*use a redis-cluster://"):
            for index in range(20):  # some keys hash to this node's slots, the publish script never fits
                store.put(f"k{index}", io.BytesIO(b"x"), 1)
        with pytest.raises(StoreError, match="redis-cluster://"):
            for index in range(20):
                store.head(f"k{index}")


@pytest.fixture(scope="module")
def password_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with start_redis_cluster(tmp_path_factory.mktemp("cluster-auth"), password="s3cret-pw") as cluster:
        yield cluster


def test_password_from_the_url_and_the_environment(
    password_cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(password_cluster.store_url()) as store:
        store.put("a", io.BytesIO(b"x"), 1)
        assert [i.key for i in store.list()] == ["a"]
    monkeypatch.setenv("COMPILECACHE_REDIS_PASSWORD", "s3cret-pw")
    seed = password_cluster.nodes[1]
    with open_store(f"redis-cluster://{seed.host}:{seed.port}?prefix=envpw") as store:
        store.put("b", io.BytesIO(b"y"), 1)
        assert store.head("b") is not None


@pytest.mark.parametrize("auth", ["", ":wrong-pw@"], ids=["no-password", "wrong-password"])
def test_bad_password_is_unavailable_and_masked(password_cluster: RedisCluster, auth: str) -> None:
    seed = password_cluster.nodes[0]
    url = f"redis-cluster://{auth}{seed.host}:{seed.port}?retries=0"
    with open_store(url) as store, pytest.raises(StoreUnavailable) as caught:
        store.head("a")
    assert "wrong-pw" not in str(caught.value)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with start_redis_cluster(tmp_path_factory.mktemp("cluster-tls"), password="tls-pw", tls=True) as cluster:
        yield cluster


def test_tls_and_password(tls_cluster: RedisCluster) -> None:
    """rediss-cluster:// with the CA in ``ca=``: every node the client discovers is reached over TLS."""
    assert tls_cluster.url.startswith("rediss-cluster://:tls-pw@")
    store = open_cluster_store(tls_cluster)
    keys = spread_keys(tls_cluster, store, count=1)
    for key in keys:
        store.put(key, io.BytesIO(os.urandom(SIZE)), SIZE)
    assert [i.key for i in store.list()] == sorted(keys)
    with store.get(keys[-1]) as stream:
        assert len(stream.read()) == SIZE
    untrusted = tls_cluster.store_url().replace(f"ca={tls_cluster.ca}", "ca=/etc/ssl/certs/ca-certificates.crt")
    with open_store(untrusted + "&retries=0") as other, pytest.raises(StoreUnavailable, match="certificate"):
        other.head(keys[0])


# -- a primary goes down ---------------------------------------------------------------------------
def test_a_primary_down_fails_cleanly_and_leaves_nothing_partial(tmp_path: Path) -> None:
    with start_redis_cluster(tmp_path / "cluster") as cluster:
        url = cluster.store_url(chunk="64K", retries="1", timeout="2")
        with open_store(url) as store:
            assert isinstance(store, RedisStore)
            keys = spread_keys(cluster, store, count=2)
            for key in keys:
                store.put(key, io.BytesIO(os.urandom(SIZE)), SIZE)
            down = cluster.nodes[2]  # not the seed of the URL
            gone = [key for key in keys if owner(cluster, store.manifest_key(key)) is down]
            fresh = next(f"new/k{i}" for i in range(1000) if owner(cluster, store.manifest_key(f"new/k{i}")) is down)
            survivors = [node for node in cluster.nodes if node is not down]
            before = {node.port: keys_on(node, "*") for node in survivors}

            down.process.kill()
            down.process.wait()

            with pytest.raises(StoreUnavailable):
                store.head(gone[0])
            with pytest.raises(StoreUnavailable), store.get(gone[0]) as stream:
                stream.read()
            with pytest.raises(StoreUnavailable):
                store.put(fresh, io.BytesIO(os.urandom(SIZE)), SIZE)
            with pytest.raises(StoreUnavailable):
                list(store.list())  # never a listing of the primaries that answered
            pruned = run_cli("gc", "--store", url, "--keep", "1")
            assert pruned.returncode == 1 and f"connecting to {down.host}:{down.port}" in pruned.stderr, pruned.stderr
        assert {node.port: keys_on(node, "*") for node in survivors} == before
