"""One reconcile of a CompileCache: read one snapshot, decide the actions, apply them.

- **read** (:func:`read_snapshot`): the CompileCache, its warm-up Jobs and the Nodes' GPU labels come
  from the operator's in-memory indexes (:class:`~compilecache_operator.controller.state.Indexes`, filled by
  Kopf's watches); the API is asked only for what no watch holds: the storage Secret, and the pods
  of Jobs whose outcome is still to be read (a Job of a variant without a bundle).
- **decide** (:func:`decide_actions`, pure): the plan, the Jobs to create, the results to record and
  count, the bundles to prune, the Jobs to delete, the conditions; :func:`final_status` turns them
  and the prune's result into the status.
- **apply** (:func:`apply_actions`): the API calls and store deletes, events, metrics; the status is
  written only when it changes.

When a reconcile runs (and how often) is :mod:`compilecache_operator.controller.scheduling`'s business.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cachelib.prediction import recorded_env
from cachelib.stores import Store, StoreError, in_store_thread
from compilecache_operator.controller.cache_warnings import (
    emit_event,
    failure_warning,
    post_warnings,
    warmup_failed_warning,
)
from compilecache_operator.controller.reconcile_failures import step
from compilecache_operator.controller.state import Emit, Key, Settings, State, WarningEvent
from compilecache_operator.decisions import cache_status, warmup_job
from compilecache_operator.decisions.job_reports import (
    JobState,
    ResultError,
    bundle_from_publish,
    describe_wait,
    observe_job,
    publish_message,
)
from compilecache_operator.decisions.plan import (
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
)
from compilecache_operator.edge import storeops
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.edge.signing import Signing, sign_records
from compilecache_operator.model.conditions import Condition, now_rfc3339
from compilecache_operator.model.confinement import check_confinement
from compilecache_operator.model.names import FINALIZER, RECORDED_ANNOTATION, VARIANT_LABEL
from compilecache_operator.model.spec import CacheSpec, InvalidSpec, StorageSpec
from compilecache_operator.model.spec_parse import parse_spec
from compilecache_operator.model.store_access import SecretReader

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What a reconcile tells its caller (the scheduling): ready, warming, a problem to look at again."""

    ready: bool = False
    warming: bool = False
    """Warm-up Jobs are running: Job events and the resync look again."""
    problem: str | None = None
    """A problem that may pass (a missing Secret, no GPU node yet): look again after ``retry_after``."""
    retry_after: float | None = None
    until_changed: bool = False
    """The problem ends only with a change of the cache's inputs (``retry_after`` is None): not looked at again
    until they change."""
    invalid: str | None = None
    """Set when the spec can never work: the field paths and what is wrong."""
    gone: bool = False


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
    """The storage Secret's data (None when the spec names none, it does not exist or may not be read)."""
    secret_forbidden: bool = False
    """The operator may not read the storage Secret (HTTP 403: no RoleBinding lets it in that namespace)."""
    pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """The pods of the Jobs whose outcome is to be read, by Job uid."""
    spec: CacheSpec | InvalidSpec | None = None
    """The checked spec, or why it is invalid (None: not checked yet, :func:`decide_actions` checks it)."""


async def read_snapshot(state: State, key: Key) -> Snapshot | None:
    """The snapshot of the cache ``key`` (None when it is gone or being deleted)."""
    api = state.api
    assert api is not None, "the API client is set at start-up"
    body = state.cluster.cache(key)
    if body is None or is_deleting(body):
        return None
    spec = cache_spec(state, body)
    if isinstance(spec, InvalidSpec):
        return Snapshot(body, spec=spec)
    jobs = state.cluster.jobs(body)
    nodes = state.cluster.indexes.nodes
    gpus = frozenset(nodes.get(spec.gpu_discovery.label_key, ())) if spec.gpu_discovery.auto else None
    secret, forbidden = await read_storage_secret(api, key[0], spec.storage)
    bundled = {b.variant for b in bundles_from_status(body.get("status"))}
    pods = {
        str(job["metadata"]["uid"]): await api.list_pods(key[0], f"controller-uid={job['metadata']['uid']}")
        for job in jobs
        if needs_pods(job, bundled)
    }
    return Snapshot(body, jobs, gpus or frozenset(), secret, forbidden, pods, spec)


async def read_storage_secret(
    api: KubeAPI, namespace: str, storage: StorageSpec
) -> tuple[dict[str, bytes] | None, bool]:
    """The storage Secret's data (None: the spec names none, or none of that name exists), and whether the
    operator may not read it (HTTP 403)."""
    if not storage.secret_name:
        return None, False
    try:
        return await api.read_secret(namespace, storage.secret_name), False
    except KubeError as exc:
        if exc.status == 403:
            return None, True
        raise


