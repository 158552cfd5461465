"""The Kopf handlers: thin wrappers that call the controller, the webhook and the metrics.

:func:`build_registry` registers them in a registry of their own, with the intervals the
command line asks for:

- CompileCache create/update(spec)/resume: reconcile once; a Job event or the timer does the rest;
- a resync loop: reconcile every CompileCache again now and then (GPU discovery, a Secret created
  later, a deleted Job). It is a task of its own rather than a Kopf timer, because Kopf puts a
  finalizer on every object that has a timer, and a finalizer belongs only on caches whose
  bundles must be deleted;
- warm-up Job events: reconcile the owner as soon as a Job finishes;
- CompileCache deletion with ``deletionPolicy: Delete``: delete its bundles (the only finalizer);
- opted-in pod events: count each pod's preload result once (a sidecar's when the pod ends, at
  the latest from the DELETED event);
- the pod mutating webhook (:mod:`compilecache_operator.webhook`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf
from compilecache_operator import builders, controller
from compilecache_operator.kube import KubeAPI
from compilecache_operator.metrics import WEBHOOK_HANDLER, instrumented
from compilecache_operator.names import (
    CACHE_LABEL,
    COUNTED_ANNOTATION,
    FINALIZER,
    GPU_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    PREFIX,
    RECORDED_ANNOTATION,
    VERSION,
    WARMUP_LABEL,
    WEBHOOK_ID,
)
from compilecache_operator.results import job_condition, preload_outcome
from compilecache_operator.sidecars import detect_native_sidecars
from compilecache_operator.webhook import inject_pods

from cachelib.keys import gpu_slug

logger = logging.getLogger(__name__)
MAX_COUNTED = 100_000


@dataclass(frozen=True)
class Intervals:
    resync_seconds: float = 60.0
    """How often each CompileCache is reconciled without any change."""
    watch_server_timeout: int = 300
    delete_retries: int = 20
    problem_retries: int = 5
    """Retries with back-off of a change handler after a problem that may pass; the timer goes on after."""


@dataclass
class Admission:
    """The webhook server and, in managed mode, the webhook configuration's name."""

    server: kopf.WebhookServer | None = None
    managed: str | None = None


class CountedPods:
    """Pod uids already counted, so a burst of events before the annotation lands counts once."""

    def __init__(self, limit: int = MAX_COUNTED) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, uid: str) -> bool:
        """True when ``uid`` was not counted before."""
        if uid in self._seen:
            return False
        self._seen[uid] = None
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True


def _state(memo: kopf.Memo) -> controller.State:
    return cast(controller.State, memo["state"])


