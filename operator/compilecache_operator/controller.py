"""The CompileCache reconcile: read one snapshot, decide the actions, apply them.

- **read** (:func:`read_snapshot`): the CompileCache, its warm-up Jobs and the Nodes' GPU labels come
  from the operator's in-memory indexes (:class:`Indexes`, filled by Kopf's watches); the API is
  asked only for what no watch holds: the storage Secret, and the pods of Jobs whose outcome is
  still to be read (a Job of a variant without a bundle).
- **decide** (:func:`decide_actions`, pure): the plan, the Jobs to create, the results to record and
  count, the bundles to prune, the Jobs to delete, the conditions; :func:`final_status` turns them
  and the prune's result into the status.
- **apply** (:func:`apply_actions`): the API calls and store deletes, events, metrics; the status is
  written only when it changes.

A reconcile is idempotent, so change handlers, Job events and the resync may all ask for one;
:class:`KeyedLocks` keeps two for the same cache from interleaving, and a semaphore bounds how
many run at once. :func:`fingerprint` lets the resync skip every cache whose inputs did not change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from compilecache_operator import builders, storeops
from compilecache_operator.conditions import Condition, now_rfc3339, shown_message
from compilecache_operator.confinement import Confinement, check_confinement
from compilecache_operator.failures import describe, failure_of, step
from compilecache_operator.kube import KubeAPI
from compilecache_operator.metrics import Metrics
from compilecache_operator.names import (
    EXCLUDED_NAMESPACES,
    FINALIZER,
    KIND,
    RECORDED_ANNOTATION,
    VARIANT_LABEL,
    WARMUP_LABEL,
)
from compilecache_operator.plan import (
    BundleRecord,
    Variant,
    bundles_from_status,
    bundles_to_prune,
    current_bundles,
    job_name,
    merge_bundles,
    missing_variants,
    plan_id,
    plan_variants,
    planned_gpu_types,
)
from compilecache_operator.results import (
    JobState,
    ResultError,
    bundle_from_publish,
    describe_wait,
    observe_job,
    publish_message,
)
from compilecache_operator.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.signing import Signing, sign_records
from compilecache_operator.spec import CacheSpec, Defaults, InvalidSpec, StorageSpec
from compilecache_operator.spec_parse import parse_spec

from cachelib.keyformat import cache_prefix
from cachelib.stores import Store, StoreError, in_store_thread

logger = logging.getLogger(__name__)

Emit = Callable[[Mapping[str, Any], str, str, str], None]
"""Posts an event on an object: ``emit(body, type, reason, message)`` (``kopf.event`` in the operator)."""
Key = tuple[str, str]
"""A CompileCache's (namespace, name)."""
IndexView = Mapping[Any, Collection[Any]]
"""A Kopf index (or any mapping of a key to the values of the objects under it)."""