def cache_spec(state: State, body: Mapping[str, Any]) -> CacheSpec | InvalidSpec:
    """The checked spec of ``body``, a CompileCache of the cluster view (:func:`spec_of`), parsed once
    for each spec and each version of the settings: the fingerprint, the snapshot, the decisions and
    the deletion share it (a new status leaves the spec as it was)."""
    meta = body["metadata"]
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    held = state.cluster.specs.get(key)
    if held is not None and held[1] is state.settings:
        if held[0] is body:
            return held[2]
        if held[0].get("spec") == body.get("spec"):
            state.cluster.specs[key] = (body, held[1], held[2])
            return held[2]
    spec = spec_of(body, state.settings, key[1])
    state.cluster.specs[key] = (body, state.settings, spec)
    return spec


def spec_of(body: Mapping[str, Any], settings: Settings, name: str) -> CacheSpec | InvalidSpec:
    """:func:`checked_spec`, or the InvalidSpec it raised."""
    try:
        return checked_spec(body, settings, name)
    except InvalidSpec as exc:
        return exc


def checked_spec(body: Mapping[str, Any], settings: Settings, name: str) -> CacheSpec:
    """The parsed spec, within the cluster admin's allow-lists (InvalidSpec otherwise): checked
    before its Secret is read or handed to anything."""
    spec = parse_spec(body.get("spec"), settings.defaults, name=name)
    check_confinement(settings.confinement, str(body["metadata"].get("namespace", "")), spec)
    return spec


def needs_pods(job: Mapping[str, Any], bundled: Collection[str]) -> bool:
    """Whether deciding about ``job`` reads its pods: unless its result is counted and its variant has
    a bundle, the pods say what it waits for, why it failed or what it published."""
    meta = job.get("metadata") or {}
    recorded = RECORDED_ANNOTATION in (meta.get("annotations") or {})
    return not recorded or (meta.get("labels") or {}).get(VARIANT_LABEL) not in bundled


def is_deleting(body: Mapping[str, Any] | None) -> bool:
    return body is None or bool((body.get("metadata") or {}).get("deletionTimestamp"))


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
    failure: cache_status.Failure | None = None
    """The cache cannot be served at all (InvalidSpec, SecretNotFound, SecretForbidden, SecretKeyMissing,
    NoGPUNodes)."""
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


