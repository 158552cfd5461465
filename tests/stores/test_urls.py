"""Store URL parsing: what each form means, and a clear error for each kind of bad URL."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.stores import (
    FileStoreURL,
    RedisStoreURL,
    S3StoreURL,
    StoreURLError,
    mask_url,
    open_store,
    parse_store_url,
    resolve_environment,
)
from cachelib.stores.urls import REDIS_DEFAULT_CHUNK, S3_DEFAULT_RANGE
from cachelib.units import parse_size


def test_file_url() -> None:
    assert parse_store_url("file:///var/cache/cc/") == FileStoreURL(root="/var/cache/cc")
    assert parse_store_url("file://localhost/srv/x") == FileStoreURL(root="/srv/x")
    assert parse_store_url("FILE:///a%20b") == FileStoreURL(root="/a b")


def test_redis_url_defaults() -> None:
    assert parse_store_url("redis://cache.svc") == RedisStoreURL(host="cache.svc")
    config = parse_store_url("redis://cache.svc:6380/3")
    assert isinstance(config, RedisStoreURL)
    assert (config.port, config.db, config.tls, config.chunk, config.ttl) == (6380, 3, False, REDIS_DEFAULT_CHUNK, None)


def test_redis_url_with_everything() -> None:
    config = parse_store_url(
        "rediss://me:p%40ss@10.0.0.5:6390/2?prefix=cc:prod&ttl=86400&chunk=8M&workers=8&grace=30"
        "&timeout=2.5&retries=0&ca=/etc/ca.pem"
    )
    assert config == RedisStoreURL(
        host="10.0.0.5",
        port=6390,
        db=2,
        tls=True,
        username="me",
        password="p@ss",
        prefix="cc:prod",
        ttl=86400,
        chunk=8 * 1024 * 1024,
        workers=8,
        grace=30,
        timeout=2.5,
        retries=0,
        ca="/etc/ca.pem",
    )


def test_redis_cluster_urls() -> None:
    assert parse_store_url("redis-cluster://node-0.cache.svc") == RedisStoreURL(host="node-0.cache.svc", cluster=True)
    config = parse_store_url("rediss-cluster://app:pw@clustercfg.example.com:6379/0?prefix=cc&ca=/etc/ca.pem&ttl=60")
    assert config == RedisStoreURL(
        host="clustercfg.example.com",
        port=6379,
        tls=True,
        username="app",
        password="pw",
        prefix="cc",
        ttl=60,
        ca="/etc/ca.pem",
        cluster=True,
    )
    assert parse_store_url("REDIS-CLUSTER://h:7000/") == RedisStoreURL(host="h", port=7000, cluster=True)
    seeded = parse_store_url("redis-cluster://h:7000?nodes=n1:7001,[fd00::2]:7002")
    assert isinstance(seeded, RedisStoreURL) and seeded.nodes == (("n1", 7001), ("fd00::2", 7002))


def test_s3_url() -> None:
    assert parse_store_url("s3://my-bucket") == S3StoreURL(bucket="my-bucket")
    config = parse_store_url(
        "s3://my.bucket/caches/prod/?endpoint=http://127.0.0.1:9000&region=eu-west-1&part=64M&range=16M"
        "&workers=16&timeout=5&retries=1&addressing=path"
    )
    assert config == S3StoreURL(
        bucket="my.bucket",
        prefix="caches/prod",
        endpoint="http://127.0.0.1:9000",
        region="eu-west-1",
        part=64 * 1024 * 1024,
        range=16 * 1024 * 1024,
        workers=16,
        timeout=5.0,
        retries=1,
        addressing="path",
    )
    assert S3StoreURL(bucket="b").range == S3_DEFAULT_RANGE


@pytest.mark.parametrize(
    ("text", "value"), [("123", 123), ("64K", 65536), ("4M", 4 << 20), ("4MiB", 4 << 20), ("1g", 1 << 30)]
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text, what="chunk") == value


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        (
            "/var/cache",
            "no scheme; accepted schemes: file://, redis://, rediss://, redis-cluster://, rediss-cluster://, s3://",
        ),
        (
            "ftp://host/x",
            "scheme 'ftp'; accepted schemes: file://, redis://, rediss://, redis-cluster://, rediss-cluster://, s3://",
        ),
        ("file://relative/path", "absolute path"),
        ("file:relative", "absolute path"),
        ("file:///x?ttl=3", "take no options"),
        ("redis://", "no host"),
        ("redis://host:99999", "port"),
        ("redis://host:port", "port"),
        ("redis://host/zero", "database number"),
        ("redis://host/0?size=3", "unknown option 'size'; accepted: prefix, ttl, chunk"),
        ("redis://host/0?ca=/x.pem", "unknown option 'ca'"),
        ("redis://host/0?ttl=1&ttl=2", "given twice"),
        ("redis://host/0?ttl=0", "ttl=0 must be at least 1"),
        ("redis://host/0?ttl=soon", "ttl='soon' is not a whole number"),
        ("redis://host/0?chunk=100", "chunk=100 must be from 1K to 512M"),
        ("redis://host/0?chunk=1T", "chunk='1T' is not a size"),
        ("redis://host/0?workers=0", "workers=0 must be from 1 to 64"),
        ("redis://host/0?timeout=-1", "timeout=-1 must be more than 0"),
        ("redis://host/0?timeout=x", "not a number of seconds"),
        ("redis://host/0?prefix=", "prefix='' must be non-empty"),
        ("redis://host/0?prefix=a%20b", "prefix='a b'"),
        ("redis-cluster://host:7000/1", "Redis Cluster has only database 0, got /1"),
        ("redis-cluster://:7000", "no host"),
        ("redis-cluster://host?ca=/x.pem", "unknown option 'ca'"),
        ("redis://host?nodes=a:1", "unknown option 'nodes'"),
        ("redis-cluster://host?nodes=a", "nodes: 'a' is not host:port"),
        ("redis-cluster://host?nodes=a:1,,b:2", "nodes: '' is not host:port"),
        ("redis-cluster://host?nodes=a:99999", "nodes: 'a:99999': the port '99999' is not a port number from 1 to"),
        ("s3://", "no bucket"),
        ("s3://Bad_Bucket/x", "bucket 'Bad_Bucket' is not a valid S3 bucket name"),
        ("s3://ab", "not a valid S3 bucket name"),
        ("s3://bucket/a//b", "prefix segment ''"),
        ("s3://bucket/../b", "prefix segment '..'"),
        ("s3://bucket?endpoint=ftp://x", "endpoint='ftp://x' must be an http:// or https:// URL"),
        ("s3://bucket?part=1M", "part=1M must be from 5M to 5G"),
        ("s3://bucket?addressing=dns", "addressing='dns' must be one of auto, path, virtual"),
        ("s3://bucket?chunk=4M", "unknown option 'chunk'; accepted: endpoint, region"),
    ],
)
def test_bad_urls_name_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(StoreURLError) as caught:
        parse_store_url(url)
    assert message in str(caught.value)
    if url:
        assert repr(url) in str(caught.value) or repr(mask_url(url)) in str(caught.value)
    with pytest.raises(StoreURLError):
        open_store(url)


def test_errors_and_shown_urls_mask_the_password() -> None:
    url = "redis://user:hunter2@host:6379/0?chunk=nope"
    with pytest.raises(StoreURLError) as caught:
        parse_store_url(url)
    assert "hunter2" not in str(caught.value)
    assert "redis://***@host:6379/0?chunk=nope" in str(caught.value)
    assert mask_url("redis://:hunter2@host/0") == "redis://***@host/0"
    assert mask_url("redis://host/0") == "redis://host/0"
    with open_store("redis://:hunter2@127.0.0.1:1/0") as store:
        assert "hunter2" not in store.url


def test_environment_fills_the_redis_password_and_the_s3_endpoint() -> None:
    env = {
        "COMPILECACHE_REDIS_PASSWORD": "pw",
        "AWS_ENDPOINT_URL": "http://generic",
        "AWS_ENDPOINT_URL_S3": "http://s3",
    }
    redis_config = resolve_environment(parse_store_url("redis://h/0"), env)
    assert isinstance(redis_config, RedisStoreURL) and redis_config.password == "pw"
    given = resolve_environment(parse_store_url("redis://:url@h/0"), env)
    assert isinstance(given, RedisStoreURL) and given.password == "url"
    s3_config = resolve_environment(parse_store_url("s3://bucket"), env)
    assert isinstance(s3_config, S3StoreURL) and s3_config.endpoint == "http://s3"
    generic = resolve_environment(parse_store_url("s3://bucket"), {"AWS_ENDPOINT_URL": "http://generic"})
    assert isinstance(generic, S3StoreURL) and generic.endpoint == "http://generic"
    explicit = resolve_environment(parse_store_url("s3://bucket?endpoint=http://url"), env)
    assert isinstance(explicit, S3StoreURL) and explicit.endpoint == "http://url"


BAD_PORTS = st.one_of(st.integers(1, 5).map(lambda n: "0" * n), st.integers(65536, 10**12).map(str),
                      st.integers(65536, 99999).map(lambda p: f"000{p}"))
PORT_PLACES = ["redis://h:{port}/0", "rediss://[fe80::1]:{port}/0", "redis-cluster://h:{port}",
               "redis-cluster://h:7000?nodes=a:7001,b:{port}", "s3://bucket/p?endpoint=http://minio:{port}",
               "s3://bucket/p?endpoint=https://[::1]:{port}/&region=x"]


@settings(max_examples=120, deadline=None)
@given(place=st.sampled_from(PORT_PLACES), port=BAD_PORTS)
def test_a_port_outside_1_to_65535_is_refused_wherever_it_stands(place: str, port: str) -> None:
    """Port 0 is no port anything listens on, and one past 65535 none at all: the store could never be reached."""
    with pytest.raises(StoreURLError, match=rf"port '{port[:16]}' is not a port number from 1 to 65535"):
        parse_store_url(place.format(port=port))
    parse_store_url(place.format(port="0" + "6379"))  # a leading zero alone is fine
