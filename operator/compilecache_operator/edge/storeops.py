"""The operator's own store operations: pruning bundles and deleting a whole cache.

Stores are opened with the CompileCache's Secret, passed to ``open_store`` as credentials
(never through the process environment, which all caches share): a Redis password, or S3
access keys. Without a Secret the store falls back to its own chain (for S3, the operator
pod's AWS identity). These calls block; the handlers run them in a worker thread (``in_store_thread``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cachelib.keyformat import cache_prefix
from cachelib.signing import delete_signed
from cachelib.stores import Store, StoreError


@dataclass(frozen=True)
class DeleteReport:
    deleted: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    """(key, error) of each key that could not be deleted."""


def delete_keys(store: Store, keys: Iterable[str]) -> DeleteReport:
    """Delete each key and its signature; a key already gone counts as deleted. Store errors are collected per key."""
    deleted: list[str] = []
    failed: list[tuple[str, str]] = []
    for key in keys:
        try:
            delete_signed(store, key)
        except StoreError as exc:
            failed.append((key, str(exc)))
        else:
            deleted.append(key)
    return DeleteReport(tuple(deleted), tuple(failed))


def delete_cache(store: Store, namespace: str, name: str) -> DeleteReport:
    """Delete every object under the cache's key prefix ``cc1/<namespace>/<name>/``."""
    keys = [info.key for info in store.list(cache_prefix(namespace, name))]
    return delete_keys(store, keys)
