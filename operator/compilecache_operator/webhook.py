"""The pod-injection webhook: a mutating admission handler on pod CREATE.

Registered by :func:`compilecache_operator.handlers.register_webhook` (so that Kopf writes the
managed webhook configuration and serves the endpoint). Requests for it are answered directly
(:func:`review_pod`): the JSON patch is built from the webhook's own pod patch rather than by
Kopf's generic path (a deep copy of the whole pod, then a diff), which was most of the webhook's
CPU. The Kopf handler :func:`inject_pods` gives the same answer through Kopf's machinery. The webhook configuration
selects only pods with the opt-in label and fails open
(``failurePolicy: Ignore``). The handler computes the patch with
:func:`podpatch.build_pod_patch` from the operator's in-memory index of CompileCaches, so
admission never waits on the API server. A pod it does not inject gets annotations saying
why (``compilecache.io/skipped`` and ``compilecache.io/skipped-detail``) and the answer carries
the same as an admission warning (``kubectl`` prints it; for a Deployment's pods the ReplicaSet
controller receives it, so the annotations are what stays); the metrics handler counts the pod
by that reason (:mod:`compilecache_operator.reasons`). An injected pod whose app containers
take variables from ``envFrom`` gets a warning that the injected variables win. Whether the
preload may run as a native sidecar was decided once at start-up
(:mod:`compilecache_operator.sidecars`); a cache that asks for one on a cluster without them is
said once in the log, and each of its pods carries the reason in an annotation.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any

import kopf
from aiohttp import web
from compilecache_operator import cacheview, podpatch
from compilecache_operator.names import CACHE_LABEL, PRELOAD_MODE_REASON_ANNOTATION, WEBHOOK_ID
from compilecache_operator.state import State

log = logging.getLogger(__name__)


class PodWebhookServer(kopf.WebhookServer):
    """Kopf's webhook server, answering the pod webhook directly once :attr:`answer` is set.

    On CREATE the API server may send an object without ``metadata.namespace`` (it is in the
    request instead); the handlers need it to find the CompileCache.

    Kopf starts the server only after the start-up handlers and its resource scan, so the
    replica's readiness also waits for :attr:`listening`: a Service must not route admissions to
    a port that refuses them (the webhook fails open, and the pod would start cold). While
    :attr:`draining` says so, every answer closes its connection (``Connection: close``): the
    API server's kept-alive connections move to the ready replicas during the shutdown delay,
    instead of breaking under a request when this one exits.
    """

    answer: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    """Set at start-up: the direct answer to a review for :data:`WEBHOOK_ID`."""
    draining: Callable[[], bool] | None = None
    """Set at start-up: whether this replica is shutting down."""
    listening: bool = False
    """Whether the endpoint accepts connections (from the site's start to its clean-up)."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def with_namespace(request: Any, **kwargs: Any) -> Any:
            if kwargs.get("webhook") == WEBHOOK_ID and self.answer is not None:
                return self.answer(request)
            fill_namespace(request)
            return await fn(request, **kwargs)

        try:
            async for config in super().__call__(with_namespace):
                self.listening = True  # Kopf yields once its site has started
                yield config
        finally:
            self.listening = False

    async def _serve(self, fn: kopf.WebhookFn, request: web.Request) -> web.Response:  # type: ignore[override]
        response = await kopf.WebhookServer._serve(fn, request)
        if self.draining is not None and self.draining():
            response.force_close()
        return response


def fill_namespace(review: Mapping[str, Any]) -> None:
    payload = review.get("request") or {}
    namespace = payload.get("namespace")
    obj = payload.get("object")
    if namespace and isinstance(obj, dict):
        meta = obj.setdefault("metadata", {})
        if not meta.get("namespace"):
            meta["namespace"] = namespace


Views = Mapping[tuple[str, str], Collection[cacheview.CacheView]]


def pod_patch(state: State, views: Views | None, pod: Mapping[str, Any]) -> podpatch.PodPatch | None:
    """The patch for an opted-in pod (None outside the watched namespaces), said once in the log
    when a cache's Sidecar request becomes an init container."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if not state.settings.in_scope(namespace):
        return None
    cache = str((meta.get("labels") or {}).get(CACHE_LABEL, ""))
    view = next(iter(views.get((namespace, cache), ()) if views is not None else ()), None)
    if view is None and state.cluster.early_views is not None:  # Kopf's index still loading: the start-up list
        view = state.cluster.early_views.get((namespace, cache))
    result = podpatch.build_pod_patch(
        pod,
        view,
        preloader_image=state.settings.jobs.preloader_image,
        excluded_namespaces=state.settings.excluded_namespaces,
        sidecars=state.injection.sidecars,
        trusted_keys=state.settings.signing.trusted_texts if state.settings.signing else (),
    )
    if result.skipped:
        log.debug("pod not injected (%s) for CompileCache %s/%s", result.skipped, namespace, cache)
    fallback = result.annotations.get(PRELOAD_MODE_REASON_ANNOTATION)
    if fallback and (namespace, cache) not in state.injection.fallbacks_logged:
        state.injection.fallbacks_logged.add((namespace, cache))
        log.warning("CompileCache %s/%s asks for preload.mode Sidecar; its pods get an init container: %s",
                    namespace, cache, fallback)
    return result


def json_patch(pod: Mapping[str, Any], patch: podpatch.PodPatch) -> list[dict[str, Any]]:
    """The RFC 6902 operations of ``patch`` on ``pod`` (``add`` replaces a member that exists)."""
    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"/spec/{name}", "value": value}
        for name, value in (("initContainers", patch.init_containers), ("containers", patch.containers),
                            ("volumes", patch.volumes))
        if value is not None
    ]
    if not patch.annotations:
        return ops
    if not isinstance((pod.get("metadata") or {}).get("annotations"), dict):
        return [*ops, {"op": "add", "path": "/metadata/annotations", "value": dict(patch.annotations)}]
    return ops + [
        {"op": "add", "path": "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1"), "value": value}
        for key, value in patch.annotations.items()
    ]


def review_pod(state: State, views: Views | None, review: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview answer for a pod: always allowed (the webhook fails open), with the
    patch and warnings for an opted-in pod being created."""
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    pod = request.get("object")
    labelled = isinstance(pod, dict) and CACHE_LABEL in ((pod.get("metadata") or {}).get("labels") or {})
    if request.get("operation") == "CREATE" and labelled:
        assert isinstance(pod, dict)
        fill_namespace(review)
        try:
            result = pod_patch(state, views, pod)
        except Exception:  # fail open: the pod starts without a preload
            log.exception("pod webhook failed; the pod is admitted unchanged")
            result = None
        if result is not None and result.warnings:
            response["warnings"] = list(result.warnings)
        ops = json_patch(pod, result) if result is not None else []
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode("ascii")
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


async def inject_pods(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    caches: kopf.Index[tuple[str, str], cacheview.CacheView] | None = None,
    warnings: list[str] | None = None,
    **_: Any,
) -> None:
    """Kopf's handler: add the preload container, the cache volume and the cache environment; say
    in the admission response's ``warnings`` what the pod's author should know."""
    result = pod_patch(memo.state, caches, _plain(body))
    if result is None:
        return
    if warnings is not None:
        warnings.extend(result.warnings)
    spec: dict[str, Any] = {}
    if result.init_containers is not None:
        spec["initContainers"] = result.init_containers
    if result.containers is not None:
        spec["containers"] = result.containers
    if result.volumes is not None:
        spec["volumes"] = result.volumes
    if spec:
        patch["spec"] = spec
    if result.annotations:
        patch["metadata"] = {"annotations": dict(result.annotations)}


def _plain(body: kopf.Body) -> dict[str, Any]:
    return {"metadata": dict(body.get("metadata") or {}), "spec": dict(body.get("spec") or {})}
