"""How a container we create or inject opens the cache's store: the storage Secret's credentials as
environment variables (pure). The warm-up's publish container and the injected preload get the same
ones; the store's CA is mounted beside them (:mod:`compilecache_operator.store_ca`)."""

from __future__ import annotations

from typing import Any

from compilecache_operator.spec import StorageSpec


def storage_env(storage: StorageSpec) -> list[dict[str, Any]]:
    """Credential variables from the storage Secret (``secretKeyRef``), none without a Secret."""
    if not storage.secret_name:
        return []
    env: list[dict[str, Any]] = []
    for cred in storage.secret_keys:
        ref: dict[str, Any] = {"name": storage.secret_name, "key": cred.key}
        if cred.optional:
            ref["optional"] = True
        env.append({"name": cred.env, "valueFrom": {"secretKeyRef": ref}})
    return env
