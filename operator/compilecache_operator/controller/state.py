"""What the operator's handlers share: its settings and the :class:`State` made of the parts each owner
keeps: the cluster view (the indexes its watches fill, and what this operator wrote that they do not
show yet), the scheduler (the queue of caches to handle, per-cache locks, settled fingerprints, looks
again), this replica's lifecycle (leading, draining) and the webhook's injection (native-sidecar support).

The reconcile (:mod:`compilecache_operator.controller.reconcile`), the scheduling of reconciles
(:mod:`compilecache_operator.controller.scheduling`), the deletion
(:mod:`compilecache_operator.controller.deletion`) and
the webhook (:mod:`compilecache_operator.admission.webhook`) depend on this module; it depends on none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from compilecache_operator.decisions import warmup_job
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.edge.signing import Signing
from compilecache_operator.model.confinement import Confinement
from compilecache_operator.model.names import EXCLUDED_NAMESPACES, KIND, RECORDED_ANNOTATION
from compilecache_operator.model.podsecurity import PRIVILEGED
from compilecache_operator.model.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.model.spec import CacheSpec, Defaults, InvalidSpec
from compilecache_operator.model.store_access import SecretReader

Emit = Callable[[Mapping[str, Any], str, str, str], None]
"""Posts an event on an object: ``emit(body, type, reason, message)`` (``kopf.event`` in the operator)."""
Key = tuple[str, str]
"""A CompileCache's (namespace, name)."""
IndexView = Mapping[Any, Collection[Any]]
"""A mapping of a key to the values of the objects under it (:mod:`compilecache_operator.controller.watches`)."""


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings of the controller (from the command line)."""

    defaults: Defaults
    jobs: warmup_job.JobSettings
    retry_seconds: float = 30.0
    """How long to wait after a problem that may fix itself (a missing Secret, no GPU node yet)."""
    namespaces: tuple[str, ...] = ()
    """The namespaces watched; empty for all."""
    operator_namespace: str | None = None
    native_sidecars: str = "auto"
    """``--native-sidecars``: auto (ask the API server's version), on or off."""
    confinement: Confinement = field(default_factory=Confinement)
    """The cluster admin's allow-lists of stores, credentials Secrets and warm-up ServiceAccounts."""
    signing: Signing | None = None
    """The key that signs published bundles and the keys preloads trust; None: bundles are unsigned."""
    concurrency: int = 16
    """How many reconciles run at once (each makes API calls; a restart resumes every cache)."""
    delete_attempts: int = 20
    """Attempts at deleting a cache's bundles before its finalizer is removed anyway (BundlesLeft)."""
    secret_reader: SecretReader = field(default_factory=SecretReader)
    """Who the operator is, for the message of a storage Secret it may not read (SecretForbidden)."""
    pod_security_default: str = PRIVILEGED
    """The Pod Security level of a namespace without the enforce label (the API server's default)."""

    def in_scope(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    @property
    def excluded_namespaces(self) -> frozenset[str]:
        """Namespaces whose pods are never injected: the system ones and the operator's own."""
        own = {self.operator_namespace} if self.operator_namespace else set()
        return EXCLUDED_NAMESPACES | own


@dataclass
class Indexes:
    """The operator's memory of the cluster, kept current by its watches
    (:mod:`compilecache_operator.controller.watches`)."""

    caches: IndexView = field(default_factory=dict)
    """(namespace, name) → the CompileCache (metadata, spec, status)."""
    jobs: IndexView = field(default_factory=dict)
    """The owning CompileCache's uid → its warm-up Jobs."""
    nodes: IndexView = field(default_factory=dict)
    """A Node label key → the values the Nodes carry."""

    def cache(self, key: Key) -> Mapping[str, Any] | None:
        return next(iter(self.caches.get(key, ())), None)

    def cache_keys(self) -> list[Key]:
        return list(self.caches)


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    """The uids of the CompileCaches that own ``obj`` (a warm-up Job): its keys in :attr:`Indexes.jobs`."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [str(ref["uid"]) for ref in refs if ref.get("kind") == KIND and ref.get("uid")]


class KeyedLocks:
    """One lock per key while someone holds or waits for it; the entry goes with the last user."""

    def __init__(self) -> None:
        self._locks: dict[Key, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Key) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


@dataclass(frozen=True)
class WarningEvent:
    """A Warning event on the CompileCache: a problem its owner has to act on."""

    reason: str
    message: str


@dataclass
class ClusterView:
    """What the operator knows of the cluster: the indexes of its watches, and what it wrote itself that
    they do not show yet (a status, a Job's counted mark)."""

    indexes: Indexes = field(default_factory=Indexes)
    written: dict[Key, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Per cache, a status just written: (the resourceVersion the index showed then, the object the API
    returned)."""
    counted_jobs: set[tuple[str, str]] = field(default_factory=set)
    """Jobs (namespace, name) marked as counted whose annotation the index has not shown yet."""
    ready: bool = False
    """Every watch has listed its objects once: the webhook knows every CompileCache."""
    admitting: bool = False
    """The webhook answers pods as it will once every watch has listed (the namespaces are listed; a
    CompileCache not listed yet is read when its pod asks): the replica's readiness."""
    specs: dict[Key, tuple[Mapping[str, Any], Settings, CacheSpec | InvalidSpec]] = field(default_factory=dict)
    """Per cache, its checked spec with the object and the settings it was checked from: parsed once for
    each of their versions (:func:`compilecache_operator.controller.reconcile.cache_spec`)."""

    def cache(self, key: Key) -> Mapping[str, Any] | None:
        """The CompileCache from the index, or the status this operator just wrote while the index
        has not caught up."""
        body = self.indexes.cache(key)
        written = self.written.get(key)
        if written is None or body is None:
            return body
        if str(body["metadata"].get("resourceVersion", "")) == written[0]:
            return written[1]
        del self.written[key]
        return body

    def remember(self, key: Key, written: Mapping[str, Any]) -> None:
        """Keep ``written`` (what the API returned for a status just written) as the cache's object until
        the index shows a version other than the one it shows now."""
        body = self.indexes.cache(key)
        if body is not None and written.get("metadata"):
            self.written[key] = (str(body["metadata"].get("resourceVersion", "")), written)

    def jobs(self, body: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
        """The warm-up Jobs of the cache ``body`` from the index, with the counted mark of those
        this operator just annotated."""
        namespace = str(body["metadata"].get("namespace", ""))
        jobs = []
        for job in self.indexes.jobs.get(str(body["metadata"].get("uid", "")), ()):
            key = (namespace, str(job["metadata"].get("name", "")))
            annotations = job["metadata"].get("annotations") or {}
            if RECORDED_ANNOTATION in annotations:
                self.counted_jobs.discard(key)
            elif key in self.counted_jobs:
                job = {**job, "metadata": {**job["metadata"], "annotations": {**annotations, RECORDED_ANNOTATION: "1"}}}
            jobs.append(job)
        return tuple(jobs)

    def forget(self, key: Key) -> None:
        self.written.pop(key, None)
        self.specs.pop(key, None)


BACKOFF_LIMIT = 8
"""The longest pause between looks at a cache with a lasting problem, in ``Settings.retry_seconds``."""


@dataclass
class Scheduler:
    """What decides when a cache is reconciled: the queue of caches to handle, the per-cache locks and
    the slots that bound how many run at once, the fingerprints of settled caches, the looks again
    scheduled, the warnings already posted, the tasks started on their own."""

    concurrency: int = 16
    """How many reconciles run at once (``Settings.concurrency``)."""
    queued: dict[Key, str] = field(default_factory=dict)
    """Caches waiting in :attr:`queue`, each with the handler that asked (its name in the metrics)."""
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    settled: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    """Per cache, the fingerprint of the inputs of its last reconcile that left nothing to wait for."""
    retries: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    """Per cache, a look again scheduled after a problem that may pass."""
    failures: dict[Key, int] = field(default_factory=dict)
    """Per cache, how many reconciles in a row ended in a problem (:meth:`backoff`)."""
    warnings: dict[Key, frozenset[WarningEvent]] = field(default_factory=dict)
    """Per cache, the Warning events of problems still standing: each is posted when it begins."""
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    """Tasks started on their own (a new leader's first resync), kept until done."""
    _slots: asyncio.Semaphore | None = None
    _queue: asyncio.Queue[Key] | None = None

    @property
    def queue(self) -> asyncio.Queue[Key]:
        """The caches to handle, each once however often it was asked for while waiting."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.concurrency))
        return self._slots

    def backoff(self, key: Key, pause: float) -> float:
        """The pause before looking again at a cache whose last reconciles all ended in a problem: ``pause``
        after the first, doubled after each one more, at most :data:`BACKOFF_LIMIT` times ``pause``."""
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        return pause * float(min(2 ** (failures - 1), BACKOFF_LIMIT))

    def forget(self, key: Key) -> None:
        self.warnings.pop(key, None)
        self.settled.pop(key, None)
        self.failures.pop(key, None)
        retry = self.retries.pop(key, None)
        if retry is not None:
            retry.cancel()


@dataclass
class Lifecycle:
    """Where this replica stands: leading or standing by, shutting down; and the deletions under way."""

    leading: bool = True
    """This replica acts (reconciles, deletes, counts); the others only serve the webhook."""
    draining: bool = False
    """Shutting down: not ready, still answering admissions for a moment."""
    delete_attempts: dict[Key, int] = field(default_factory=dict)
    """Per cache being deleted, the attempts at deleting its bundles so far."""


@dataclass
class Injection:
    """What only the pod-injection webhook uses: native-sidecar support, and what it said once."""

    sidecars: SidecarSupport = NOT_DETECTED
    """Whether pods may get the preload as a native sidecar (decided at start-up)."""
    fallbacks_logged: set[Key] = field(default_factory=set)
    """Caches whose Sidecar request was turned into an init container, already said in the log."""
    namespace_levels: IndexView = field(default_factory=dict)
    """A namespace's name → its ``pod-security.kubernetes.io/enforce`` label ("" when unlabelled): whether a
    node cache may be injected there (:mod:`compilecache_operator.model.podsecurity`)."""


@dataclass
class State:
    """What the handlers share: the settings, the metrics, the API client, and the parts each owner
    keeps: the cluster view, the scheduler, this replica's lifecycle, the webhook's injection."""

    settings: Settings
    metrics: Metrics
    api: KubeAPI | None = None
    cluster: ClusterView = field(default_factory=ClusterView)
    scheduler: Scheduler = field(init=False)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    injection: Injection = field(default_factory=Injection)

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(concurrency=self.settings.concurrency)

    def serving(self) -> bool:
        """Ready for admissions: the webhook answers pods as it will once every watch has listed, and the
        replica is not shutting down."""
        return not self.lifecycle.draining and (self.cluster.admitting or self.cluster.ready)

    def forget(self, key: Key) -> None:
        """A deleted cache: drop what is remembered about it."""
        self.cluster.forget(key)
        self.scheduler.forget(key)
        self.lifecycle.delete_attempts.pop(key, None)
        self.metrics.forget_cache(*key)
