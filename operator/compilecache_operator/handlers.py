"""The Kopf handlers: thin wrappers that call the controller, the webhook and the metrics.

They are registered at import, in Kopf's default registry; each reads what it needs from its memo, the
operator's :class:`~compilecache_operator.lifecycle.Runtime` (through
:func:`~compilecache_operator.lifecycle.runtime_of`),
which ``main`` builds and whose :meth:`~compilecache_operator.lifecycle.Runtime.start` runs at Kopf's start-up:

- the start-up handler starts the operator's own watches of CompileCaches, warm-up Jobs and Nodes
  (:mod:`compilecache_operator.controller.watches`; not Kopf's indexes, whose cost grows faster than the square
  of the number of objects) and returns once the namespaces are listed: from then on the webhook answers
  every pod as it will once every cache is known (a cache not listed yet is read when its pod asks), its
  server starts and the operator is Ready (``/readyz``); reconciles begin once every watch has listed.
  Their changes queue reconciles
  (:mod:`compilecache_operator.controller.scheduling`): a cache whose inputs changed since its last settled
  reconcile, the owner of a warm-up Job that finished; with ``deletionPolicy: Delete`` the cache
  carries the finalizer ``compilecache.io/bundles``, and its deletion deletes its bundles first. Kopf
  itself writes nothing to the CompileCaches;
- the resync: a task of its own that handles the caches whose inputs changed or that still wait
  for something; an unchanged cache costs nothing;
- opted-in pod events (watched by Kopf with a server-side label selector): count each pod's preload
  result once (a sidecar's when the pod ends, at the latest from the DELETED event); and, once a
  workload container has ended with the verdict of ``cachelib.runtime`` in its termination message,
  tally why it started cold into its cache's ``status.coldStarts``
  (:mod:`compilecache_operator.decisions.coldstarts`), once per pod;
- with leader election, only the replica holding the Lease acts (reconciles, Jobs, pods, resync);
  every replica keeps its watches and serves the webhook;
- the admission webhooks, registered by :func:`register_webhook` when the operator serves them and
  answered directly by its server (:mod:`compilecache_operator.edge.kopfadapter`): the pod-mutating one
  (:mod:`compilecache_operator.admission.webhook`) and, when asked for, the CompileCache validating one
  (:mod:`compilecache_operator.admission.validation`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from cachelib.keyformat import gpu_slug
from compilecache_operator import lifecycle
from compilecache_operator.controller.state import Emit, State
from compilecache_operator.decisions import coldstarts
from compilecache_operator.decisions.job_reports import preload_outcome
from compilecache_operator.edge import kopfadapter
from compilecache_operator.edge.metrics import instrumented
from compilecache_operator.lifecycle import CountedPods, runtime_of
from compilecache_operator.model.conditions import find, merge_conditions, now_rfc3339
from compilecache_operator.model.names import (
    CACHE_LABEL,
    CACHE_WEBHOOK_ID,
    COLD_COUNTED_ANNOTATION,
    COUNTED_ANNOTATION,
    GPU_ANNOTATION,
    GROUP,
    NODE_CACHE_FALLBACK_ANNOTATION,
    PLURAL,
    VERSION,
    WEBHOOK_ID,
)

logger = logging.getLogger(__name__)
CC = (GROUP, VERSION, PLURAL)


# -- start-up and shut-down ---------------------------------------------------------------------------
@kopf.on.login(id="login")
def login_handler(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return lifecycle.login(**kwargs)


@kopf.on.startup(id="configure")
async def configure(settings: kopf.OperatorSettings, memo: object, **_: Any) -> None:
    await runtime_of(memo).start(settings)


@kopf.on.cleanup(id="close")
async def close(memo: object, **_: Any) -> None:
    await runtime_of(memo).stop()


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
        await count_cold_start(runtime.state, runtime.cold_counted, type, body, namespace or "", name, uid,
                               runtime.emit)


async def count_cold_start(
    state: State,
    counted: CountedPods,
    event_type: str,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    uid: str,
    emit: Emit | None = None,
) -> None:
    """Tally one pod's verdict (hit, or the factor that made it compile afresh) into its cache's
    ``status.coldStarts`` once; when most pods started cold for one cause, the ``ColdStarts``
    condition turns True and a Warning event names the cause."""
    verdict = coldstarts.pod_verdict(body)
    if verdict is None or state.api is None or not counted.add(uid):
        return
    cache = str(((body.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL, ""))
    state.metrics.count_start(namespace, cache, result=verdict.result, cause=verdict.cause)
    prediction = coldstarts.pod_prediction(body)
    if prediction is not None:
        state.metrics.count_prediction_outcome(namespace, cache, predicted=prediction[0],
                                               actual=coldstarts.actual(verdict))  # fmt: skip
        missed = coldstarts.missed_prediction(f"{namespace}/{name}", prediction, verdict)
        if missed is not None:
            logger.warning("%s", missed)
    try:
        async with state.scheduler.locks.hold((namespace, cache)):  # the reconcile writes conditions too
            await _tally(state, namespace, cache, verdict, prediction[0] if prediction else None, emit)
        if event_type != "DELETED":
            await state.api.annotate_pod(namespace, name, {COLD_COUNTED_ANNOTATION: verdict.cause})
    except Exception as exc:  # counted in memory; a restart before the retry could count it again
        logger.warning("could not tally the cold start of pod %s/%s: %s", namespace, name, exc)


async def _tally(
    state: State, namespace: str, cache: str, verdict: coldstarts.Verdict, predicted: str | None, emit: Emit | None
) -> None:
    """Read the cache afresh, add one verdict to ``status.coldStarts`` (and the condition), write it, and keep
    the written object for the reconcile until the index shows it. Called under the cache's lock: the
    reconcile, which writes the conditions list whole, never decides from a status older than this one."""
    assert state.api is not None
    current = await state.api.get_cache(namespace, cache)
    if current is not None:
        status = current.get("status") or {}
        cold = coldstarts.tally(status.get("coldStarts"), verdict, predicted)
        patch: dict[str, Any] = {"coldStarts": cold}
        wanted = coldstarts.condition(cold)
        if wanted is not None:
            generation = int(status.get("observedGeneration") or current.get("metadata", {}).get("generation") or 0)
            conditions = status.get("conditions")
            patch["conditions"] = merge_conditions(conditions, [wanted], generation=generation, now=now_rfc3339())
            before = find(conditions, coldstarts.CONDITION)
            if emit is not None and wanted.status and (before is None or before.get("status") != "True"):
                emit(current, "Warning", wanted.reason, wanted.message)
        written = await state.api.patch_cache_status(namespace, cache, patch)
        state.cluster.remember((namespace, cache), written)


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
