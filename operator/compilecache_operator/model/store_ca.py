"""A private CA for a ``rediss://`` store: ``spec.storage.ca`` names a Secret or ConfigMap key
holding the CA's PEM, in the CompileCache's namespace. It is mounted read-only at one fixed path,
:data:`STORE_CA_FILE`, in every container that opens the store on the cache's behalf — the warm-up's
publish container and the preload the webhook injects — and the store URL names that same path
(``rediss://host:6380/0?ca=/etc/compilecache/store-ca/ca.crt``), so one URL works everywhere. The
operator opens the store too (to check, prune and delete bundles): the chart's ``storeCA`` value
mounts the CA into the operator's pod at the same path.

Pure: :func:`parse_store_ca` checks the field against the store URL (as the spec's parse read it) and
returns the volume source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cachelib.stores.urls import RedisStoreURL, StoreURL
from compilecache_operator.model.warmup_inputs import CONFIG_KEY, DNS_SUBDOMAIN, Errors

STORE_CA_VOLUME = "compilecache-store-ca"
STORE_CA_DIR = "/etc/compilecache/store-ca"
STORE_CA_FILE = f"{STORE_CA_DIR}/ca.crt"
CA_MOUNT: Mapping[str, Any] = {"name": STORE_CA_VOLUME, "mountPath": STORE_CA_DIR, "readOnly": True}
DEFAULT_KEY = "ca.crt"


def parse_store_ca(raw: Any, store: StoreURL | None, path: str, errors: Errors) -> Mapping[str, Any] | None:
    """``spec.storage.ca`` (``{secretName | configMapName, key}``) -> the pod volume source that
    projects the key as ``ca.crt``; None when unset. ``store``, the parsed store URL (None: it did not
    parse), must be ``rediss://`` and name :data:`STORE_CA_FILE` in its ``ca=`` option."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        errors.add(path, "expected an object with secretName or configMapName, and key")
        return None
    sources = [name for name in ("secretName", "configMapName") if name in raw]
    if len(sources) != 1:
        errors.add(path, "set exactly one of secretName or configMapName")
        return None
    name, key = raw[sources[0]], raw.get("key", DEFAULT_KEY)
    if not isinstance(name, str) or not DNS_SUBDOMAIN.match(name):
        kind = "Secret" if sources[0] == "secretName" else "ConfigMap"
        errors.add(f"{path}.{sources[0]}", f"{name!r} is not a {kind} name")
        return None
    if not isinstance(key, str) or not CONFIG_KEY.match(key):
        errors.add(f"{path}.key", f"{key!r} is not a key name")
        return None
    if not _names_the_mounted_ca(store):
        errors.add(
            path,
            f"the store URL must be rediss://…?ca={STORE_CA_FILE}: the CA is mounted there in the publish and "
            "preload containers (and, through the chart's storeCA value, in the operator)",
        )
        return None
    items = [{"key": key, "path": "ca.crt"}]
    if sources[0] == "secretName":
        return {"secret": {"secretName": name, "items": items}}
    return {"configMap": {"name": name, "items": items}}


def _names_the_mounted_ca(store: StoreURL | None) -> bool:
    return isinstance(store, RedisStoreURL) and store.tls and store.ca == STORE_CA_FILE


def ca_volume(source: Mapping[str, Any]) -> dict[str, Any]:
    """The pod volume for a parsed ``spec.storage.ca``."""
    return {"name": STORE_CA_VOLUME, **{kind: dict(body) for kind, body in source.items()}}
