"""The CompileCache reconcile loop: read, plan, act, record.

``reconcile`` reads the CompileCache afresh, parses its spec, plans the variants, creates the
warm-up Job of each missing variant (create-if-absent under a deterministic name), records the
bundles of finished Jobs, prunes bundles outside retention and writes the status. It is
idempotent, so Kopf may call it from change handlers, a timer and Job events alike; a lock per
CompileCache keeps those calls from interleaving. Decisions are made by pure functions
(spec, plan, builders, results); this module holds the I/O around them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache_operator import builders, storeops
from compilecache_operator.conditions import Condition, now_rfc3339
from compilecache_operator.confinement import Confinement, check_confinement
from compilecache_operator.kube import KubeAPI
from compilecache_operator.metrics import Metrics
from compilecache_operator.names import EXCLUDED_NAMESPACES, RECORDED_ANNOTATION, WARMUP_LABEL
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
from compilecache_operator.results import JobState, ResultError, bundle_from_publish, observe_job, publish_message
from compilecache_operator.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.signing import Signing, sign_records
from compilecache_operator.spec import CacheSpec, Defaults, InvalidSpec, StorageSpec, parse_spec

from cachelib.keys import cache_prefix
from cachelib.stores import StoreError

logger = logging.getLogger(__name__)


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

    def in_scope(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    @property
    def excluded_namespaces(self) -> frozenset[str]:
        """Namespaces whose pods are never injected: the system ones and the operator's own."""
        own = {self.operator_namespace} if self.operator_namespace else set()
        return EXCLUDED_NAMESPACES | own


@dataclass
class State:
    """What the handlers share: settings, metrics, the API client, per-cache locks, native-sidecar support."""

    settings: Settings
    metrics: Metrics
    api: KubeAPI | None = None
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    sidecars: SidecarSupport = NOT_DETECTED
    """Whether pods may get the preload as a native sidecar (decided at start-up)."""
    fallbacks_logged: set[tuple[str, str]] = field(default_factory=set)
    """Caches whose Sidecar request was turned into an init container, already said in the log."""
    warnings: dict[tuple[str, str], frozenset[WarningEvent]] = field(default_factory=dict)
    """Per cache, the Warning events of problems still standing: each is posted when it begins."""

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self.locks.setdefault((namespace, name), asyncio.Lock())


@dataclass(frozen=True)
class Outcome:
    ready: bool = False
    warming: bool = False
    """Warm-up Jobs are running: Job events and the timer look again."""
    problem: str | None = None
    """A problem that may pass (a missing Secret, no GPU node yet): look again after ``retry_after``."""
    retry_after: float | None = None
    invalid: str | None = None
    """Set when the spec can never work: the field paths and what is wrong."""
    gone: bool = False


Emit = Any  # a callable (body, type, reason, message) -> None; kopf.event in the operator


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
    (the resync loop reconciles every minute; one event per problem, not one per minute). A
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


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


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


# -- reconcile --------------------------------------------------------------------------------------
async def reconcile(state: State, namespace: str, name: str, *, emit: Emit | None = None) -> Outcome:
    async with state.lock(namespace, name):
        return await _reconcile(state, namespace, name, emit=emit)


