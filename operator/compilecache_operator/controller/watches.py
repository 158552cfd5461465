"""The operator's memory of the cluster: its own watches of CompileCaches, warm-up Jobs, Nodes and Namespaces.

:class:`Watches` runs one :class:`~compilecache_operator.edge.informer.Informer` per watched namespace for the
CompileCaches and the warm-up Jobs (those with the label ``compilecache.io/warmup-for``, selected by the
API server), one for the Nodes and one for the Namespaces. From their changes it keeps what the reconcile
and the webhook read, as :class:`~compilecache_operator.controller.state.Indexes`: each CompileCache by (namespace,
name), the warm-up Jobs by the uid of the CompileCache that owns them, and for each Node label key the
values the Nodes carry (``gpuDiscovery.auto``); and each namespace's Pod Security enforce label (where the
webhook may inject a node cache: :mod:`compilecache_operator.model.podsecurity`). The webhook's view of a
CompileCache (:class:`CacheViews`) is made from the object when a pod first asks for it and kept until the
object or the settings change.

Until the CompileCaches are all listed (a restarted operator lists every one of them, seconds at 10,000),
the webhook reads the one a pod asks for itself (:meth:`Watches.fetch_unlisted`: one GET, bounded), so a
replica injects pods once it knows the namespaces' Pod Security levels (:meth:`Watches.wait_admitting`),
not once it knows every cache.

Every change is applied when it arrives, at a cost that does not grow with the number of objects; it is
then handed to ``on_cache`` or ``on_job`` (which decide whether a reconcile is due). :meth:`Watches.synced`
says that every watch has listed its objects once: from then on the webhook knows every CompileCache.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import aiohttp

from compilecache_operator.controller.state import Indexes, Key, Settings, owner_uids
from compilecache_operator.decisions import cacheview
from compilecache_operator.edge.informer import Change, Informer, ObjectKey, Resource, count_labels, index_by, kept
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.model import podsecurity
from compilecache_operator.model.names import API_VERSION, KIND, PLURAL, WARMUP_LABEL

CACHES = Resource(API_VERSION, KIND, PLURAL)
JOBS = Resource("batch/v1", "Job", "jobs", selector=WARMUP_LABEL)
NODES = Resource("v1", "Node", "nodes")
NAMESPACES = Resource("v1", "Namespace", "namespaces")
Obj = Mapping[str, Any]
logger = logging.getLogger(__name__)


class Singles(Mapping[Key, tuple[Obj]]):
    """Objects by key, read as an index: the objects under each key (one)."""

    def __init__(self, objects: Mapping[Key, Obj]) -> None:
        self._objects = objects

    def __getitem__(self, key: Key) -> tuple[Obj]:
        return (self._objects[key],)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._objects)

    def __len__(self) -> int:
        return len(self._objects)


class Grouped(Mapping[str, Collection[Obj]]):
    """Objects grouped under index keys (``index_by``), read as an index: the objects under each key, as they
    are at the read. A reader may iterate them across an ``await`` (a deletion deletes a cache's Jobs one by
    one), during which the watch changes the group: a live view of it would end that loop with "dictionary
    changed size during iteration"."""

    def __init__(self, groups: Mapping[str, Mapping[ObjectKey, Obj]]) -> None:
        self._groups = groups

    def __getitem__(self, key: str) -> tuple[Obj, ...]:
        return tuple(self._groups[key].values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


class CacheViews(Mapping[Key, tuple[cacheview.CacheView]]):
    """The webhook's view of each CompileCache, made on first use from the object and the settings of the
    moment, and made again once either changed (a grant, the signing key)."""

    def __init__(self, caches: Mapping[Key, Obj], settings: Callable[[], Settings],
                 fetched: Callable[[], Mapping[Key, Obj]] = dict) -> None:
        self._caches, self._settings, self._fetched = caches, settings, fetched
        self._made: dict[Key, tuple[Obj, Settings, cacheview.CacheView]] = {}

    def __getitem__(self, key: Key) -> tuple[cacheview.CacheView]:
        body = self._caches.get(key) or self._fetched()[key]
        settings = self._settings()
        made = self._made.get(key)
        if made is None or made[0] is not body or made[1] is not settings:
            made = (body, settings, cacheview.cache_view(body, settings.defaults, settings.confinement))
            self._made[key] = made
        return (made[2],)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._caches)

    def __len__(self) -> int:
        return len(self._caches)

    def forget(self, key: Key) -> None:
        self._made.pop(key, None)


