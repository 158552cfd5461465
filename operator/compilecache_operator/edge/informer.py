"""The operator's own watches: one resource listed, then watched from the list's resourceVersion, kept in memory.

An :class:`Informer` does what client-go's reflector does, in the operator's event loop: it lists the objects
(paged), then watches from the list's ``resourceVersion`` with bookmarks (which move that version on while
nothing changes), starts the watch again from the last version it saw when the server ends it or the
connection drops, and lists afresh only when the server answers 410 Gone (the version is too old for it).
Each change, the list's included, reaches ``on_change`` in the order the server sent it; after a relist, the
changes are the difference between what was known and what was listed, deletions included. :attr:`synced`
is set once the first list is in.

What a change does to the memory is pure (:func:`apply_event`, :func:`replace_all`, :func:`index_by`,
:func:`count_labels`): the cost of a change does not depend on how many objects there are, so the operator
stays linear in the number of CompileCaches. (Kopf's indexes gate every object's handlers on one shared
set of per-object toggles, and each new object wakes every waiter: work that grows faster than the square
of the number of objects.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from compilecache_operator.edge.kube import KubeAPI, KubeError, backoff

logger = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
ObjectKey = tuple[str, str]
"""An object's (namespace, name); the namespace is empty for a cluster-scoped one."""
Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Change:
    """What one event (or a relist) changed: the object before (None: new) and after (None: deleted)."""

    type: str
    key: ObjectKey
    old: Obj | None
    new: Obj | None

    @property
    def body(self) -> Obj:
        """The object as it is now, or as it was last known when deleted."""
        body = self.new if self.new is not None else self.old
        assert body is not None, "a change has an object before or after it"
        return body


@dataclass(frozen=True)
class Resource:
    """A kind of object the API serves, and the label selector its watch is narrowed to."""

    api_version: str
    kind: str
    plural: str
    selector: str | None = None

    def path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.api_version}" if "/" in self.api_version else f"/api/{self.api_version}"
        return f"{base}/namespaces/{quote(namespace)}/{self.plural}" if namespace else f"{base}/{self.plural}"


class Gone(Exception):
    """The server no longer has the resourceVersion asked for (HTTP 410): list afresh."""


def object_key(obj: Obj) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def version_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def kept(obj: Obj, resource: Resource) -> dict[str, Any]:
    """The object as the memory keeps it: without ``managedFields``, with its apiVersion and kind (the items
    of a list do not always carry them)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "apiVersion": obj.get("apiVersion") or resource.api_version,
            "kind": obj.get("kind") or resource.kind, "metadata": meta}


def apply_event(store: MutableMapping[ObjectKey, Obj], type_: str, obj: Obj) -> Change | None:
    """Apply one watch event to ``store``; None when it changes nothing (the version already held, or the
    deletion of an object not held)."""
    key = object_key(obj)
    old = store.get(key)
    if type_ == DELETED:
        if old is None:
            return None
        del store[key]
        return Change(DELETED, key, old, None)
    if type_ not in (ADDED, MODIFIED):
        raise ValueError(f"not an object's event: {type_!r}")
    if old is not None and version_of(old) == version_of(obj):
        return None
    store[key] = obj
    return Change(ADDED if old is None else MODIFIED, key, old, obj)


def replace_all(store: MutableMapping[ObjectKey, Obj], listed: Iterable[Obj]) -> list[Change]:
    """Make ``store`` what a list returned; the changes that took: the objects gone, then those added or
    changed, in the list's order. An object listed at the version held stays the same object."""
    fresh: dict[ObjectKey, Obj] = {}
    changes: list[Change] = []
    for obj in listed:
        key = object_key(obj)
        old = store.get(key)
        if old is not None and version_of(old) == version_of(obj):
            fresh[key] = old
            continue
        fresh[key] = obj
        changes.append(Change(ADDED if old is None else MODIFIED, key, old, obj))
    gone = [Change(DELETED, key, old, None) for key, old in store.items() if key not in fresh]
    store.clear()
    store.update(fresh)
    return gone + changes


def index_by(index: dict[str, dict[ObjectKey, Obj]], change: Change, keys_of: Callable[[Obj], Iterable[str]]) -> None:
    """Keep ``index`` (an index key → the objects under it, by object key) current with one change."""
    if change.old is not None:
        for index_key in keys_of(change.old):
            under = index.get(index_key)
            if under is not None:
                under.pop(change.key, None)
                if not under:
                    del index[index_key]
    if change.new is not None:
        for index_key in keys_of(change.new):
            index.setdefault(index_key, {})[change.key] = change.new