@dataclass(frozen=True)
class Settings:
    """Operator-wide settings of the controller (from the command line)."""

    defaults: Defaults
    jobs: builders.JobSettings
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

    def in_scope(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    @property
    def excluded_namespaces(self) -> frozenset[str]:
        """Namespaces whose pods are never injected: the system ones and the operator's own."""
        own = {self.operator_namespace} if self.operator_namespace else set()
        return EXCLUDED_NAMESPACES | own


@dataclass
class Indexes:
    """The operator's memory of the cluster, kept current by Kopf's watches (see handlers)."""

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


@dataclass
class State:
    """What the handlers share: settings, metrics, the API client, the indexes, native-sidecar support."""

    settings: Settings
    metrics: Metrics
    api: KubeAPI | None = None
    indexes: Indexes = field(default_factory=Indexes)
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    sidecars: SidecarSupport = NOT_DETECTED
    """Whether pods may get the preload as a native sidecar (decided at start-up)."""
    fallbacks_logged: set[tuple[str, str]] = field(default_factory=set)
    """Caches whose Sidecar request was turned into an init container, already said in the log."""
    warnings: dict[tuple[str, str], frozenset[WarningEvent]] = field(default_factory=dict)
    """Per cache, the Warning events of problems still standing: each is posted when it begins."""
    settled: dict[Key, tuple[Any, ...]] = field(default_factory=dict)
    """Per cache, the fingerprint of the inputs of its last reconcile that left nothing to wait for."""
    written: dict[Key, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Per cache, a status just written: (the resourceVersion it replaced, the object the API returned)."""
    counted_jobs: set[tuple[str, str]] = field(default_factory=set)
    """Jobs (namespace, name) marked as counted whose annotation the index has not shown yet."""
    ready: bool = False
    """Every index has been loaded once (the webhook's readiness)."""
    draining: bool = False
    """Shutting down: not ready, still answering admissions for a moment."""
    early_views: Mapping[Key, Any] | None = None
    """The webhook's views of the CompileCaches listed at start-up, used until Kopf's index is loaded
    (Kopf indexes a large list object by object, seconds after it arrived)."""
    leading: bool = True
    """This replica acts (reconciles, deletes, counts); the others only serve the webhook."""
    delete_attempts: dict[Key, int] = field(default_factory=dict)
    retries: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    """Per cache, a look again scheduled after a problem that may pass."""
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    """Tasks started on their own (a new leader's first resync), kept until done."""
    _slots: asyncio.Semaphore | None = None

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        return self._slots

    def serving(self) -> bool:
        """Ready for admissions: every CompileCache known, from Kopf's index or the start-up list."""
        return not self.draining and (self.ready or self.early_views is not None)

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
        """A deleted cache: drop what is remembered about it."""
        self.warnings.pop(key, None)
        self.settled.pop(key, None)
        self.written.pop(key, None)
        self.delete_attempts.pop(key, None)
        retry = self.retries.pop(key, None)
        if retry is not None:
            retry.cancel()
        self.metrics.forget_cache(*key)


@dataclass(frozen=True)
class Outcome:
    ready: bool = False
    warming: bool = False
    """Warm-up Jobs are running: Job events and the resync look again."""
    problem: str | None = None
    """A problem that may pass (a missing Secret, no GPU node yet): look again after ``retry_after``."""
    retry_after: float | None = None
    invalid: str | None = None
    """Set when the spec can never work: the field paths and what is wrong."""
    gone: bool = False


@dataclass(frozen=True)
class WarningEvent:
    """A Warning event on the CompileCache: a problem its owner has to act on."""

    reason: str
    message: str


# -- pure helpers -----------------------------------------------------------------------------------
def secret_problem(storage: StorageSpec, data: Mapping[str, bytes] | None, namespace: str) -> builders.Failure | None:
    """Why the storage Secret cannot be used, or None."""
    if not storage.secret_name:
        return None
    if data is None:
        return builders.Failure(
            "SecretNotFound",
            f"spec.storage.secretRef.name: Secret {storage.secret_name!r} not found in namespace {namespace!r}",
        )
    for cred in storage.secret_keys:
        if not cred.optional and cred.key not in data:
            return builders.Failure(
                "SecretKeyMissing",
                f"spec.storage.secretRef.keys: Secret {storage.secret_name!r} has no key {cred.key!r} ({cred.env})",
            )
    return None


def secret_credentials(storage: StorageSpec, data: Mapping[str, bytes] | None) -> dict[str, str]:
    """The credentials as the store reads them from the environment (names of the env variables)."""
    if not data:
        return {}
    return {c.env: data[c.key].decode() for c in storage.secret_keys if c.key in data}


def fresh_warnings(standing: frozenset[WarningEvent], current: Sequence[WarningEvent]) -> list[WarningEvent]:
    """The warnings of ``current`` to post: those not already standing since an earlier reconcile
    (a problem is reconciled again until it passes; one event per problem, not one per pass). A
    problem that goes away and comes back is posted again."""
    return [w for w in dict.fromkeys(current) if w not in standing]


def failure_warning(failure: builders.Failure) -> WarningEvent:
    """A failure that keeps the cache from being served (InvalidSpec, SecretNotFound,
    SecretKeyMissing, NoGPUNodes) as a Warning event of the same reason."""
    return WarningEvent(failure.reason, failure.message)


def warmup_failed_warning(job: JobState, gpu: str) -> WarningEvent:
    """A failed warm-up Job (posted once, when the Job is counted)."""
    what = f"{job.reason}: {job.message}" if job.message else job.reason
    return WarningEvent("WarmupFailed", f"Job {job.name} ({gpu}) failed: {what}")


def owner_uids(obj: Mapping[str, Any]) -> list[str]:
    """The uids of the CompileCaches that own ``obj`` (a warm-up Job)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [str(ref["uid"]) for ref in refs if ref.get("kind") == KIND and ref.get("uid")]


@dataclass(frozen=True)
class VariantStep:
    """What to do about one missing variant."""

    variant: Variant
    action: str
    """record (a succeeded Job), wait (an active one), failed (failed this generation), create."""
    job: Mapping[str, Any] | None = None
    state: JobState | None = None


def decide(variant: Variant, jobs: Sequence[tuple[Mapping[str, Any], JobState]], generation: int) -> VariantStep:
    """The step for a missing variant given its Jobs (of any generation), newest generation first:
    record a success, else wait for a running Job, else report this generation's failure,
    else create this generation's Job (a spec change is what retries a failed warm-up)."""
    mine = sorted((j for j in jobs if j[1].variant == variant.id), key=lambda j: -j[1].generation)
    for job, state in mine:
        if state.phase == "succeeded":
            return VariantStep(variant, "record", job, state)
    for job, state in mine:
        if state.phase == "active":
            return VariantStep(variant, "wait", job, state)
    for job, state in mine:
        if state.phase == "failed" and state.generation >= generation:
            return VariantStep(variant, "failed", job, state)
    return VariantStep(variant, "create")


def superseded_jobs(states: Sequence[JobState], planned: set[str]) -> list[str]:
    """Finished Jobs that no longer tell anything: those of variants outside the plan, and failed
    ones of a variant that has a newer Job. The current plan's last Jobs stay for inspection."""
    newest: dict[str, int] = {}
    for s in states:
        newest[s.variant] = max(newest.get(s.variant, 0), s.generation)
    return [
        s.name
        for s in states
        if s.phase != "active"
        and s.recorded
        and (s.variant not in planned or (s.phase == "failed" and s.generation < newest[s.variant]))
    ]


# -- read ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile of a CompileCache decides from, read once."""

    body: Mapping[str, Any]
    """The CompileCache: metadata, spec, status."""
    jobs: tuple[Mapping[str, Any], ...] = ()
    """Its warm-up Jobs (every generation)."""
    gpus: frozenset[str] = frozenset()
    """With ``gpuDiscovery.auto``: the values of the Nodes' GPU label."""
    secret: Mapping[str, bytes] | None = None
    """The storage Secret's data (None when the spec names none, or it does not exist)."""
    pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """The pods of the Jobs whose outcome is to be read, by Job uid."""
    spec: CacheSpec | InvalidSpec | None = None
    """The checked spec, or why it is invalid (None: not checked yet, :func:`decide_actions` checks it)."""


def needs_pods(job: Mapping[str, Any], bundled: Collection[str]) -> bool:
    """Whether deciding about ``job`` reads its pods: unless its result is counted and its variant has
    a bundle, the pods say what it waits for, why it failed or what it published."""
    meta = job.get("metadata") or {}
    recorded = RECORDED_ANNOTATION in (meta.get("annotations") or {})
    return not recorded or (meta.get("labels") or {}).get(VARIANT_LABEL) not in bundled


def is_deleting(body: Mapping[str, Any] | None) -> bool:
    return body is None or bool((body.get("metadata") or {}).get("deletionTimestamp"))


def fingerprint(state: State, key: Key, spec: CacheSpec | InvalidSpec | None = None) -> tuple[Any, ...]:
    """What a reconcile of ``key`` reads from memory, reduced to versions: the same fingerprint
    means the same decisions (the Secret and pods aside, which only caches with unfinished
    business read, and those are never settled). ``spec``: the cache's, when already checked."""
    body = state.cache(key) or {}
    meta = body.get("metadata") or {}
    jobs = state.indexes.jobs.get(str(meta.get("uid", "")), ())
    versions = sorted(str((j.get("metadata") or {}).get("resourceVersion", "")) for j in jobs)
    spec = spec_of(body, state.settings, key[1]) if spec is None else spec
    label_key = spec.gpu_discovery.label_key if isinstance(spec, CacheSpec) else ""
    return (meta.get("resourceVersion"), tuple(versions), frozenset(state.indexes.nodes.get(label_key, ())))


def checked_spec(body: Mapping[str, Any], settings: Settings, name: str) -> CacheSpec:
    """The parsed spec, within the cluster admin's allow-lists (InvalidSpec otherwise): checked
    before its Secret is read or handed to anything."""
    spec = parse_spec(body.get("spec"), settings.defaults, name=name)
    check_confinement(settings.confinement, str(body["metadata"].get("namespace", "")), spec)
    return spec


def spec_of(body: Mapping[str, Any], settings: Settings, name: str) -> CacheSpec | InvalidSpec:
    """:func:`checked_spec`, or the InvalidSpec it raised."""
    try:
        return checked_spec(body, settings, name)
    except InvalidSpec as exc:
        return exc


async def read_snapshot(state: State, key: Key, spec: CacheSpec | InvalidSpec | None = None) -> Snapshot | None:
    """The snapshot of the cache ``key`` (None when it is gone or being deleted); ``spec``: its
    checked spec, when the caller has it."""
    api = state.api
    assert api is not None, "the API client is set at start-up"
    body = state.cache(key)
    if body is None or is_deleting(body):
        return None
    spec = spec_of(body, state.settings, key[1]) if spec is None else spec
    if isinstance(spec, InvalidSpec):
        return Snapshot(body, spec=spec)
    jobs = state.jobs(body)
    gpus = frozenset(state.indexes.nodes.get(spec.gpu_discovery.label_key, ())) if spec.gpu_discovery.auto else None
    secret = await api.read_secret(key[0], spec.storage.secret_name) if spec.storage.secret_name else None
    bundled = {b.variant for b in bundles_from_status(body.get("status"))}
    pods = {
        str(job["metadata"]["uid"]): await api.list_pods(key[0], f"controller-uid={job['metadata']['uid']}")
        for job in jobs
        if needs_pods(job, bundled)
    }
    return Snapshot(body, jobs, gpus or frozenset(), secret, pods, spec)


# -- decide ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NewJob:
    """A warm-up Job to create."""

    variant: Variant
    name: str
    manifest: Mapping[str, Any]


@dataclass(frozen=True)
class Actions:
    """What a reconcile does, decided from a snapshot alone."""

    generation: int
    failure: builders.Failure | None = None
    """The cache cannot be served at all (InvalidSpec, SecretNotFound, SecretKeyMissing, NoGPUNodes)."""
    storage_url: str | None = None
    spec: CacheSpec | None = None
    variants: tuple[Variant, ...] = ()
    create: tuple[NewJob, ...] = ()
    records: tuple[BundleRecord, ...] = ()
    """Bundles that succeeded Jobs published, to add to status."""
    count: tuple[JobState, ...] = ()
    """Finished Jobs to count once in the metrics (and mark as counted)."""
    bundles: tuple[BundleRecord, ...] = ()
    """Status bundles with ``records`` merged in, before pruning."""
    prune: tuple[BundleRecord, ...] = ()
    """Bundles outside retention, to delete from the store."""
    delete_jobs: tuple[str, ...] = ()
    job_states: Mapping[str, JobState] = field(default_factory=dict)
    """Per missing variant, where its Job stands."""
    finalizers: tuple[str, ...] | None = None
    """The cache's new finalizers (ours added for ``deletionPolicy: Delete``, removed for Keep), or None."""

    @property
    def warming(self) -> bool:
        return any(s.phase == "active" for s in self.job_states.values())


def recorded_bundles(
    snapshot: Snapshot, records: Sequence[BundleRecord], variants: Sequence[Variant], keep_generations: int
) -> tuple[tuple[BundleRecord, ...], tuple[BundleRecord, ...]]:
    """The status bundles with ``records`` merged in, and those of them outside retention."""
    bundles = tuple(merge_bundles(bundles_from_status(snapshot.body.get("status")), records))
    return bundles, tuple(bundles_to_prune(list(bundles), [v.id for v in variants], keep_generations))


def decide_actions(snapshot: Snapshot, settings: Settings) -> Actions:
    """Everything a reconcile of ``snapshot`` does, as data (no I/O)."""
    meta = snapshot.body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = int(meta.get("generation") or 1)
    spec = spec_of(snapshot.body, settings, name) if snapshot.spec is None else snapshot.spec
    if isinstance(spec, InvalidSpec):
        return Actions(generation, failure=builders.Failure("InvalidSpec", str(spec)))
    finalizers = finalizers_for(meta.get("finalizers") or [], spec)
    problem = secret_problem(spec.storage, snapshot.secret, namespace)
    if problem is not None:
        return Actions(generation, failure=problem, storage_url=spec.storage.url, spec=spec, finalizers=finalizers)
    variants = tuple(plan_variants(namespace, name, spec, snapshot.gpus))
    if not variants:
        message = f"spec.gpuDiscovery: no Node has the label {spec.gpu_discovery.label_key!r}"
        return Actions(generation, failure=builders.Failure("NoGPUNodes", message), storage_url=spec.storage.url,
                       spec=spec, finalizers=finalizers)
    observed = [
        (job, observe_job(job, snapshot.pods.get(str(job["metadata"].get("uid")), ())))
        for job in snapshot.jobs
    ]
    actions = _variant_actions(snapshot, spec, variants, observed, generation, settings)
    bundles, prune = recorded_bundles(snapshot, actions.records, variants, spec.keep_generations)
    delete = tuple(superseded_jobs([s for _, s in observed], {v.id for v in variants}))
    return replace(actions, storage_url=spec.storage.url, spec=spec, variants=variants, bundles=bundles,
                   prune=prune, delete_jobs=delete, finalizers=finalizers)


def finalizers_for(current: Sequence[str], spec: CacheSpec) -> tuple[str, ...] | None:
    """The finalizers a cache of ``spec`` should carry: ours only with ``deletionPolicy: Delete``
    (its bundles are deleted with it); None when ``current`` is right. An invalid spec changes
    nothing (it is never asked)."""
    wanted = spec.deletion_policy == "Delete"
    if wanted == (FINALIZER in current):
        return None
    return (*current, FINALIZER) if wanted else tuple(f for f in current if f != FINALIZER)


def _variant_actions(
    snapshot: Snapshot,
    spec: CacheSpec,
    variants: Sequence[Variant],
    observed: Sequence[tuple[Mapping[str, Any], JobState]],
    generation: int,
    settings: Settings,
) -> Actions:
    """The Jobs to create, the results to record and the states of the missing variants' Jobs."""
    create: list[NewJob] = []
    records: list[BundleRecord] = []
    states: dict[str, JobState] = {}
    unreadable: dict[str, JobState] = {}
    bundles = bundles_from_status(snapshot.body.get("status"))
    for variant in missing_variants(variants, bundles):
        step = decide(variant, observed, generation)
        if step.action == "record":
            assert step.job is not None and step.state is not None
            record = read_result(step.job, step.state, variant, snapshot.pods)
            if isinstance(record, BundleRecord):
                records.append(record)
            else:
                states[variant.id] = unreadable[record.name] = record
        elif step.state is not None:
            states[variant.id] = step.state
        else:
            new = new_job(snapshot.body, spec, variant, generation, settings)
            create.append(new)
            states[variant.id] = JobState(name=new.name, variant=variant.id, generation=generation,
                                          phase="active", reason="WarmupInProgress", message=describe_wait([]))
    count = [unreadable.get(s.name, s) for _, s in observed if s.phase != "active" and not s.recorded]
    return Actions(generation, create=tuple(create), records=tuple(records), count=tuple(count), job_states=states)


def read_result(
    job: Mapping[str, Any], job_state: JobState, variant: Variant, pods: Mapping[str, Sequence[Mapping[str, Any]]]
) -> BundleRecord | JobState:
    """The bundle a succeeded Job published, or a failed state when its result cannot be read."""
    try:
        message = publish_message(pods.get(str(job["metadata"].get("uid")), ()))
        return bundle_from_publish(message, variant, generation=job_state.generation, job=job_state.name)
    except ResultError as exc:
        return replace(job_state, variant=variant.id, phase="failed", reason="PublishResultUnreadable",
                       message=str(exc))


def new_job(
    body: Mapping[str, Any], spec: CacheSpec, variant: Variant, generation: int, settings: Settings
) -> NewJob:
    meta = body["metadata"]
    name = job_name(meta["name"], variant, generation)
    manifest = builders.build_job(
        body, spec, variant, name=name, job_id=plan_id(meta["namespace"], meta["name"], spec), settings=settings.jobs
    )
    return NewJob(variant, name, manifest)


def final_status(snapshot: Snapshot, actions: Actions, kept: Sequence[BundleRecord], prune_note: str,
                 now: str) -> dict[str, Any]:
    """The status after applying ``actions``: ``kept`` are the bundles left after pruning, and
    ``prune_note`` says what could not be pruned (the cache is then Degraded: StorePruneFailed)."""
    status = snapshot.body.get("status") or {}
    if actions.failure is not None:
        return builders.build_status(status, generation=actions.generation,
                                     conditions=builders.failure_conditions(actions.failure), bundles=None,
                                     planned_gpus=None, storage_url=actions.storage_url, now=now)
    conditions = builders.warmup_conditions(actions.variants, current_bundles(kept, actions.variants),
                                            actions.job_states)
    if prune_note and not any(c.type == "Degraded" and c.status for c in conditions):
        conditions = [c for c in conditions if c.type != "Degraded"]
        conditions.append(Condition("Degraded", True, "StorePruneFailed", prune_note))
    precompiled = builders.precompile_condition(current_bundles(kept, actions.variants))
    if precompiled is not None:
        conditions.append(precompiled)
    return builders.build_status(status, generation=actions.generation, conditions=conditions, bundles=kept,
                                 planned_gpus=[v.gpu_label for v in actions.variants],
                                 storage_url=actions.storage_url, now=now)


def outcome(actions: Actions, status: Mapping[str, Any], retry_seconds: float) -> Outcome:
    """What the handlers are told: ready, warming, a problem to look at again, an invalid spec."""
    failure = actions.failure
    if failure is not None and failure.reason == "InvalidSpec":
        return Outcome(invalid=failure.message)
    if failure is not None:
        return Outcome(problem=failure.message, retry_after=retry_seconds)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return Outcome(ready=ready, warming=actions.warming)


# -- apply -----------------------------------------------------------------------------------------
async def reconcile(
    state: State, namespace: str, name: str, *, emit: Emit | None = None, if_unsettled: bool = False
) -> Outcome | None:
    """Read, decide, apply for one cache; at most ``settings.concurrency`` at once, one at a time per
    cache. With ``if_unsettled``, nothing happens (None) when its inputs are those of its last
    settled reconcile."""
    key = (namespace, name)
    async with state.slots, state.locks.hold(key):
        body = state.cache(key)
        spec = spec_of(body, state.settings, name) if body is not None else None
        before = fingerprint(state, key, spec)
        if if_unsettled and state.settled.get(key) == before:
            return None
        try:
            snapshot = await read_snapshot(state, key, spec)
            if snapshot is None:
                return Outcome(gone=True)
            actions = decide_actions(snapshot, state.settings)
            result = await apply_actions(state, snapshot, actions, emit)
        except Exception as exc:  # every failure ends in a condition and an event, and is looked at again
            body = state.cache(key)
            if body is None:
                raise
            result = await report_failure(state, body, exc, emit)
        if result.problem or result.warming or actions.create or actions.count or actions.records:
            state.settled.pop(key, None)
        elif actions.finalizers is None:
            state.settled[key] = _settled_fingerprint(state, key, before)
        return result


async def handle(state: State, key: Key, emit: Emit | None) -> None:
    """What an event or the resync does about a cache: finish its deletion, or reconcile it if
    unsettled; a problem that may pass is looked at again after ``settings.retry_seconds``."""
    body = state.cache(key)
    if body is None:
        return
    if is_deleting(body):
        try:
            delay = await finalize(state, body, emit)
        except Exception as exc:  # said in the log and an event; tried again
            logger.warning("CompileCache %s/%s: finishing its deletion failed: %s", *key, describe(exc))
            post_warnings(state, body, [WarningEvent("CleanupFailed", f"deleting its bundles failed: {describe(exc)}")],
                          emit)
            delay = state.settings.retry_seconds
    else:
        result = await reconcile(state, *key, emit=emit, if_unsettled=True)
        delay = result.retry_after if result is not None and result.problem else None
    if delay is not None:
        look_again(state, key, delay, emit)


def look_again(state: State, key: Key, delay: float, emit: Emit | None) -> None:
    """Handle ``key`` again in ``delay`` seconds (once, however often asked)."""
    if key in state.retries:
        return

    def fire() -> None:
        state.retries.pop(key, None)
        task = asyncio.ensure_future(handle(state, key, emit))
        task.add_done_callback(_log_failure)

    state.retries[key] = asyncio.get_running_loop().call_later(delay, fire)


async def report_failure(state: State, body: Mapping[str, Any], exc: BaseException, emit: Emit | None) -> Outcome:
    """A reconcile that failed: Ready=False with the reason and what failed (:func:`failures.failure_of`),
    a Warning event, a log line; the cache is looked at again after ``settings.retry_seconds``. When
    even the status cannot be written, the event and the log say both."""
    failure = failure_of(exc)
    meta = body["metadata"]
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    logger.warning("CompileCache %s: %s: %s", where, failure.reason, failure.message,
                   exc_info=exc if failure.reason == "ReconcileFailed" else None)
    generation = int(meta.get("generation") or 1)
    status = builders.build_status(body.get("status"), generation=generation,
                                   conditions=builders.failure_conditions(failure), bundles=None,
                                   planned_gpus=None, storage_url=None, now=now_rfc3339())
    warning = failure_warning(failure)
    try:
        await write_status(state, body, status)
    except Exception as write_exc:
        logger.error("CompileCache %s: the status saying so could not be written either: %s", where, write_exc)
        warning = WarningEvent(failure.reason, f"{failure.message} (and the status could not be written: {write_exc})")
    post_warnings(state, body, [warning], emit)
    return Outcome(problem=failure.message, retry_after=state.settings.retry_seconds)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("looking again failed: %s", task.exception())


def _settled_fingerprint(state: State, key: Key, before: tuple[Any, ...]) -> tuple[Any, ...]:
    """The fingerprint to remember: the one read, with the version of a status just written."""
    written = state.written.get(key)
    return (written[1]["metadata"].get("resourceVersion"), *before[1:]) if written else before


async def apply_actions(state: State, snapshot: Snapshot, actions: Actions, emit: Emit | None) -> Outcome:
    api = state.api
    assert api is not None, "the API client is set at start-up"
    body = snapshot.body
    if actions.finalizers is not None:
        meta = body["metadata"]
        with step(f"setting the finalizers to {list(actions.finalizers)}"):
            await api.set_finalizers(meta["namespace"], meta["name"], meta.get("finalizers") or [], actions.finalizers)
    if actions.failure is not None:
        status = final_status(snapshot, actions, (), "", now_rfc3339())
        with step("writing the status"):
            await write_status(state, body, status)
        post_warnings(state, body, [failure_warning(actions.failure)], emit)
        return outcome(actions, status, state.settings.retry_seconds)
    unsigned = 0
    if state.settings.signing is not None and actions.records:
        actions, unsigned = await sign_new_records(actions, snapshot, state.settings.signing)
    namespace = str(body["metadata"]["namespace"])
    for new in actions.create:
        with step(f"creating warm-up Job {new.name}"):
            created = await api.create_job(namespace, new.manifest)
        if created:
            _emit(emit, body, "Normal", "WarmupStarted", f"Job {new.name} warms {new.variant.gpu_label}")
    gpus = {v.id: v.gpu_label for v in actions.variants}
    for job_state in actions.count:
        if await _count_job(state, job_state, body) and job_state.phase == "failed":
            warning = warmup_failed_warning(job_state, gpus.get(job_state.variant, job_state.variant or "unknown"))
            _emit(emit, body, "Warning", warning.reason, warning.message)
    kept, prune_note = await prune_bundles(actions, snapshot.secret)
    for job in actions.delete_jobs:
        with step(f"deleting superseded warm-up Job {job}"):
            await api.delete_job(namespace, job)
    status = final_status(snapshot, actions, kept, prune_note, now_rfc3339())
    with step("writing the status"):
        await write_status(state, body, status)
    state.metrics.set_bundles(namespace, str(body["metadata"]["name"]), kept)
    for record in actions.records:
        _emit(emit, body, "Normal", "BundlePublished", f"{record.gpu}: {record.key} ({record.bytes} bytes)")
        if record.precompile == "LeftOut":
            _emit(emit, body, "Warning", "PrecompileUnverified",
                  f"{record.gpu}: precompiled part left out of {record.key}: {record.precompile_reason}")
    post_warnings(state, body, [WarningEvent("StorePruneFailed", prune_note)] if prune_note else [], emit)
    result = outcome(actions, status, state.settings.retry_seconds)
    if unsigned:  # their Jobs stay: the next look signs and records them
        retry = state.settings.retry_seconds
        result = replace(result, problem=f"{unsigned} bundle(s) not signed yet", retry_after=retry)
    return result


async def sign_new_records(actions: Actions, snapshot: Snapshot, signing: Signing) -> tuple[Actions, int]:
    """Sign the new bundles in the store before they are recorded; those that cannot be signed are
    left out of status (and counted in the second value)."""
    assert actions.spec is not None
    signed = await _sign(actions.spec, list(actions.records), snapshot.secret, signing)
    unsigned = len(actions.records) - len(signed)
    if not unsigned:
        return actions, 0
    bundles, prune = recorded_bundles(snapshot, signed, actions.variants, actions.spec.keep_generations)
    return replace(actions, records=tuple(signed), bundles=bundles, prune=prune), unsigned


async def _sign(
    spec: CacheSpec, records: list[BundleRecord], secret: Mapping[str, bytes] | None, signing: Signing
) -> list[BundleRecord]:
    """Sign the new bundles in the store; those that cannot be signed are left out (and logged)."""

    def run(store: Store) -> list[BundleRecord]:
        signed = sign_records(store, signing, records)
        for record, reason in signed.failed:
            logger.warning("bundle %s not signed, not recorded yet: %s", record.key, reason)
        return list(signed.signed)

    try:
        signed = await in_store_thread(spec.storage.url, run, secret_credentials(spec.storage, secret))
    except StoreError as exc:
        logger.warning("cannot open the store to sign %d bundle(s): %s", len(records), exc)
        return []
    return signed


async def write_status(state: State, body: Mapping[str, Any], status: Mapping[str, Any]) -> None:
    """Write ``status`` unless it is what the cache has; remember the written object until the
    index sees it, so that a reconcile in between does not decide from the older one."""
    if not builders.status_changed(body.get("status"), status):
        return
    assert state.api is not None
    meta = body["metadata"]
    written = await state.api.patch_cache_status(meta["namespace"], meta["name"], status)
    if written.get("metadata"):
        state.written[(meta["namespace"], meta["name"])] = (str(meta.get("resourceVersion", "")), written)


async def _count_job(state: State, job_state: JobState, body: Mapping[str, Any]) -> bool:
    """Count a finished Job in the metrics once: the Job is annotated when counted (and remembered
    until the index shows the annotation). True when this call counted it."""
    assert state.api is not None
    namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
    result = "succeeded" if job_state.phase == "succeeded" else "failed"
    try:
        await state.api.annotate_job(namespace, job_state.name, {RECORDED_ANNOTATION: result})
    except Exception as exc:  # the Job may be gone; count it next time round
        logger.warning("could not mark Job %s/%s as counted: %s", namespace, job_state.name, exc)
        return False
    state.counted_jobs.add((namespace, job_state.name))
    state.metrics.count_warmup(namespace, name, result=result, seconds=job_state.duration)
    return True


async def prune_bundles(actions: Actions, secret: Mapping[str, bytes] | None) -> tuple[list[BundleRecord], str]:
    """Delete ``actions.prune`` from the store: the bundles left in status, and what failed."""
    if not actions.prune or actions.spec is None:
        return list(actions.bundles), ""
    spec = actions.spec
    credentials = secret_credentials(spec.storage, secret)

    def run(store: Store) -> storeops.DeleteReport:
        return storeops.delete_keys(store, [b.key for b in actions.prune])

    try:
        report = await in_store_thread(spec.storage.url, run, credentials)
    except StoreError as exc:
        return list(actions.bundles), f"pruning {len(actions.prune)} bundle(s) failed: {exc}"
    return pruned(actions.bundles, report)


def pruned(bundles: Iterable[BundleRecord], report: storeops.DeleteReport) -> tuple[list[BundleRecord], str]:
    """The bundles still in the store after a prune, and what could not be deleted."""
    gone = set(report.deleted)
    note = "; ".join(f"{key}: {err}" for key, err in report.failed)
    return [b for b in bundles if b.key not in gone], f"pruning failed: {note}" if note else ""


def post_warnings(state: State, body: Mapping[str, Any], current: Sequence[WarningEvent], emit: Emit | None) -> None:
    """Post the warnings of ``current`` that are new for this cache, and remember what stands."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    for warning in fresh_warnings(state.warnings.get(key, frozenset()), current):
        _emit(emit, body, "Warning", warning.reason, warning.message)
    if current:
        state.warnings[key] = frozenset(current)
    else:
        state.warnings.pop(key, None)


def _emit(emit: Emit | None, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    if emit is not None:
        try:
            emit(body, type_, reason, shown_message(message))
        except Exception as exc:  # events are best effort; the log keeps what it said
            logger.warning("event %s not posted (%s): %s", reason, exc, message)


# -- resync ----------------------------------------------------------------------------------------
def unsettled(state: State) -> list[Key]:
    """The caches whose inputs changed since their last settled reconcile, or that wait for
    something (a Job, a Secret, a GPU node): the only ones a resync reconciles."""
    return [key for key in state.indexes.cache_keys()
            if state.settled.get(key) != fingerprint(state, key) and key not in state.retries]


async def resync(state: State, emit: Emit | None) -> int:
    """Reconcile every unsettled cache (bounded by ``settings.concurrency``); errors are logged.
    Returns how many were reconciled."""
    keys = unsettled(state)

    async def one(key: Key) -> None:
        try:
            await handle(state, key, emit)
        except Exception as exc:
            logger.warning("resync of %s/%s failed: %s", key[0], key[1], exc)

    await asyncio.gather(*(one(key) for key in keys))
    return len(keys)


# -- deletion ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CleanupOutcome:
    done: bool
    message: str
    retry_after: float | None = None


async def finalize(state: State, body: Mapping[str, Any], emit: Emit | None) -> float | None:
    """A cache being deleted that carries our finalizer: delete its bundles, then the finalizer
    (after ``settings.delete_attempts`` failed attempts, anyway: BundlesLeft). The delay before
    the next attempt, or None when done."""
    meta = body["metadata"]
    current = list(meta.get("finalizers") or [])
    if FINALIZER not in current:
        return None
    key = (str(meta["namespace"]), str(meta["name"]))
    async with state.slots, state.locks.hold(key):
        result = await cleanup(state, body)
        attempts = state.delete_attempts[key] = state.delete_attempts.get(key, 0) + 1
        if result.done:
            _emit(emit, body, "Normal", "BundlesDeleted", result.message)
        elif attempts >= state.settings.delete_attempts:
            _emit(emit, body, "Warning", "BundlesLeft", f"gave up deleting bundles: {result.message}")
        else:
            logger.info("deleting the bundles of %s/%s: %s", key[0], key[1], result.message)
            return result.retry_after or state.settings.retry_seconds
        assert state.api is not None
        await state.api.set_finalizers(key[0], key[1], current, [f for f in current if f != FINALIZER])
        state.delete_attempts.pop(key, None)
        return None


async def cleanup(state: State, body: Mapping[str, Any]) -> CleanupOutcome:
    """Delete the bundles of a CompileCache with deletionPolicy Delete.

    Warm-up Jobs go first, and the store is cleared only once their pods are gone, so that no
    publish lands after the delete.
    """
    api = state.api
    assert api is not None
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for job in state.indexes.jobs.get(str(meta.get("uid", "")), ()):
        await api.delete_job(namespace, job["metadata"]["name"])
    label = builders.warmup_labels(name, Variant("", "", ""), 0)[WARMUP_LABEL]
    pods = [p for p in await api.list_pods(namespace, f"{WARMUP_LABEL}={label}")
            if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    if pods:
        return CleanupOutcome(False, f"waiting for {len(pods)} warm-up pod(s) to stop", retry_after=5.0)
    try:
        spec = parse_spec(body.get("spec"), state.settings.defaults, name=name)
    except InvalidSpec as exc:
        return CleanupOutcome(True, f"spec is invalid, bundles left in place: {exc}")
    secret = await api.read_secret(namespace, spec.storage.secret_name) if spec.storage.secret_name else None
    return await _clear_store(state, spec, secret, namespace, name)


async def _clear_store(
    state: State, spec: CacheSpec, secret: Mapping[str, bytes] | None, namespace: str, name: str
) -> CleanupOutcome:
    credentials = secret_credentials(spec.storage, secret)

    def run(store: Store) -> storeops.DeleteReport:
        return storeops.delete_cache(store, namespace, name)

    try:
        report = await in_store_thread(spec.storage.url, run, credentials)
    except StoreError as exc:
        return CleanupOutcome(False, f"store unavailable: {exc}", retry_after=state.settings.retry_seconds)
    if report.failed:
        return CleanupOutcome(False, f"{len(report.failed)} bundle(s) not deleted: {report.failed[0][1]}",
                              retry_after=state.settings.retry_seconds)
    state.metrics.forget_cache(namespace, name)
    return CleanupOutcome(True, f"deleted {len(report.deleted)} object(s) under {cache_prefix(namespace, name)}")


__all__ = ["Actions", "Emit", "Outcome", "Settings", "Snapshot", "State", "cleanup", "decide", "decide_actions",
           "finalize", "handle", "planned_gpu_types", "reconcile"]
