"""Stores: where bundles live. ``open_store(url)`` picks the backend by the URL's scheme.

- ``file:///path`` — files under a directory (the embedded default);
- ``redis://host:port/db`` and ``rediss://`` — chunked values, an index for listing;
- ``s3://bucket/prefix`` — S3 or an S3-compatible server (``?endpoint=``).

The Redis and S3 client libraries are imported only when such a store is opened
(extras ``compilecache[redis]`` and ``compilecache[s3]``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from cachelib.stores.base import (
    InvalidObjectKey,
    NotFound,
    ObjectChanged,
    ObjectInfo,
    SizeMismatch,
    Store,
    StoreError,
    StoreUnavailable,
    StoreURLError,
    check_key,
)
from cachelib.stores.urls import (
    ACCEPTED_SCHEMES,
    FileStoreURL,
    RedisStoreURL,
    S3StoreURL,
    StoreURL,
    mask_url,
    parse_store_url,
)

REDIS_PASSWORD_ENV = "COMPILECACHE_REDIS_PASSWORD"
S3_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")

__all__ = [
    "ACCEPTED_SCHEMES",
    "REDIS_PASSWORD_ENV",
    "FileStoreURL",
    "InvalidObjectKey",
    "NotFound",
    "ObjectChanged",
    "ObjectInfo",
    "RedisStoreURL",
    "S3StoreURL",
    "SizeMismatch",
    "Store",
    "StoreError",
    "StoreURL",
    "StoreURLError",
    "StoreUnavailable",
    "check_key",
    "mask_url",
    "open_store",
    "parse_store_url",
    "resolve_environment",
]


def resolve_environment(config: StoreURL, env: Mapping[str, str]) -> StoreURL:
    """Fill in what the URL leaves to the environment: the Redis password and the S3 endpoint."""
    if isinstance(config, RedisStoreURL) and config.password is None and env.get(REDIS_PASSWORD_ENV):
        return replace(config, password=env[REDIS_PASSWORD_ENV])
    if isinstance(config, S3StoreURL) and config.endpoint is None:
        endpoint = next((env[name] for name in S3_ENDPOINT_ENVS if env.get(name)), None)
        return replace(config, endpoint=endpoint)
    return config


def open_store(url: str) -> Store:
    """Open the store a URL names. Raises :class:`StoreURLError` for a URL no backend accepts.

    Opening does not connect: an unreachable store raises :class:`StoreUnavailable` from
    the first operation.
    """
    config = resolve_environment(parse_store_url(url), os.environ)
    shown = mask_url(url.strip())
    if isinstance(config, FileStoreURL):
        from cachelib.stores.filestore import FileStore

        return FileStore(config, shown)
    if isinstance(config, RedisStoreURL):
        try:
            from cachelib.stores.redisstore import RedisStore
        except ImportError as exc:
            raise StoreError(f"{shown}: the redis package is missing (pip install 'compilecache[redis]')") from exc
        return RedisStore(config, shown)
    try:
        from cachelib.stores.s3store import S3Store
    except ImportError as exc:
        raise StoreError(f"{shown}: the boto3 package is missing (pip install 'compilecache[s3]')") from exc
    return S3Store(config, shown, endpoint=config.endpoint)
