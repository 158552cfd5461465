"""The operator's own store operations: pruning bundles and deleting a whole cache.

Stores are opened with the CompileCache's Secret: a Redis password goes into the URL the
operator opens (never into the process environment, which all caches share). S3 stores are
opened with the operator's own AWS identity (its pod's credentials chain), since the operator
acts for every cache. These calls block; the handlers run them in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from cachelib.keys import cache_prefix
from cachelib.stores import REDIS_PASSWORD_ENV, Store, StoreError, open_store


@dataclass(frozen=True)
class DeleteReport:
    deleted: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    """(key, error) of each key that could not be deleted."""


def url_with_credentials(url: str, credentials: Mapping[str, str]) -> str:
    """The store URL the operator opens: a Redis password from the Secret goes into the URL."""
    parts = urlsplit(url)
    password = credentials.get(REDIS_PASSWORD_ENV)
    if parts.scheme.lower() in ("redis", "rediss") and password and parts.password is None:
        user = quote(parts.username, safe="") if parts.username else ""
        netloc = f"{user}:{quote(password, safe='')}@{parts.netloc.rsplit('@', 1)[-1]}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def open_cache_store(url: str, credentials: Mapping[str, str]) -> Store:
    return open_store(url_with_credentials(url, credentials))


def delete_keys(store: Store, keys: Iterable[str]) -> DeleteReport:
    """Delete each key; a key already gone counts as deleted. Store errors are collected per key."""
    deleted: list[str] = []
    failed: list[tuple[str, str]] = []
    for key in keys:
        try:
            store.delete(key)
        except StoreError as exc:
            failed.append((key, str(exc)))
        else:
            deleted.append(key)
    return DeleteReport(tuple(deleted), tuple(failed))


def delete_cache(store: Store, namespace: str, name: str) -> DeleteReport:
    """Delete every object under the cache's key prefix ``cc1/<namespace>/<name>/``."""
    keys = [info.key for info in store.list(cache_prefix(namespace, name))]
    return delete_keys(store, keys)
