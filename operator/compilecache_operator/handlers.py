"""The Kopf handlers: thin wrappers that call the controller, the webhook and the metrics.

They are registered at import, in Kopf's default registry; each reads what it needs from its memo, the
operator's :class:`~compilecache_operator.startup.Runtime` (through :func:`~compilecache_operator.startup.runtime_of`),
which ``main`` builds and whose :meth:`~compilecache_operator.startup.Runtime.start` runs at Kopf's start-up:

- indexes (Kopf keeps them current from its watches): the CompileCaches (the webhook's view and
  the objects), their warm-up Jobs, the Nodes' labels. A reconcile reads them, not the API.
  Jobs and pods are watched with server-side label selectors (only warm-up Jobs, only opted-in pods);
- readiness: Kopf runs the first non-index handler only once every index is loaded; the first
  Node or CompileCache event therefore marks the operator Ready (``/readyz``), so no replica takes
  webhook traffic before it knows the caches;
- CompileCache events: reconcile a cache whose inputs changed since its last settled reconcile
  (:func:`scheduling.handle`); with ``deletionPolicy: Delete`` the cache carries the finalizer
  ``compilecache.io/bundles``, and its deletion deletes its bundles first. These are plain event
  handlers, not Kopf's change handlers, so Kopf itself writes nothing to the objects;
- the resync: a task of its own that handles the caches whose inputs changed or that still wait
  for something; an unchanged cache costs nothing;
- warm-up Job events: reconcile the owner as soon as a Job finishes;
- opted-in pod events: count each pod's preload result once (a sidecar's when the pod ends, at
  the latest from the DELETED event); and, once a workload container has ended with the verdict of
  ``cachelib.runtime`` in its termination message, tally why it started cold into its cache's
  ``status.coldStarts`` (:mod:`compilecache_operator.coldstarts`), once per pod;
- with leader election, only the replica holding the Lease acts (events, Jobs, pods, resync);
  every replica keeps its indexes and serves the webhook;
- the admission webhooks, registered by :func:`register_webhook` when the operator serves them and
  answered directly by its server (:mod:`compilecache_operator.kopfadapter`): the pod-mutating one
  (:mod:`compilecache_operator.webhook`) and, when asked for, the CompileCache validating one
  (:mod:`compilecache_operator.validation`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from compilecache_operator import cacheview, coldstarts, kopfadapter, podsecurity, scheduling, startup
from compilecache_operator.conditions import find, merge_conditions, now_rfc3339
from compilecache_operator.metrics import cache_gpus, instrumented
from compilecache_operator.names import (
    CACHE_LABEL,
    CACHE_WEBHOOK_ID,
    COLD_COUNTED_ANNOTATION,
    COUNTED_ANNOTATION,
    GPU_ANNOTATION,
    GROUP,
    KIND,
    NODE_CACHE_FALLBACK_ANNOTATION,
    PLURAL,
    RECORDED_ANNOTATION,
    VERSION,
    WARMUP_LABEL,
    WEBHOOK_ID,
)
from compilecache_operator.results import job_condition, preload_outcome
from compilecache_operator.startup import CountedPods, emit, runtime_of
from compilecache_operator.state import State, owner_uids

from cachelib.keyformat import gpu_slug

logger = logging.getLogger(__name__)
CC = (GROUP, VERSION, PLURAL)


def plain(body: kopf.Body) -> dict[str, Any]:
    """The object as a plain dict without ``managedFields`` (what the indexes keep)."""
    raw = dict(body)
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k != "managedFields"}
    return {**raw, "metadata": meta}


# -- start-up and shut-down ---------------------------------------------------------------------------
@kopf.on.login(id="login")
def login_handler(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return startup.login(**kwargs)


@kopf.on.startup(id="configure")
async def configure(settings: kopf.OperatorSettings, memo: object, **indexes: Any) -> None:
    await runtime_of(memo).start(settings, indexes)


@kopf.on.cleanup(id="close")
async def close(memo: object, **_: Any) -> None:
    await runtime_of(memo).stop()


# -- indexes --------------------------------------------------------------------------------------------
@kopf.index(*CC, id="caches")
def caches(namespace: str | None, name: str, body: kopf.Body, memo: object, **_: Any) -> dict[Any, Any]:
    """The webhook's view of each CompileCache."""
    settings = runtime_of(memo).state.settings
    return {(namespace or "", name): cacheview.cache_view(body, settings.defaults, settings.confinement)}


