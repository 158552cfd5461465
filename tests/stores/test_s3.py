"""S3 specifics against moto's server: multipart layout, abort on failure, endpoint from the environment."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from cachelib.stores import StoreUnavailable, open_store
from cachelib.stores.s3store import S3Store, plan_part_size
from cachelib.units import MiB
from testsupport.servers import S3Server

pytestmark = pytest.mark.slow  # starts a server

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BIG = 11 * MiB + 5  # three 5 MiB parts


def raw_client(server: S3Server) -> S3Client:
    return boto3.client("s3", endpoint_url=server.endpoint)


def bucket_of(url: str) -> str:
    return urlsplit(url).netloc


def test_part_size_plan() -> None:
    assert plan_part_size(None) == 16 * MiB
    assert plan_part_size(1) == 8 * MiB
    assert plan_part_size(80_000 * MiB) == 8 * MiB
    assert plan_part_size(80_001 * MiB) == 9 * MiB  # still at most 10,000 parts
    assert plan_part_size(10**15) == 5 * 1024 * MiB


def test_large_object_goes_up_in_parts_small_in_one_put(s3_server: S3Server) -> None:
    url = s3_server.new_bucket(part="5M")
    client = raw_client(s3_server)
    with open_store(url) as store:
        data = os.urandom(BIG)
        store.put("big", io.BytesIO(data), len(data))
        store.put("small", io.BytesIO(b"tiny"), 4)
        head = client.head_object(Bucket=bucket_of(url), Key="prefix/big")
        assert head["ETag"].strip('"').endswith("-3")
        assert "-" not in client.head_object(Bucket=bucket_of(url), Key="prefix/small")["ETag"]
        with store.get("big") as stream:
            assert stream.read() == data


def test_failed_upload_is_aborted_and_invisible(s3_server: S3Server) -> None:
    url = s3_server.new_bucket(part="5M")
    client = raw_client(s3_server)
    with open_store(url) as store:
        with pytest.raises(ValueError, match="announced"):
            store.put("big", io.BytesIO(os.urandom(BIG)), BIG + 1)
        assert store.head("big") is None
        assert list(store.list()) == []
    uploads = client.list_multipart_uploads(Bucket=bucket_of(url))
    assert uploads.get("Uploads", []) == []


def test_objects_outside_the_prefix_are_not_listed(s3_server: S3Server) -> None:
    url = s3_server.new_bucket(prefix="team/caches")
    client = raw_client(s3_server)
    client.put_object(Bucket=bucket_of(url), Key="team/other", Body=b"x")
    client.put_object(Bucket=bucket_of(url), Key="team/caches/.marker", Body=b"x")
    with open_store(url) as store:
        store.put("cc1/a", io.BytesIO(b"1"), 1)
        assert [i.key for i in store.list()] == ["cc1/a"]
    assert client.get_object(Bucket=bucket_of(url), Key="team/caches/cc1/a")["Body"].read() == b"1"


def test_endpoint_from_the_environment(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3_server.new_bucket()
    endpoint = parse_qs(urlsplit(url).query)["endpoint"][0]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    with open_store(url.split("?")[0]) as store:
        assert isinstance(store, S3Store) and store.endpoint == endpoint
        store.put("k", io.BytesIO(b"via env"), 7)
        with store.get("k") as stream:
            assert stream.read() == b"via env"


def test_missing_bucket_is_unavailable(s3_server: S3Server) -> None:
    with open_store(f"s3://no-such-bucket-here/p?endpoint={s3_server.endpoint}") as store:
        with pytest.raises(StoreUnavailable, match="NoSuchBucket"):
            store.put("k", io.BytesIO(b"x"), 1)
        with pytest.raises(StoreUnavailable, match="NoSuchBucket"):
            list(store.list())