def decide_actions(snapshot: Snapshot, settings: Settings) -> Actions:
    """Everything a reconcile of ``snapshot`` does, as data (no I/O)."""
    meta = snapshot.body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    generation = int(meta.get("generation") or 1)
    spec = spec_of(snapshot.body, settings, name) if snapshot.spec is None else snapshot.spec
    if isinstance(spec, InvalidSpec):
        return Actions(generation, failure=cache_status.Failure("InvalidSpec", str(spec)))
    finalizers = finalizers_for(meta.get("finalizers") or [], spec)
    problem = secret_problem(spec.storage, snapshot.secret, namespace, settings.secret_reader
                             if snapshot.secret_forbidden else None)
    if problem is not None:
        return Actions(generation, failure=problem, storage_url=spec.storage.url, spec=spec, finalizers=finalizers)
    variants = tuple(plan_variants(namespace, name, spec, snapshot.gpus))
    if not variants:
        message = f"spec.gpuDiscovery: no Node has the label {spec.gpu_discovery.label_key!r}"
        return Actions(generation, failure=cache_status.Failure("NoGPUNodes", message), storage_url=spec.storage.url,
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


def secret_problem(
    storage: StorageSpec, data: Mapping[str, bytes] | None, namespace: str, forbidden: SecretReader | None = None
) -> cache_status.Failure | None:
    """Why the storage Secret cannot be used, or None; ``forbidden``: the operator may not read it (the reader
    says how the namespace lets it)."""
    if not storage.secret_name:
        return None
    if forbidden is not None:
        return secret_forbidden(storage, namespace, forbidden)
    if data is None:
        return cache_status.Failure(
            "SecretNotFound",
            f"spec.storage.secretRef.name: Secret {storage.secret_name!r} not found in namespace {namespace!r}",
        )
    for cred in storage.secret_keys:
        if not cred.optional and cred.key not in data:
            return cache_status.Failure(
                "SecretKeyMissing",
                f"spec.storage.secretRef.keys: Secret {storage.secret_name!r} has no key {cred.key!r} ({cred.env})",
            )
    return None


def secret_forbidden(storage: StorageSpec, namespace: str, reader: SecretReader) -> cache_status.Failure:
    """The storage Secret may not be read by the operator (HTTP 403), with how the namespace lets it."""
    return cache_status.Failure(
        "SecretForbidden",
        f"spec.storage.secretRef.name: the operator may not read Secret {storage.secret_name!r} in namespace "
        f"{namespace!r} (HTTP 403); {reader.how_to_allow(namespace)}",
    )


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


def read_result(
    job: Mapping[str, Any], job_state: JobState, variant: Variant, pods: Mapping[str, Sequence[Mapping[str, Any]]]
) -> BundleRecord | JobState:
    """The bundle a succeeded Job published, or a failed state when its result cannot be read."""
    try:
        message = publish_message(pods.get(str(job["metadata"].get("uid")), ()))
        record = bundle_from_publish(message, variant, generation=job_state.generation, job=job_state.name)
        return with_warmup_env(record, job)
    except ResultError as exc:
        return replace(job_state, variant=variant.id, phase="failed", reason="PublishResultUnreadable",
                       message=str(exc))


def with_warmup_env(record: BundleRecord, job: Mapping[str, Any]) -> BundleRecord:
    """``record`` with the key-factor variables its Job's compile container ran with (what the admission compares
    a pod's with): read from the Job, not the spec, which may have changed since."""
    values, elsewhere = recorded_env(warmup_job.compile_env(job))
    return replace(record, warmup_env=tuple(sorted(values.items())), warmup_env_elsewhere=tuple(elsewhere))


def new_job(
    body: Mapping[str, Any], spec: CacheSpec, variant: Variant, generation: int, settings: Settings
) -> NewJob:
    meta = body["metadata"]
    name = job_name(meta["name"], variant, generation)
    manifest = warmup_job.build_job(
        body, spec, variant, name=name, job_id=plan_id(meta["namespace"], meta["name"], spec), settings=settings.jobs
    )
    return NewJob(variant, name, manifest)


def recorded_bundles(
    snapshot: Snapshot, records: Sequence[BundleRecord], variants: Sequence[Variant], keep_generations: int
) -> tuple[tuple[BundleRecord, ...], tuple[BundleRecord, ...]]:
    """The status bundles with ``records`` merged in, and those of them outside retention."""
    bundles = tuple(merge_bundles(bundles_from_status(snapshot.body.get("status")), records))
    return bundles, tuple(bundles_to_prune(list(bundles), [v.id for v in variants], keep_generations))


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


def final_status(snapshot: Snapshot, actions: Actions, kept: Sequence[BundleRecord], prune_note: str,
                 now: str) -> dict[str, Any]:
    """The status after applying ``actions``: ``kept`` are the bundles left after pruning, and
    ``prune_note`` says what could not be pruned (the cache is then Degraded: StorePruneFailed)."""
    status = snapshot.body.get("status") or {}
    if actions.failure is not None:
        return cache_status.build_status(status, generation=actions.generation,
                                     conditions=cache_status.failure_conditions(actions.failure), bundles=None,
                                     planned_gpus=None, storage_url=actions.storage_url, now=now)
    conditions = cache_status.warmup_conditions(actions.variants, current_bundles(kept, actions.variants),
                                            actions.job_states)
    if prune_note and not any(c.type == "Degraded" and c.status for c in conditions):
        conditions = [c for c in conditions if c.type != "Degraded"]
        conditions.append(Condition("Degraded", True, "StorePruneFailed", prune_note))
    precompiled = cache_status.precompile_condition(current_bundles(kept, actions.variants))
    if precompiled is not None:
        conditions.append(precompiled)
    return cache_status.build_status(status, generation=actions.generation, conditions=conditions, bundles=kept,
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
            emit_event(emit, body, "Normal", "WarmupStarted", f"Job {new.name} warms {new.variant.gpu_label}")
    gpus = {v.id: v.gpu_label for v in actions.variants}
    for job_state in actions.count:
        if await _count_job(state, job_state, body) and job_state.phase == "failed":
            warning = warmup_failed_warning(job_state, gpus.get(job_state.variant, job_state.variant or "unknown"))
            emit_event(emit, body, "Warning", warning.reason, warning.message)
    kept, prune_note = await prune_bundles(actions, snapshot.secret)
    for job in actions.delete_jobs:
        with step(f"deleting superseded warm-up Job {job}"):
            await api.delete_job(namespace, job)
    status = final_status(snapshot, actions, kept, prune_note, now_rfc3339())
    with step("writing the status"):
        await write_status(state, body, status)
    state.metrics.set_bundles(namespace, str(body["metadata"]["name"]), kept)
    for record in actions.records:
        emit_event(emit, body, "Normal", "BundlePublished", f"{record.gpu}: {record.key} ({record.bytes} bytes)")
        if record.precompile == "LeftOut":
            emit_event(emit, body, "Warning", "PrecompileUnverified",
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
    if not cache_status.status_changed(body.get("status"), status):
        return
    assert state.api is not None
    meta = body["metadata"]
    written = await state.api.patch_cache_status(meta["namespace"], meta["name"], status)
    state.cluster.remember((meta["namespace"], meta["name"]), written)


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
    state.cluster.counted_jobs.add((namespace, job_state.name))
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


def secret_credentials(storage: StorageSpec, data: Mapping[str, bytes] | None) -> dict[str, str]:
    """The credentials as the store reads them from the environment (names of the env variables)."""
    if not data:
        return {}
    return {c.env: data[c.key].decode() for c in storage.secret_keys if c.key in data}