@kopf.index(*CC, id="cache_objects")
def cache_objects(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Each CompileCache as the controller reads it."""
    return {(namespace or "", name): plain(body)}


@kopf.index("batch", "v1", "jobs", id="warmup_jobs", labels={WARMUP_LABEL: kopf.PRESENT})
def warmup_jobs(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Warm-up Jobs by the uid of the CompileCache that owns them."""
    job = plain(body)
    return {uid: job for uid in owner_uids(job)}


@kopf.index("v1", "nodes", id="node_labels")
def node_labels(labels: kopf.Labels, **_: Any) -> dict[Any, Any]:
    """Node label key → value, for ``gpuDiscovery.auto`` (whichever label key a spec names)."""
    return dict(labels)


@kopf.index("v1", "namespaces", id="namespace_levels")
def namespace_levels(name: str, labels: kopf.Labels, **_: Any) -> dict[Any, Any]:
    """Each namespace's Pod Security enforce label ("" when unlabelled): where a node cache may be injected."""
    return {name: str(labels.get(podsecurity.ENFORCE_LABEL, ""))}


@kopf.on.event("v1", "nodes", id="ready-nodes", when=lambda memo, **_: not runtime_of(memo).state.cluster.ready)
@kopf.on.event(*CC, id="ready-caches", when=lambda memo, **_: not runtime_of(memo).state.cluster.ready)
async def mark_ready(memo: object, **_: Any) -> None:
    """Kopf runs this only after every index is loaded: from now on the webhook knows every cache."""
    runtime_of(memo).mark_ready()


# -- CompileCaches and their Jobs ------------------------------------------------------------------------
@kopf.on.event(*CC, id="cache-events")
@instrumented("reconcile")
async def cache_event(
    type: str, namespace: str | None, name: str, body: kopf.Body, memo: object, **_: Any
) -> None:
    """A created, changed or deleted CompileCache: reconcile it if what it reads changed, finish its
    deletion, or forget it. Plain events (no Kopf change handlers) keep Kopf from writing anything
    to the objects, so standby replicas can watch them too."""
    state = runtime_of(memo).state
    key = (namespace or "", name)
    if type == "DELETED":
        state.forget(key)
        return
    state.metrics.observe_cache(*key, body.get("status"))  # the Ready gauge, on every replica
    node_gpus = state.cluster.indexes.nodes.get(state.settings.defaults.gpu_label_key, ())
    state.metrics.know_cache(*key, cache_gpus(body.get("status"), node_gpus))  # its counters at 0, before events
    if state.lifecycle.leading:
        await scheduling.handle(state, key, emit)


@kopf.on.event("batch", "v1", "jobs", id="jobs", labels={WARMUP_LABEL: kopf.PRESENT})
@instrumented("jobs")
async def job_event(type: str, body: kopf.Body, namespace: str | None, memo: object, **_: Any) -> None:
    """A warm-up Job finished: record its result at once."""
    finished = job_condition(body, "Complete") or job_condition(body, "Failed")
    if type == "DELETED" or not finished or RECORDED_ANNOTATION in body.metadata.annotations:
        return
    state = runtime_of(memo).state
    if not state.lifecycle.leading:
        return
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            await scheduling.handle(state, (namespace or "", str(ref["name"])), emit)


# -- opted-in pods ---------------------------------------------------------------------------------------
@kopf.on.event(
    "v1", "pods",
    id="count-preloads",
    labels={CACHE_LABEL: kopf.PRESENT},
    when=lambda memo, **_: runtime_of(memo).state.lifecycle.leading,
)
@instrumented("count-preloads")
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, uid: str, memo: object, **_: Any
) -> None:
    """An opted-in pod changed: count its preload's result, then its workload's verdict, each once
    (the annotations say what was counted; Kopf filters on them on its side, so one handler)."""
    runtime = runtime_of(memo)
    annotations = body.metadata.annotations
    if COUNTED_ANNOTATION not in annotations:
        await count_preload(runtime.state, runtime.counted, type, body, namespace or "", name, uid)
    if COLD_COUNTED_ANNOTATION not in annotations:
        await count_cold_start(runtime.state, runtime.cold_counted, type, body, namespace or "", name, uid)