class Watches:
    """The watches of CompileCaches, warm-up Jobs, Nodes and Namespaces, and the indexes kept from them."""

    def __init__(self, api: KubeAPI, namespaces: Sequence[str], settings: Callable[[], Settings], *,
                 on_cache: Callable[[Change], None], on_job: Callable[[Change], None],
                 watch_seconds: int = 300) -> None:
        self.caches: dict[Key, Obj] = {}
        self.jobs: dict[str, dict[ObjectKey, Obj]] = {}
        """The owning CompileCache's uid → its warm-up Jobs by (namespace, name)."""
        self.nodes: dict[str, Counter[str]] = {}
        """A Node label key → how many Nodes carry each of its values."""
        self.namespace_levels: dict[str, tuple[str]] = {}
        """A namespace's name → its Pod Security enforce label ("" when unlabelled), read as an index."""
        self.fetched: dict[Key, Obj] = {}
        """CompileCaches the webhook read itself before the list had them (:meth:`fetch_unlisted`)."""
        self.views = CacheViews(self.caches, settings, lambda: {} if self.caches_listed() else self.fetched)
        self._on_cache, self._on_job = on_cache, on_job
        scopes: Sequence[str | None] = list(namespaces) or [None]
        self.informers = [
            *(Informer(api, CACHES, self.cache_changed, namespace=ns, watch_seconds=watch_seconds) for ns in scopes),
            *(Informer(api, JOBS, self.job_changed, namespace=ns, watch_seconds=watch_seconds) for ns in scopes),
            Informer(api, NODES, self.node_changed, watch_seconds=watch_seconds),
            Informer(api, NAMESPACES, self.namespace_changed, watch_seconds=watch_seconds),
        ]

    def indexes(self) -> Indexes:
        return Indexes(caches=Singles(self.caches), jobs=Grouped(self.jobs), nodes=self.nodes)

    def cache_changed(self, change: Change) -> None:
        self.fetched.pop(change.key, None)
        if change.new is None:
            self.caches.pop(change.key, None)
            self.views.forget(change.key)
        else:
            self.caches[change.key] = change.new
        self._on_cache(change)

    def job_changed(self, change: Change) -> None:
        index_by(self.jobs, change, owner_uids)
        self._on_job(change)

    def node_changed(self, change: Change) -> None:
        count_labels(self.nodes, change)

    def namespace_changed(self, change: Change) -> None:
        name = change.key[1]
        if change.new is None:
            self.namespace_levels.pop(name, None)
        else:
            labels = (change.new.get("metadata") or {}).get("labels") or {}
            self.namespace_levels[name] = (str(labels.get(podsecurity.ENFORCE_LABEL, "")),)

    def synced(self) -> bool:
        """Every watch has listed its objects once."""
        return all(informer.synced.is_set() for informer in self.informers)

    async def wait_synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()
        self.fetched.clear()

    def caches_listed(self) -> bool:
        """Every watch of the CompileCaches has listed them once: the index holds each one."""
        return all(informer.synced.is_set() for informer in self.informers if informer.resource is CACHES)

    async def wait_admitting(self) -> None:
        """Until the webhook can answer every pod as it would once every watch has listed: the namespaces'
        Pod Security levels are listed (a namespace is few objects); a CompileCache not listed yet is
        read when a pod asks for it (:meth:`fetch_unlisted`)."""
        for informer in self.informers:
            if informer.resource is NAMESPACES:
                await informer.synced.wait()

    async def fetch_unlisted(self, api: KubeAPI, key: Key, timeout: float) -> None:
        """Before the CompileCaches are all listed, read the one ``key`` names, unless the list or an earlier
        read has it: one GET of at most ``timeout`` seconds. A failure (or no such cache) leaves it to the
        list: the pod gets the webhook's answer for a cache it does not know, as before."""
        if self.caches_listed() or key in self.caches or key in self.fetched:
            return
        try:
            body = await asyncio.wait_for(api.get_cache(*key), timeout)
        except (KubeError, TimeoutError, OSError, aiohttp.ClientError) as exc:
            logger.info("CompileCache %s/%s not read before the list (%s): its pod is left to the list", *key, exc)
            return
        if body is not None and not self.caches_listed() and key not in self.caches:
            self.fetched[key] = kept(body, CACHES)

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(informer.run(), name=f"watch of {informer.what}") for informer in self.informers]