def labels_of(obj: Obj | None) -> Mapping[str, str]:
    return ((obj or {}).get("metadata") or {}).get("labels") or {}


def count_labels(index: dict[str, Counter[str]], change: Change) -> None:
    """Keep ``index`` (a label key → how many objects carry each of its values) current with one change."""
    for labels, step in ((labels_of(change.old), -1), (labels_of(change.new), 1)):
        for key, value in labels.items():
            counts = index.setdefault(key, Counter())
            counts[value] += step
            if counts[value] <= 0:
                del counts[value]
            if not counts:
                del index[key]


# -- the I/O ---------------------------------------------------------------------------------------------------
class Informer:
    """One resource (in one namespace, or in all) listed and watched, kept in :attr:`store`.

    Every change is handed to ``on_change`` as it is applied, never concurrently. ``watch_seconds`` is how long
    the server keeps a watch open before ending it (it is started again from the last version seen)."""

    def __init__(self, api: KubeAPI, resource: Resource, on_change: Callable[[Change], None], *,
                 namespace: str | None = None, watch_seconds: int = 300) -> None:
        self.api, self.resource, self.on_change = api, resource, on_change
        self.namespace = namespace
        self.watch_seconds = watch_seconds
        self.store: dict[ObjectKey, Obj] = {}
        self.version: str | None = None
        """The last resourceVersion seen (None: list afresh)."""
        self.synced = asyncio.Event()
        """Set once the first list is in."""
        self.lists = 0
        """Lists done (the first, and one per 410 Gone)."""
        self.watches = 0
        """Watch requests started."""

    @property
    def what(self) -> str:
        return f"{self.resource.plural}" + (f" in {self.namespace}" if self.namespace else "")

    async def run(self) -> None:
        """List and watch until cancelled; errors are logged and tried again after a back-off."""
        failures = 0
        while True:
            try:
                if self.version is None:
                    await self.relist()
                await self.watch()
                failures = 0
            except Gone:
                logger.info("watch of %s: resourceVersion %s is gone; listing again", self.what, self.version)
                self.version = None
            except (KubeError, TimeoutError, OSError, ValueError, aiohttp.ClientError) as exc:
                failures += 1
                delay = backoff(failures, base=0.5, cap=30.0)
                logger.warning("watch of %s failed (%s); again in %.1fs", self.what, exc, delay)
                await asyncio.sleep(delay)

    async def relist(self) -> None:
        """List every object (paged); the store becomes the list and each difference is a change."""
        query = {"labelSelector": self.resource.selector}
        items, version = await self.api.list_versioned(self.resource.path(self.namespace), query)
        self.lists += 1
        changes = replace_all(self.store, (kept(item, self.resource) for item in items))
        self.version = version
        for change in changes:
            self.tell(change)
        self.synced.set()

    async def watch(self) -> None:
        """One watch request from :attr:`version`, until the server ends it or the connection drops."""
        query = {"labelSelector": self.resource.selector, "resourceVersion": self.version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": self.watch_seconds}
        self.watches += 1
        try:
            async for event in self.api.watch(self.resource.path(self.namespace), query,
                                              read_timeout=self.watch_seconds + 30):
                self.take(event)
        except KubeError as exc:
            if exc.status == 410:
                raise Gone(exc.detail) from exc
            raise

    def tell(self, change: Change) -> None:
        """Hand one change on; a handler's fault is logged and the watch goes on."""
        try:
            self.on_change(change)
        except Exception:
            logger.exception("watch of %s: the change of %s/%s was not handled", self.what, *change.key)

    def take(self, event: Mapping[str, Any]) -> None:
        """One watch event: an object's change, a bookmark, or an error (410: :class:`Gone`)."""
        type_, obj = str(event.get("type") or ""), event.get("object") or {}
        if type_ == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise Gone(str(obj.get("message") or ""))
            raise KubeError("WATCH", self.resource.path(self.namespace), code, str(obj.get("message") or obj))
        version = version_of(obj)
        if type_ != "BOOKMARK":
            change = apply_event(self.store, type_, kept(obj, self.resource))
            if change is not None:
                self.tell(change)
        if version:
            self.version = version