async def _reconcile(state: State, namespace: str, name: str, *, emit: Emit | None) -> Outcome:
    api = state.api
    assert api is not None, "the API client is set at start-up"
    settings = state.settings
    body = await api.get_cache(namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(gone=True)
    meta = body["metadata"]
    generation = int(meta.get("generation") or 1)
    status = body.get("status") or {}

    try:
        spec = parse_spec(body.get("spec"), settings.defaults, name=name)
        check_confinement(settings.confinement, namespace, spec)  # before the Secret is read or used
    except InvalidSpec as exc:
        failure = builders.Failure("InvalidSpec", str(exc))
        await _write_failure(api, body, failure, storage=None)
        post_warnings(state, body, [failure_warning(failure)], emit)
        return Outcome(invalid=str(exc))

    secret = await api.read_secret(namespace, spec.storage.secret_name) if spec.storage.secret_name else None
    problem = secret_problem(spec.storage, secret, namespace)
    if problem is not None:
        await _write_failure(api, body, problem, storage=spec.storage.url)
        post_warnings(state, body, [failure_warning(problem)], emit)
        return Outcome(problem=problem.message, retry_after=settings.retry_seconds)

    discovered = await api.node_label_values(spec.gpu_discovery.label_key) if spec.gpu_discovery.auto else set()
    variants = plan_variants(namespace, name, spec, discovered)
    if not variants:
        failure = builders.Failure(
            "NoGPUNodes", f"spec.gpuDiscovery: no Node has the label {spec.gpu_discovery.label_key!r}"
        )
        await _write_failure(api, body, failure, storage=spec.storage.url)
        post_warnings(state, body, [failure_warning(failure)], emit)
        return Outcome(problem=failure.message, retry_after=settings.retry_seconds)

    bundles = bundles_from_status(status)
    jobs = await _owned_jobs(api, body)
    observed = [(job, observe_job(job, await _job_pods(api, job))) for job in jobs]

    new_records: list[BundleRecord] = []
    job_states: dict[str, JobState] = {}
    unreadable: dict[str, JobState] = {}
    running = False
    for variant in missing_variants(variants, bundles):
        step = decide(variant, observed, generation)
        if step.action == "record":
            assert step.job is not None and step.state is not None
            record, failed = await _record(api, step.job, step.state, variant)
            if record is not None:
                new_records.append(record)
            if failed is not None:
                job_states[variant.id] = unreadable[failed.name] = failed
        elif step.action in ("wait", "failed"):
            assert step.state is not None
            job_states[variant.id] = step.state
            running = running or step.action == "wait"
        else:
            job_states[variant.id] = await _create_job(api, body, spec, variant, generation, settings, emit)
            running = True
    gpus = {v.id: v.gpu_label for v in variants}
    for _job, job_state in observed:
        if job_state.phase != "active":
            counted = unreadable.get(job_state.name, job_state)
            if await _count_job(state, counted, namespace, name) and counted.phase == "failed":
                warning = warmup_failed_warning(counted, gpus.get(counted.variant, counted.variant or "unknown"))
                _emit(emit, body, "Warning", warning.reason, warning.message)

    if settings.signing is not None and new_records:
        new_records, unsigned = await _sign(spec, new_records, secret, settings.signing)
        running = running or unsigned  # the Job is still there: the next pass signs and records it
    bundles = merge_bundles(bundles, new_records)
    bundles, prune_note = await _prune(body, spec, bundles, variants, secret)
    await _delete_superseded_jobs(api, namespace, observed, variants)

    conditions = builders.warmup_conditions(variants, current_bundles(bundles, variants), job_states)
    if prune_note and not any(c.type == "Degraded" and c.status for c in conditions):
        conditions = [c for c in conditions if c.type != "Degraded"]
        conditions.append(Condition("Degraded", True, "StorePruneFailed", prune_note))
    new_status = builders.build_status(
        status,
        generation=generation,
        conditions=conditions,
        bundles=bundles,
        planned_gpus=[v.gpu_label for v in variants],
        storage_url=spec.storage.url,
        now=now_rfc3339(),
    )
    if builders.status_changed(status, new_status):
        await api.patch_cache_status(namespace, name, new_status)
    state.metrics.set_bundles(namespace, name, bundles)
    for record in new_records:
        _emit(emit, body, "Normal", "BundlePublished", f"{record.gpu}: {record.key} ({record.bytes} bytes)")
    post_warnings(state, body, [WarningEvent("StorePruneFailed", prune_note)] if prune_note else [], emit)
    ready = any(c.type == "Ready" and c.status for c in conditions)
    return Outcome(ready=ready, warming=running)


async def _write_failure(
    api: KubeAPI, body: Mapping[str, Any], failure: builders.Failure, *, storage: str | None
) -> None:
    meta = body["metadata"]
    status = body.get("status") or {}
    new_status = builders.build_status(
        status,
        generation=int(meta.get("generation") or 1),
        conditions=builders.failure_conditions(failure),
        bundles=None,
        planned_gpus=None,
        storage_url=storage,
        now=now_rfc3339(),
    )
    if builders.status_changed(status, new_status):
        await api.patch_cache_status(meta["namespace"], meta["name"], new_status)


async def _owned_jobs(api: KubeAPI, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = body["metadata"]
    label = builders.warmup_labels(meta["name"], Variant("", "", ""), 0)[WARMUP_LABEL]
    jobs = await api.list_jobs(meta["namespace"], f"{WARMUP_LABEL}={label}")
    return [j for j in jobs if owned_by(j, meta["uid"])]


async def _job_pods(api: KubeAPI, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    meta = job.get("metadata") or {}
    return await api.list_pods(meta["namespace"], f"controller-uid={meta['uid']}")


async def _record(
    api: KubeAPI, job: Mapping[str, Any], job_state: JobState, variant: Variant
) -> tuple[BundleRecord | None, JobState | None]:
    """The bundle a succeeded Job published, or a failed state when its result cannot be read."""
    pods = await _job_pods(api, job)
    try:
        message = publish_message(pods)
        record = bundle_from_publish(message, variant, generation=job_state.generation, job=job_state.name)
    except ResultError as exc:
        return None, JobState(
            name=job_state.name, variant=variant.id, generation=job_state.generation, phase="failed",
            reason="PublishResultUnreadable", message=str(exc), recorded=job_state.recorded,
            duration=job_state.duration,
        )
    return record, None


async def _count_job(state: State, job_state: JobState, namespace: str, name: str) -> bool:
    """Count a finished Job in the metrics once: the Job is annotated when counted. True when
    this call counted it."""
    if job_state.recorded or state.api is None:
        return False
    result = "succeeded" if job_state.phase == "succeeded" else "failed"
    try:
        await state.api.annotate_job(namespace, job_state.name, {RECORDED_ANNOTATION: result})
    except Exception as exc:  # the Job may be gone; count it next time round
        logger.warning("could not mark Job %s/%s as counted: %s", namespace, job_state.name, exc)
        return False
    state.metrics.count_warmup(namespace, name, result=result, seconds=job_state.duration)
    return True


async def _create_job(
    api: KubeAPI,
    body: Mapping[str, Any],
    spec: CacheSpec,
    variant: Variant,
    generation: int,
    settings: Settings,
    emit: Emit | None,
) -> JobState:
    meta = body["metadata"]
    name = job_name(meta["name"], variant, generation)
    job = builders.build_job(
        body, spec, variant, name=name, job_id=plan_id(meta["namespace"], meta["name"], spec), settings=settings.jobs
    )
    created = await api.create_job(meta["namespace"], job)
    if created:
        _emit(emit, body, "Normal", "WarmupStarted", f"Job {name} warms {variant.gpu_label}")
    return JobState(name=name, variant=variant.id, generation=generation, phase="active",
                    reason="WarmupInProgress", message="Job created")


async def _sign(
    spec: CacheSpec, records: list[BundleRecord], secret: Mapping[str, bytes] | None, signing: Signing
) -> tuple[list[BundleRecord], bool]:
    """Sign the new bundles in the store; those that cannot be signed are left out (and logged)."""

    def run() -> list[BundleRecord]:
        with storeops.open_cache_store(spec.storage.url, secret_credentials(spec.storage, secret)) as store:
            outcome = sign_records(store, signing, records)
        for record, reason in outcome.failed:
            logger.warning("bundle %s not signed, not recorded yet: %s", record.key, reason)
        return list(outcome.signed)

    try:
        signed = await asyncio.to_thread(run)
    except StoreError as exc:
        logger.warning("cannot open the store to sign %d bundle(s): %s", len(records), exc)
        return [], True
    return signed, len(signed) < len(records)


async def _prune(
    body: Mapping[str, Any],
    spec: CacheSpec,
    bundles: list[BundleRecord],
    variants: Sequence[Variant],
    secret: Mapping[str, bytes] | None,
) -> tuple[list[BundleRecord], str]:
    """Delete bundles outside retention from the store; those that fail stay in status."""
    prune = bundles_to_prune(bundles, [v.id for v in variants], spec.keep_generations)
    if not prune:
        return bundles, ""
    credentials = secret_credentials(spec.storage, secret)

    def run() -> storeops.DeleteReport:
        with storeops.open_cache_store(spec.storage.url, credentials) as store:
            return storeops.delete_keys(store, [b.key for b in prune])

    try:
        report = await asyncio.to_thread(run)
    except StoreError as exc:
        return bundles, f"pruning {len(prune)} bundle(s) failed: {exc}"
    gone = set(report.deleted)
    kept = [b for b in bundles if b.key not in gone]
    note = "; ".join(f"{key}: {err}" for key, err in report.failed)
    return kept, f"pruning failed: {note}" if note else ""


async def _delete_superseded_jobs(
    api: KubeAPI,
    namespace: str,
    observed: Sequence[tuple[Mapping[str, Any], JobState]],
    variants: Sequence[Variant],
) -> None:
    """Delete finished Jobs that no longer tell anything: those of variants outside the plan, and
    failed ones of a variant that has a newer Job. The current plan's last Jobs stay for inspection."""
    for name in superseded_jobs([s for _, s in observed], {v.id for v in variants}):
        await api.delete_job(namespace, name)


def superseded_jobs(states: Sequence[JobState], planned: set[str]) -> list[str]:
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
            emit(body, type_, reason, message)
        except Exception as exc:  # events are best effort
            logger.debug("event %s not posted: %s", reason, exc)


# -- deletion ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CleanupOutcome:
    done: bool
    message: str
    retry_after: float | None = None


async def cleanup(state: State, body: Mapping[str, Any]) -> CleanupOutcome:
    """Delete the bundles of a CompileCache with deletionPolicy Delete.

    Warm-up Jobs go first, and the store is cleared only once their pods are gone, so that no
    publish lands after the delete.
    """
    api = state.api
    assert api is not None
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for job in await _owned_jobs(api, body):
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
    credentials = secret_credentials(spec.storage, secret)

    def run() -> storeops.DeleteReport:
        with storeops.open_cache_store(spec.storage.url, credentials) as store:
            return storeops.delete_cache(store, namespace, name)

    try:
        report = await asyncio.to_thread(run)
    except StoreError as exc:
        return CleanupOutcome(False, f"store unavailable: {exc}", retry_after=state.settings.retry_seconds)
    if report.failed:
        return CleanupOutcome(False, f"{len(report.failed)} bundle(s) not deleted: {report.failed[0][1]}",
                              retry_after=state.settings.retry_seconds)
    state.metrics.forget_cache(namespace, name)
    return CleanupOutcome(True, f"deleted {len(report.deleted)} object(s) under {cache_prefix(namespace, name)}")


__all__ = ["Outcome", "Settings", "State", "cleanup", "decide", "planned_gpu_types", "reconcile"]
