"""Stores: where bundles live. ``open_store(url)`` picks the backend by the URL's scheme.

- ``file:///path`` — files under a directory (the embedded default);
- ``redis://host:port/db`` and ``rediss://`` — chunked values, an index for listing;
- ``redis-cluster://host:port`` and ``rediss-cluster://`` — the same on a Redis Cluster;
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
S3_CREDENTIAL_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
CREDENTIAL_NAMES: dict[str, tuple[str, ...]] = {
    "file": (),
    "redis": (REDIS_PASSWORD_ENV,),
    "rediss": (REDIS_PASSWORD_ENV,),
    "redis-cluster": (REDIS_PASSWORD_ENV,),
    "rediss-cluster": (REDIS_PASSWORD_ENV,),
    "s3": S3_CREDENTIAL_NAMES,
}
"""The credentials ``open_store(url, credentials=...)`` accepts per scheme (named like their variables)."""

__all__ = [
    "ACCEPTED_SCHEMES",
    "CREDENTIAL_NAMES",
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
    "check_credentials",
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


def check_credentials(config: StoreURL, credentials: Mapping[str, str]) -> dict[str, str]:
    """The non-empty credentials, after checking that the store's scheme takes each of them."""
    scheme = _scheme_of(config)
    accepted = CREDENTIAL_NAMES[scheme]
    given = {name: value for name, value in credentials.items() if value}
    for name in sorted(given):
        if name not in accepted:
            takes = ", ".join(accepted) if accepted else "none"
            raise StoreURLError(f"credential {name!r} does not apply to {scheme}:// stores (they take: {takes})")
    if scheme == "s3" and given and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(given):
        raise StoreURLError("S3 credentials need both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return given


def _scheme_of(config: StoreURL) -> str:
    if isinstance(config, FileStoreURL):
        return "file"
    if isinstance(config, RedisStoreURL):
        return ("rediss" if config.tls else "redis") + ("-cluster" if config.cluster else "")
    return "s3"


def open_store(url: str, credentials: Mapping[str, str] | None = None) -> Store:
    """Open the store a URL names. Raises :class:`StoreURLError` for a URL no backend accepts.

    ``credentials`` (names as in :data:`CREDENTIAL_NAMES`: ``COMPILECACHE_REDIS_PASSWORD``;
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``) serve a caller
    that opens stores for several owners in one process: they win over the environment (a
    password in the URL wins over both). Opening does not connect: an unreachable store
    raises :class:`StoreUnavailable` from the first operation.
    """
    config = parse_store_url(url)
    given = check_credentials(config, credentials or {})
    if isinstance(config, RedisStoreURL) and config.password is None and REDIS_PASSWORD_ENV in given:
        config = replace(config, password=given[REDIS_PASSWORD_ENV])
    config = resolve_environment(config, os.environ)
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
    return S3Store(config, shown, endpoint=config.endpoint, credentials=given or None)
