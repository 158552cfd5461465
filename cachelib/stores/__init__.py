"""Stores: where bundles live. ``open_store(url)`` picks the backend by the URL's scheme.

- ``file:///path`` — files under a directory (the embedded default);
- ``redis://host:port/db`` and ``rediss://`` — chunked values, an index for listing;
- ``redis-cluster://host:port`` and ``rediss-cluster://`` — the same on a Redis Cluster;
- ``s3://bucket/prefix`` — S3 or an S3-compatible server (``?endpoint=``).

The Redis and S3 client libraries are imported only when such a store is opened
(extras ``compilecache[redis]`` and ``compilecache[s3]``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from cachelib.in_image.masking import mask_url
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
    parse_store_url,
)

REDIS_PASSWORD_ENV = "COMPILECACHE_REDIS_PASSWORD"
S3_ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class Credential:
    """One credential a store takes."""

    env: str
    """The environment variable it is read from, and its name in ``open_store(credentials=...)``."""
    name: str
    """Its short name in a configuration (a CompileCache's ``spec.storage.secretRef.keys``)."""
    default_key: str
    """The key it is kept under in a credentials file or Secret unless the configuration names another."""
    optional: bool = False


_REDIS_CREDENTIALS = (Credential(REDIS_PASSWORD_ENV, "password", "password"),)
CREDENTIALS: dict[str, tuple[Credential, ...]] = {
    "file": (),
    "redis": _REDIS_CREDENTIALS,
    "rediss": _REDIS_CREDENTIALS,
    "redis-cluster": _REDIS_CREDENTIALS,
    "rediss-cluster": _REDIS_CREDENTIALS,
    "s3": (
        Credential("AWS_ACCESS_KEY_ID", "accessKeyId", "AWS_ACCESS_KEY_ID"),
        Credential("AWS_SECRET_ACCESS_KEY", "secretAccessKey", "AWS_SECRET_ACCESS_KEY"),
        Credential("AWS_SESSION_TOKEN", "sessionToken", "AWS_SESSION_TOKEN", optional=True),
    ),
}
"""The credentials each scheme's stores take: the one table the CLI, the stores and the operator read."""


__all__ = [
    "ACCEPTED_SCHEMES",
    "CREDENTIALS",
    "REDIS_PASSWORD_ENV",
    "Credential",
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
    "in_store_thread",
    "mask_url",
    "open_store",
    "parse_store_url",
    "resolve_environment",
]

T = TypeVar("T")


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
    accepted = [c.env for c in CREDENTIALS[scheme]]
    given = {name: value for name, value in credentials.items() if value}
    for name in sorted(given):
        if name not in accepted:
            takes = ", ".join(accepted) if accepted else "none"
            raise StoreURLError(f"credential {name!r} does not apply to {scheme}:// stores (they take: {takes})")
    required = [c.env for c in CREDENTIALS[scheme] if not c.optional]
    if given and not set(required) <= set(given):
        raise StoreURLError(f"{scheme.upper()} credentials need both {' and '.join(required)}")
    return given


def _scheme_of(config: StoreURL) -> str:
    if isinstance(config, FileStoreURL):
        return "file"
    if isinstance(config, RedisStoreURL):
        return ("rediss" if config.tls else "redis") + ("-cluster" if config.cluster else "")
    return "s3"


def open_store(url: str, credentials: Mapping[str, str] | None = None) -> Store:
    """Open the store a URL names. Raises :class:`StoreURLError` for a URL no backend accepts.

    ``credentials`` (names as the ``env`` of :data:`CREDENTIALS`: ``COMPILECACHE_REDIS_PASSWORD``;
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


async def in_store_thread(url: str, work: Callable[[Store], T], credentials: Mapping[str, str] | None = None) -> T:
    """``work(store)`` in a worker thread, the store at ``url`` open around it (stores block; an event
    loop must not). Raises what :func:`open_store` and ``work`` raise."""

    def run() -> T:
        with open_store(url, credentials=credentials) as store:
            return work(store)

    return await asyncio.to_thread(run)