def _emit(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else the kubeconfig (``KUBECONFIG``)."""
    if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
        return kopf.login_with_service_account(**kwargs)
    return kopf.login_with_kubeconfig(**kwargs)


def build_registry(intervals: Intervals | None = None, *, webhook: bool = True) -> kopf.OperatorRegistry:
    intervals = intervals or Intervals()
    registry = kopf.OperatorRegistry()
    cc = (GROUP, VERSION, PLURAL)

    @kopf.on.login(id="login", registry=registry)
    def login_handler(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(**kwargs)

    @kopf.on.startup(id="configure", registry=registry)
    async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=PREFIX, key="last-handled-configuration"
        )
        settings.watching.server_timeout = intervals.watch_server_timeout
        settings.watching.client_timeout = intervals.watch_server_timeout + 30
        settings.watching.connect_timeout = 30
        settings.peering.standalone = True
        settings.posting.level = logging.INFO
        admission: Admission = memo["admission"]
        settings.admission.server = admission.server
        settings.admission.managed = admission.managed
        info = login(settings=settings)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig")
        state = _state(memo)
        state.api = KubeAPI(info)
        state.sidecars = await detect_native_sidecars(state.api, state.settings.native_sidecars)
        logger.info("native sidecars %s: %s", "available" if state.sidecars.available else "not available",
                    state.sidecars.basis)
        memo["resync"] = asyncio.create_task(resync_loop(state, intervals.resync_seconds))

    @kopf.on.cleanup(id="close", registry=registry)
    async def close(memo: kopf.Memo, **_: Any) -> None:
        resync: asyncio.Task[None] | None = memo.get("resync")
        if resync is not None:
            resync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await resync
        api = _state(memo).api
        if api is not None:
            await api.close()

    @kopf.index(*cc, id="caches", registry=registry)
    def caches(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
        settings = _state(memo).settings
        view = builders.cache_view(body, settings.defaults, settings.confinement)
        return {(namespace or "", name): view}

    @kopf.on.resume(*cc, id="reconcile", backoff=10, registry=registry)
    @kopf.on.create(*cc, id="reconcile", backoff=10, registry=registry)
    @kopf.on.update(*cc, id="reconcile", field="spec", backoff=10, registry=registry)
    @instrumented("reconcile")
    async def reconcile_cache(namespace: str | None, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
        outcome = await controller.reconcile(_state(memo), namespace or "", name, emit=_emit)
        if outcome.invalid:
            raise kopf.PermanentError(outcome.invalid)
        if outcome.problem and retry < intervals.problem_retries:
            raise kopf.TemporaryError(outcome.problem, delay=outcome.retry_after or 30.0)

    @kopf.on.event("batch", "v1", "jobs", id="jobs", labels={WARMUP_LABEL: kopf.PRESENT}, registry=registry)
    @instrumented("jobs")
    async def job_event(
        type: str, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any
    ) -> None:
        finished = job_condition(body, "Complete") or job_condition(body, "Failed")
        if type == "DELETED" or not finished or RECORDED_ANNOTATION in body.metadata.annotations:
            return
        for ref in body.metadata.get("ownerReferences") or []:
            if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
                await controller.reconcile(_state(memo), namespace or "", str(ref["name"]), emit=_emit)

    @kopf.on.delete(
        *cc,
        id="delete-bundles",
        backoff=10,
        when=lambda spec, **_: spec.get("deletionPolicy") == "Delete",
        retries=intervals.delete_retries,
        registry=registry,
    )
    @instrumented("delete-bundles")
    async def delete_bundles(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
        outcome = await controller.cleanup(_state(memo), body)
        if outcome.done:
            _emit(body, "Normal", "BundlesDeleted", outcome.message)
            return
        if retry + 1 >= intervals.delete_retries:
            _emit(body, "Warning", "BundlesLeft", f"gave up deleting bundles: {outcome.message}")
            return
        raise kopf.TemporaryError(outcome.message, delay=outcome.retry_after or 30.0)

    @kopf.on.event(*cc, id="cache-events", registry=registry)
    async def cache_event(
        type: str, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
    ) -> None:
        if type != "DELETED":
            _state(memo).metrics.observe_cache(namespace or "", name, body.get("status"))
        if type == "DELETED":
            _state(memo).metrics.forget_cache(namespace or "", name)
            _state(memo).warnings.pop((namespace or "", name), None)

    @kopf.on.event(
        "v1", "pods",
        id="count-preloads",
        labels={CACHE_LABEL: kopf.PRESENT},
        annotations={COUNTED_ANNOTATION: kopf.ABSENT},
        registry=registry,
    )
    @instrumented("count-preloads")
    async def pod_event(
        type: str, body: kopf.Body, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any
    ) -> None:
        await count_preload(_state(memo), memo["counted"], type, body, namespace or "", name, uid)

    if not webhook:
        return registry
    kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operations=["CREATE"],
        labels={CACHE_LABEL: kopf.PRESENT},
        ignore_failures=True,
        side_effects=False,
        registry=registry,
    )(instrumented(WEBHOOK_HANDLER)(inject_pods))

    return registry


async def count_preload(
    state: controller.State,
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
    if state.api is not None and event_type != "DELETED":
        try:
            await state.api.annotate_pod(namespace, name, {COUNTED_ANNOTATION: outcome.result})
        except Exception as exc:  # counted in memory; only a restart before the retry could recount
            logger.warning("could not mark pod %s/%s as counted: %s", namespace, name, exc)


async def resync_loop(state: controller.State, interval: float) -> None:
    """Reconcile every CompileCache in scope every ``interval`` seconds; errors are logged, never fatal."""
    while True:
        await asyncio.sleep(interval)
        api = state.api
        if api is None:
            continue
        try:
            caches = await api.list_caches(state.settings.namespaces)
        except Exception as exc:
            logger.warning("resync: listing CompileCaches failed: %s", exc)
            continue
        for cache in caches:
            meta = cache.get("metadata") or {}
            try:
                await controller.reconcile(state, str(meta.get("namespace")), str(meta.get("name")), emit=_emit)
            except Exception as exc:
                logger.warning("resync of %s/%s failed: %s", meta.get("namespace"), meta.get("name"), exc)