async def count_cold_start(
    state: State,
    counted: CountedPods,
    event_type: str,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    uid: str,
) -> None:
    """Tally one pod's verdict (hit, or the factor that made it compile afresh) into its cache's
    ``status.coldStarts`` once; when most pods started cold for one cause, the ``ColdStarts``
    condition turns True and a Warning event names the cause."""
    verdict = coldstarts.pod_verdict(body)
    if verdict is None or state.api is None or not counted.add(uid):
        return
    cache = str(((body.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL, ""))
    try:
        current = await state.api.get_cache(namespace, cache)
        if current is None:
            return
        status = current.get("status") or {}
        cold = coldstarts.tally(status.get("coldStarts"), verdict)
        patch: dict[str, Any] = {"coldStarts": cold}
        wanted = coldstarts.condition(cold)
        if wanted is not None:
            generation = int(status.get("observedGeneration") or current.get("metadata", {}).get("generation") or 0)
            conditions = status.get("conditions")
            patch["conditions"] = merge_conditions(conditions, [wanted], generation=generation, now=now_rfc3339())
            before = find(conditions, coldstarts.CONDITION)
            if wanted.status and (before is None or before.get("status") != "True"):
                emit(current, "Warning", wanted.reason, wanted.message)
        await state.api.patch_cache_status(namespace, cache, patch)
        if event_type != "DELETED":
            await state.api.annotate_pod(namespace, name, {COLD_COUNTED_ANNOTATION: verdict.cause})
    except Exception as exc:  # counted in memory; a restart before the retry could count it again
        logger.warning("could not tally the cold start of pod %s/%s: %s", namespace, name, exc)


def admission_hooks(check_caches: bool = False) -> list[kopfadapter.Hook]:
    """The webhooks the operator serves: the pod-mutating one (fails open) and, with ``check_caches``, the
    CompileCache validating one (fails closed)."""
    pods = kopfadapter.Hook(WEBHOOK_ID, "mutating", ("v1", "pods"), ("CREATE",), fail_open=True,
                            labels={CACHE_LABEL: kopf.PRESENT})
    caches = kopfadapter.Hook(CACHE_WEBHOOK_ID, "validating", CC, ("CREATE", "UPDATE"), fail_open=False)
    return [pods, caches] if check_caches else [pods]


def register_webhook(registry: kopf.OperatorRegistry | None = None, *, check_caches: bool = False) -> None:
    """Register the admission webhooks (once each): only an operator that serves them may (Kopf refuses
    admission handlers without a server)."""
    kopfadapter.register(admission_hooks(check_caches), registry)


async def count_preload(
    state: State,
    counted: CountedPods,
    event_type: str,
    body: kopf.Body,
    namespace: str,
    name: str,
    uid: str,
) -> None:
    """Count one opted-in pod's preload result once, then mark the pod as counted.

    An init container has terminated long before its pod ends; a native sidecar terminates only
    when the pod ends, and that status may first be seen in the DELETED event. It counts there
    too, without the annotation (no pod is left to carry it; ``counted`` keeps the count single).
    """
    outcome = preload_outcome(body, gpu_annotation=GPU_ANNOTATION)
    if outcome is None or not counted.add(uid):
        return
    cache = str(body.metadata.labels.get(CACHE_LABEL, ""))
    gpu = gpu_slug(outcome.gpu) if outcome.gpu else "unknown"
    state.metrics.count_preload(
        namespace, cache, gpu=gpu, result=outcome.result, reason=outcome.code,
        seconds=outcome.seconds if outcome.ran else None, size=outcome.bytes,
    )
    fallback = body.metadata.annotations.get(NODE_CACHE_FALLBACK_ANNOTATION)
    if fallback:
        state.metrics.count_node_cache_fallback(namespace, cache, fallback)
    if state.api is not None and event_type != "DELETED":
        try:
            await state.api.annotate_pod(namespace, name, {COUNTED_ANNOTATION: outcome.result})
        except Exception as exc:  # counted in memory; only a restart before the retry could recount
            logger.warning("could not mark pod %s/%s as counted: %s", namespace, name, exc)
