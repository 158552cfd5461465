"""Whether each app container of a pod will read the cache the webhook preloads (pure).

A preload counts as a ``hit`` only when the app reads what was preloaded, so the webhook first
asks, container by container, whether the cache directory can be wired in where torch will look
for it. It cannot be when:

- ``TORCHINDUCTOR_CACHE_DIR`` comes from ``valueFrom`` (a ConfigMap, a Secret, a field): its
  value is unknown at admission, so the cache cannot be mounted there (``cache-dir-value-from``);
- ``TORCHINDUCTOR_CACHE_DIR`` is empty or not an absolute path (``cache-dir-not-absolute``);
- one of the container's own volumes is mounted at the cache mount point, above it (the cache
  would hide part of that volume, which the app put there on purpose) or below it (that volume
  would hide part of the preloaded tree) (``volume-at-cache-dir``).

Such a pod is not patched at all: it is counted ``skipped`` with that reason, annotated, and
the webhook's answer carries a warning that names the container.

A container with ``envFrom`` may define ``TORCHINDUCTOR_CACHE_DIR`` (or another variable the
webhook sets) there; the webhook's ``env`` entries take precedence over ``envFrom`` in
Kubernetes, so the app reads the preloaded cache, but a value the user set is replaced without
a word: the webhook says so in a warning and an annotation.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachelib.in_image.podcontract import CACHE_DIR_ENV as CACHE_DIR_ENV
from compilecache_operator.model.names import CACHE_MOUNT, CACHE_VOLUME, HANDOFF_VOLUME

CACHE_DIR_VALUE_FROM = "cache-dir-value-from"
CACHE_DIR_NOT_ABSOLUTE = "cache-dir-not-absolute"
VOLUME_AT_CACHE_DIR = "volume-at-cache-dir"
UNWIRED_REASONS = (CACHE_DIR_VALUE_FROM, CACHE_DIR_NOT_ABSOLUTE, VOLUME_AT_CACHE_DIR)


@dataclass(frozen=True)
class Unwired:
    """An app container that cannot see the preloaded cache, and why."""

    container: str
    reason: str
    """One of :data:`UNWIRED_REASONS` (a bounded metric label value)."""
    detail: str

    @property
    def message(self) -> str:
        return f"container {self.container!r}: {self.detail}"


def cache_mount_point(container: Mapping[str, Any]) -> str | None:
    """Where the webhook mounts the cache volume in ``container``: at the container's own absolute
    ``TORCHINDUCTOR_CACHE_DIR`` (``subPath: inductor``), else at ``/var/cache/compilecache``;
    None when the container's variable cannot be wired (see :func:`unwired`)."""
    entry = _env_entry(container, CACHE_DIR_ENV)
    if entry is None:
        return CACHE_MOUNT
    value = entry.get("value")
    if "valueFrom" in entry or not isinstance(value, str) or not value.startswith("/"):
        return None
    return _normal(value)


def unwired(container: Mapping[str, Any]) -> Unwired | None:
    """Why ``container`` would not read the preloaded cache, or None when it will."""
    name = str(container.get("name", ""))
    mounts = list(container.get("volumeMounts") or [])
    if any(m.get("name") == CACHE_VOLUME for m in mounts):
        return None  # wired by the pod's author: left as it is
    entry = _env_entry(container, CACHE_DIR_ENV)
    if entry is not None and "valueFrom" in entry:
        return Unwired(name, CACHE_DIR_VALUE_FROM,
                       f"{CACHE_DIR_ENV} comes from valueFrom, so where torch looks for its cache is not known "
                       "at admission; set it with value: (or not at all) to get the preloaded cache")
    point = cache_mount_point(container)
    if point is None:
        value = (entry or {}).get("value")
        return Unwired(name, CACHE_DIR_NOT_ABSOLUTE,
                       f"{CACHE_DIR_ENV}={value!r} is not an absolute path, so the cache cannot be mounted there")
    for mount in mounts:
        if mount.get("name") == HANDOFF_VOLUME:
            continue
        path = str(mount.get("mountPath") or "")
        if not path.startswith("/"):
            continue
        path = _normal(path)
        where = _relation(path, point)
        if where:
            return Unwired(name, VOLUME_AT_CACHE_DIR,
                           f"its volume {mount.get('name')!r} is mounted at {path}, {where} the cache directory "
                           f"{point}; the cache would hide that volume or the volume the cache")
    return None


def unwired_containers(containers: Sequence[Mapping[str, Any]]) -> list[Unwired]:
    """Every app container that would not read the preloaded cache."""
    return [u for u in (unwired(c) for c in containers) if u is not None]


def env_from_overrides(container: Mapping[str, Any], added: Sequence[str]) -> str | None:
    """A warning when ``container`` takes variables from ``envFrom`` and the webhook sets ``added``
    (which win over ``envFrom``), else None."""
    if not container.get("envFrom") or not added:
        return None
    return (f"container {container.get('name', '')!r} takes variables from envFrom; the ones compilecache sets "
            f"({', '.join(added)}) take precedence over the same names there")


def _env_entry(container: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((e for e in container.get("env") or [] if e.get("name") == name), None)


def _normal(path: str) -> str:
    return posixpath.normpath(path)


def _relation(mount: str, point: str) -> str:
    """``at``, ``above`` or ``below`` when the two paths overlap, else ``""``."""
    if mount == point:
        return "at"
    if mount == "/" or point.startswith(mount + "/"):
        return "above"
    if mount.startswith(point + "/"):
        return "below"
    return ""
