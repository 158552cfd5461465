"""The pod-injection webhook: Kopf's mutating admission handler on pod CREATE.

Registered by :func:`compilecache_operator.handlers.register_webhook`. The webhook configuration
selects only pods with the opt-in label and fails open
(``failurePolicy: Ignore``). The handler computes the patch with
:func:`builders.build_pod_patch` from the operator's in-memory index of CompileCaches, so
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

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import kopf
from compilecache_operator import builders
from compilecache_operator.controller import State
from compilecache_operator.names import CACHE_LABEL, PRELOAD_MODE_REASON_ANNOTATION

log = logging.getLogger(__name__)


class PodWebhookServer(kopf.WebhookServer):
    """Kopf's webhook server, filling in the namespace of objects under admission.

    On CREATE the API server may send an object without ``metadata.namespace`` (it is in the
    request instead); the handlers need it to find the CompileCache.
    """

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def with_namespace(request: Any, **kwargs: Any) -> Any:
            fill_namespace(request)
            return await fn(request, **kwargs)

        async for config in super().__call__(with_namespace):
            yield config


def fill_namespace(review: Mapping[str, Any]) -> None:
    payload = review.get("request") or {}
    namespace = payload.get("namespace")
    obj = payload.get("object")
    if namespace and isinstance(obj, dict):
        meta = obj.setdefault("metadata", {})
        if not meta.get("namespace"):
            meta["namespace"] = namespace


async def inject_pods(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    caches: kopf.Index[tuple[str, str], builders.CacheView] | None = None,
    warnings: list[str] | None = None,
    **_: Any,
) -> None:
    """Add the preload container, the cache volume and the cache environment; say in the
    admission response's ``warnings`` what the pod's author should know."""
    state: State = memo["state"]
    namespace = str(body.metadata.namespace or "")
    if not state.settings.in_scope(namespace):
        return
    cache = str(body.metadata.labels.get(CACHE_LABEL, ""))
    view = next(iter(caches.get((namespace, cache), []) if caches is not None else []), None)
    result = builders.build_pod_patch(
        _plain(body),
        view,
        preloader_image=state.settings.jobs.preloader_image,
        excluded_namespaces=state.settings.excluded_namespaces,
        sidecars=state.sidecars,
    )
    if result.skipped:
        log.debug("pod not injected (%s) for CompileCache %s/%s", result.skipped, namespace, cache)
    if warnings is not None:
        warnings.extend(result.warnings)
    fallback = result.annotations.get(PRELOAD_MODE_REASON_ANNOTATION)
    if fallback and (namespace, cache) not in state.fallbacks_logged:
        state.fallbacks_logged.add((namespace, cache))
        log.warning("CompileCache %s/%s asks for preload.mode Sidecar; its pods get an init container: %s",
                    namespace, cache, fallback)
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
