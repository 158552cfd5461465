"""The pod-injection webhook: the answer to an AdmissionReview of a pod CREATE.

Registered by :func:`compilecache_operator.handlers.register_webhook` and served by
:class:`compilecache_operator.edge.kopfadapter.AdmissionServer`, which hands each review of this webhook to
:func:`review_pod`: the JSON patch is built from the webhook's own pod patch (no deep copy of the whole
pod, no diff). The webhook configuration selects only pods with the opt-in label and fails open
(``failurePolicy: Ignore``). The patch comes from :func:`podpatch.build_pod_patch` and the operator's
in-memory views of the CompileCaches (:class:`~compilecache_operator.controller.watches.CacheViews`), so admission
never waits on the API server. A pod it does not inject
gets annotations saying why (``compilecache.io/skipped`` and ``compilecache.io/skipped-detail``) and the
answer carries the same as an admission warning (``kubectl`` prints it; for a Deployment's pods the
ReplicaSet controller receives it, so the annotations are what stays); the metrics handler counts the pod
by that reason (:mod:`compilecache_operator.model.preload_reasons`). An injected pod whose app containers take
variables from ``envFrom`` gets a warning that the injected variables win. Whether the preload may run as
a native sidecar was decided once at start-up (:mod:`compilecache_operator.model.sidecars`); a cache that asks
for one on a cluster without them is said once in the log, and each of its pods carries the reason in an
annotation. What the webhook reads of the operator's state is :class:`PodWebhookState`.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Collection, Mapping, MutableSet
from typing import Any, Protocol

from compilecache_operator.decisions import cacheview, podpatch, warmup_job
from compilecache_operator.edge.signing import Signing
from compilecache_operator.model import podsecurity
from compilecache_operator.model.names import CACHE_LABEL, PRELOAD_MODE_REASON_ANNOTATION
from compilecache_operator.model.sidecars import SidecarSupport

log = logging.getLogger(__name__)


class PodWebhookSettings(Protocol):
    """The operator's settings the pod webhook reads."""

    @property
    def jobs(self) -> warmup_job.JobSettings: ...
    @property
    def signing(self) -> Signing | None: ...
    @property
    def excluded_namespaces(self) -> frozenset[str]: ...
    @property
    def pod_security_default(self) -> str: ...
    def in_scope(self, namespace: str) -> bool: ...


class PodWebhookInjection(Protocol):
    """What the operator keeps for injection: native-sidecar support, and the fallbacks already logged."""

    @property
    def sidecars(self) -> SidecarSupport: ...
    @property
    def fallbacks_logged(self) -> MutableSet[tuple[str, str]]: ...
    @property
    def namespace_levels(self) -> Mapping[Any, Collection[str]]: ...


class PodWebhookMetrics(Protocol):
    """The one metric the pod webhook counts: opted-in pods by prediction."""

    def count_prediction(self, namespace: str, cache: str, *, prediction: str, cause: str) -> None: ...


class PodWebhookState(Protocol):
    """What the pod webhook reads (and the one thing it writes) of the operator's state."""

    @property
    def settings(self) -> PodWebhookSettings: ...
    @property
    def injection(self) -> PodWebhookInjection: ...
    @property
    def metrics(self) -> PodWebhookMetrics: ...


def fill_namespace(review: Mapping[str, Any]) -> None:
    payload = review.get("request") or {}
    namespace = payload.get("namespace")
    obj = payload.get("object")
    if namespace and isinstance(obj, dict):
        meta = obj.setdefault("metadata", {})
        if not meta.get("namespace"):
            meta["namespace"] = namespace


Views = Mapping[tuple[str, str], Collection[cacheview.CacheView]]


def asked_cache(review: Mapping[str, Any]) -> tuple[str, str] | None:
    """The CompileCache (namespace, name) an opted-in pod being created asks for (pure); None for any
    other review."""
    request = review.get("request") or {}
    pod = request.get("object")
    if request.get("operation") != "CREATE" or not isinstance(pod, dict):
        return None
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(CACHE_LABEL)
    namespace = meta.get("namespace") or request.get("namespace")
    return (str(namespace), str(name)) if name and namespace else None


def namespace_level(state: PodWebhookState, namespace: str) -> str:
    """The Pod Security level ``namespace`` enforces, from the index of the namespaces' enforce labels (the
    operator's ``--pod-security-default`` for an unlabelled namespace, or one the index does not hold yet)."""
    label = next(iter(state.injection.namespace_levels.get(namespace, ())), "")
    labels = {podsecurity.ENFORCE_LABEL: label} if label else {}
    return podsecurity.enforced_level(labels, state.settings.pod_security_default)


def pod_patch(state: PodWebhookState, views: Views | None, pod: Mapping[str, Any]) -> podpatch.PodPatch | None:
    """The patch for an opted-in pod (None outside the watched namespaces), said once in the log
    when a cache's Sidecar request becomes an init container."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if not state.settings.in_scope(namespace):
        return None
    cache = str((meta.get("labels") or {}).get(CACHE_LABEL, ""))
    view = next(iter(views.get((namespace, cache), ()) if views is not None else ()), None)
    result = podpatch.build_pod_patch(
        pod,
        view,
        preloader_image=state.settings.jobs.preloader_image,
        excluded_namespaces=state.settings.excluded_namespaces,
        sidecars=state.injection.sidecars,
        trusted_keys=state.settings.signing.trusted_texts if state.settings.signing else (),
        pod_security=namespace_level(state, namespace),
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


def count_predictions(state: PodWebhookState, pod: Mapping[str, Any], result: podpatch.PodPatch) -> None:
    """Count the pod's prediction (one per pod)."""
    if result.prediction is None:
        return
    meta = pod.get("metadata") or {}
    cache = str((meta.get("labels") or {}).get(CACHE_LABEL, ""))
    state.metrics.count_prediction(str(meta.get("namespace") or ""), cache, prediction=result.prediction.outcome,
                                   cause=result.prediction.cause)  # fmt: skip


def review_pod(state: PodWebhookState, views: Views | None, review: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview answer for a pod: allowed (the webhook fails open: an error is never a refusal), with
    the patch and warnings for an opted-in pod being created; refused only where its cache says
    ``preload.onPredictedCold: Deny`` and the pod is predicted to start cold, with the prediction's warning."""
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
        if result is not None and not request.get("dryRun"):
            count_predictions(state, pod, result)
        if result is not None and result.warnings:
            response["warnings"] = list(result.warnings)
        if result is not None and result.refusal is not None:
            response["allowed"] = False
            response["status"] = {"code": 403, "reason": "Forbidden", "message": result.refusal}
            result = None
        ops = json_patch(pod, result) if result is not None else []
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode("ascii")
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}
