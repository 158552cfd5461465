"""Prometheus metrics of the operator, in a registry of their own.

Label values stay bounded: namespaces and CompileCache names, GPU slugs, and fixed result and
reason sets (:mod:`compilecache_operator.model.preload_reasons`). The preload rate a dashboard shows is
hits ÷ (hits + misses + errors) of ``compilecache_preloads_total``; skipped pods are counted apart
(no preload was tried for them).

The operator also reports on itself: ``compilecache_operator_build_info``, the process's memory,
CPU and file descriptors (prometheus_client's process collector: ``process_*``), each handler's
duration and errors (:func:`instrumented` wraps a Kopf handler, the webhook's included),
and ``compilecache_cache_ready`` per CompileCache, read from the status the API server holds
(:meth:`Metrics.observe_cache`), which the alerts in the chart's PrometheusRule use, and when the
webhook's serving certificate expires (``compilecache_webhook_certificate_expiry_timestamp_seconds``).

Counter series are exported at 0 as soon as their label values are known (:meth:`Metrics.know_cache`: a
CompileCache, the GPU types of its bundles and of the cluster's nodes), not at their first event:
``increase()`` and ``rate()`` need an earlier sample, so a series born with the value 1 hides its first
event from every alert and dashboard (a histogram's first observation likewise). What is exported is
bounded: per cache and GPU type, each result with the reasons it can carry (:data:`PRELOAD_OUTCOMES`); per
cache, the preload durations of each result that runs a preload, and the two warm-up results (count and
duration). A series at 0 costs no memory until its first event (:class:`WithZeros` writes it out at each
scrape from what is known), so that 10,000 CompileCaches do not hold a million series objects.
"""

from __future__ import annotations

import contextlib
import functools
import platform
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cachelib import __version__
from cachelib.keyformat import gpu_slug
from cachelib.prediction import COLD, OUTCOMES, UNKNOWN, WARM
from cachelib.verdict import CAUSES
from compilecache_operator.decisions.plan import BundleRecord, bundles_from_status
from compilecache_operator.decisions.prediction import PREDICTION_CAUSES
from compilecache_operator.model import preload_reasons
from compilecache_operator.model.podsecurity import FALLBACK_REASONS as LEVEL_FALLBACKS
from compilecache_operator.model.preload_reasons import ERROR, REASONS, RESULTS, SKIPPED

UNKNOWN_REASON = "unknown"
PRELOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WARMUP_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WEBHOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
WEBHOOK_HANDLER = "webhook"
ERROR_KINDS = ("retry", "permanent", "unexpected")
"""How a handler failed: asked Kopf to retry (``kopf.TemporaryError``), gave up for good
(``kopf.PermanentError``), or raised anything else."""

WARMUP_RESULTS = ("succeeded", "failed")
PRELOAD_OUTCOMES: dict[str, tuple[str, ...]] = {
    preload_reasons.HIT: (preload_reasons.PRELOADED, preload_reasons.NODE_CACHE),
    preload_reasons.MISS: (
        preload_reasons.NO_BUNDLE, preload_reasons.IMAGE_MISMATCH, preload_reasons.STORE_UNAVAILABLE,
        preload_reasons.DEADLINE_EXCEEDED,
        preload_reasons.SIGNATURE_REFUSED,
    ),
    preload_reasons.ERROR: (
        preload_reasons.PRELOAD_FAILED, preload_reasons.STORE_UNAVAILABLE, preload_reasons.DEADLINE_EXCEEDED,
        preload_reasons.SIGNATURE_REFUSED,
        preload_reasons.RESULT_UNREADABLE,
    ),
    preload_reasons.SKIPPED: (
        preload_reasons.NOT_READY, preload_reasons.NOT_INJECTED, preload_reasons.CACHE_DIR_VALUE_FROM,
        preload_reasons.CACHE_DIR_NOT_ABSOLUTE,
        preload_reasons.VOLUME_AT_CACHE_DIR,
    ),
}
"""Each preload result with the reasons a pod of a known CompileCache is counted under (``unknown-cache``
names no known cache: its series is born at its first event)."""
UNKNOWN_GPU = "unknown"
"""The ``gpu`` of a pod counted before it ran anywhere (a skipped pod without the webhook's GPU annotation)."""

FALLBACK_REASONS = tuple(LEVEL_FALLBACKS.values())
"""The reasons of ``compilecache_node_cache_fallbacks_total``."""

P = ParamSpec("P")
T = TypeVar("T")


def error_kind(exc: BaseException) -> str:
    """The ``error`` label of ``compilecache_handler_errors_total`` for an exception."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "TemporaryError" in names:
        return "retry"
    if "PermanentError" in names:
        return "permanent"
    return "unexpected"


def is_ready(status: Mapping[str, Any] | None) -> bool:
    """Whether a CompileCache's status holds ``Ready=True``."""
    for condition in (status or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


PRECOMPILE_STATES = ("Verified", "LeftOut")


@dataclass
class Known:
    """A CompileCache whose series are exported (at 0 until their first event): since when, and its GPU types."""

    since: float
    gpus: set[str] = field(default_factory=set)


Zeros = Callable[[], Iterable[tuple[tuple[str, ...], float]]]
"""The label values of the series to export at 0 where the metric holds none, each with when it became known."""


class WithZeros(Collector):
    """A labelled counter or histogram as it is exported: its own series, then those of ``zeros`` it does not
    hold yet, at 0 (``_created`` when they became known)."""

    def __init__(self, metric: Counter | Histogram, zeros: Zeros) -> None:
        self.metric, self.zeros = metric, zeros
        self.names: tuple[str, ...] = tuple(metric._labelnames)
        self.buckets = tuple(floatToGoString(b) for b in getattr(metric, "_upper_bounds", ()))  # type: ignore[no-untyped-call]

    def describe(self) -> Iterable[Metric]:
        return self.metric.describe()

    def collect(self) -> Iterable[Metric]:
        for family in self.metric.collect():
            held = {tuple(sample.labels.get(n, "") for n in self.names) for sample in family.samples}
            for values, since in self.zeros():
                if values not in held:
                    self.add_zero(family, dict(zip(self.names, values, strict=True)), since)
            yield family

    def add_zero(self, family: Metric, labels: dict[str, str], since: float) -> None:
        name = family.name
        if isinstance(self.metric, Histogram):
            for bound in self.buckets:
                family.add_sample(f"{name}_bucket", {**labels, "le": bound}, 0.0)
            family.add_sample(f"{name}_count", labels, 0.0)
            family.add_sample(f"{name}_sum", labels, 0.0)
        else:
            family.add_sample(f"{name}_total", labels, 0.0)
        family.add_sample(f"{name}_created", labels, since)


class Metrics:
    """Every metric the operator exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.preloads = Counter(
            "compilecache_preloads",
            "Opted-in pods by preload result (hit, miss, error, skipped) and its reason (a fixed set).",
            ["namespace", "cache", "gpu", "result", "reason"],
            registry=None,
        )
        self.node_cache_fallbacks = Counter(
            "compilecache_node_cache_fallbacks",
            "Injected pods of a CompileCache with a node cache that preloaded into their own emptyDir instead, by "
            "reason (the namespace's Pod Security level refuses the node cache's hostPath or root preload).",
            ["namespace", "cache", "reason"],
            registry=None,
        )
        self.preload_duration = Histogram(
            "compilecache_preload_duration_seconds",
            "Seconds the preload init container took (fetch, verify, unpack).",
            ["namespace", "cache", "result"],
            buckets=PRELOAD_BUCKETS,
            registry=None,
        )
        self.preload_bytes = Counter(
            "compilecache_preload_bytes",
            "Bundle bytes preloaded into pods.",
            ["namespace", "cache"],
            registry=r,
        )
        self.warmup_jobs = Counter(
            "compilecache_warmup_jobs",
            "Finished warm-up Jobs by result.",
            ["namespace", "cache", "result"],
            registry=None,
        )
        self.warmup_duration = Histogram(
            "compilecache_warmup_duration_seconds",
            "Seconds from a warm-up Job's start to its end.",
            ["namespace", "cache", "result"],
            buckets=WARMUP_BUCKETS,
            registry=None,
        )
        self._known: dict[tuple[str, str], Known] = {}
        for metric, zeros in ((self.preloads, self._preload_zeros), (self.preload_duration, self._duration_zeros),
                              (self.warmup_jobs, self._warmup_zeros), (self.warmup_duration, self._warmup_zeros),
                              (self.node_cache_fallbacks, self._fallback_zeros)):
            r.register(WithZeros(metric, zeros))
        self.bundle_bytes = Gauge(
            "compilecache_bundle_bytes",
            "Bytes of the bundles recorded in a CompileCache's status, per GPU type.",
            ["namespace", "cache", "gpu"],
            registry=r,
        )
        self.bundles = Gauge(
            "compilecache_bundles",
            "Bundles recorded in a CompileCache's status.",
            ["namespace", "cache"],
            registry=r,
        )
        self.bundles_precompile = Gauge(
            "compilecache_bundles_precompile",
            "Bundles of a precompile Auto cache by what the warm-up's check decided (Verified, LeftOut).",
            ["namespace", "cache", "state"],
            registry=r,
        )
        self.cache_ready = Gauge(
            "compilecache_cache_ready",
            "1 while a CompileCache's Ready condition is True, else 0 (from the status the API server holds).",
            ["namespace", "cache"],
            registry=r,
        )
        self.build_info = Gauge(
            "compilecache_operator_build_info",
            "Always 1: the operator's version and Python version in labels.",
            ["version", "python_version"],
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.handler_duration = Histogram(
            "compilecache_handler_duration_seconds",
            "Seconds each run of an operator handler took (reconcile, jobs, delete-bundles, ...).",
            ["handler"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        )
        self.handler_errors = Counter(
            "compilecache_handler_errors",
            "Handler runs that ended in an error, by handler and kind (retry, permanent, unexpected).",
            ["handler", "error"],
            registry=r,
        )
        self.webhook_duration = Histogram(
            "compilecache_webhook_duration_seconds",
            "Seconds the pod-injection webhook took to answer an admission request.",
            buckets=WEBHOOK_BUCKETS,
            registry=r,
        )
        self.webhook_cert_expiry = Gauge(
            "compilecache_webhook_certificate_expiry_timestamp_seconds",
            "When the certificate the webhook serves now expires (Unix time); follows each reload.",
            registry=r,
        )
        self.workload_starts = Counter(
            "compilecache_workload_starts",
            "Opted-in pods by the verdict their workload (or a vLLM pod's compilecache-vllm-watch sidecar) reported: "
            "result hit or miss, and the cause of a miss (a bounded name: env, engine_argument, artifact_load, ...).",
            ["namespace", "cache", "result", "cause"],
            registry=r,
        )
        self.predictions = Counter(
            "compilecache_admission_predictions",
            "Opted-in pods by what the admission predicted from their spec against the bundles' warm-up: warm, cold "
            "with the kind of the first factor that differs, or unknown with the kind of the first factor it could "
            "not compare (image, gpu, env, job_id, precompile, engine_argument).",
            ["namespace", "cache", "prediction", "cause"],
            registry=r,
        )
        self.prediction_outcomes = Counter(
            "compilecache_prediction_outcomes",
            "Opted-in pods with a verdict by what the admission predicted (warm, cold, unknown) and how they started "
            "(actual: warm or cold, from the verdict).",
            ["namespace", "cache", "predicted", "actual"],
            registry=r,
        )
        ProcessCollector(registry=r)
        self._bundle_gpus: dict[tuple[str, str], set[str]] = {}

    def set_webhook_cert_expiry(self, cert_pem: bytes) -> None:
        self.webhook_cert_expiry.set(x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc.timestamp())

    # -- pods ------------------------------------------------------------------------------------
    def count_preload(
        self,
        namespace: str,
        cache: str,
        *,
        gpu: str,
        result: str,
        reason: str = UNKNOWN_REASON,
        seconds: float | None = None,
        size: int = 0,
    ) -> None:
        if result not in RESULTS:
            result = ERROR
        if reason not in REASONS:
            reason = UNKNOWN_REASON
        self.preloads.labels(namespace, cache, gpu or UNKNOWN_GPU, result, reason).inc()
        if seconds is not None and result != SKIPPED:
            self.preload_duration.labels(namespace, cache, result).observe(max(0.0, seconds))
        if size > 0:
            self.preload_bytes.labels(namespace, cache).inc(size)

    def count_node_cache_fallback(self, namespace: str, cache: str, reason: str) -> None:
        """One injected pod whose node cache was left out for ``reason`` (a fixed set; others are ``unknown``)."""
        known = reason if reason in FALLBACK_REASONS else UNKNOWN_REASON
        self.node_cache_fallbacks.labels(namespace, cache, known).inc()

    def know_cache(self, namespace: str, cache: str, gpus: Iterable[str]) -> None:
        """Export the series of a CompileCache and its GPU types (slugs) at 0 until their first event: each
        preload result with its reasons per GPU (skipped pods also without a GPU), the preload durations per
        result, each warm-up result's count and duration."""
        known = self._known.get((namespace, cache))
        if known is None:
            known = self._known[(namespace, cache)] = Known(since=time.time())
        known.gpus.update(gpus)

    def _preload_zeros(self) -> Iterator[tuple[tuple[str, ...], float]]:
        for (namespace, cache), known in list(self._known.items()):
            for reason in PRELOAD_OUTCOMES[SKIPPED]:
                yield (namespace, cache, UNKNOWN_GPU, SKIPPED, reason), known.since
            for gpu in sorted(known.gpus):
                for result, outcomes in PRELOAD_OUTCOMES.items():
                    for reason in outcomes:
                        yield (namespace, cache, gpu, result, reason), known.since

    def _duration_zeros(self) -> Iterator[tuple[tuple[str, ...], float]]:
        for (namespace, cache), known in list(self._known.items()):
            for result in PRELOAD_OUTCOMES:
                if result != SKIPPED:  # a skipped pod ran no preload: no duration
                    yield (namespace, cache, result), known.since

    def _fallback_zeros(self) -> Iterator[tuple[tuple[str, ...], float]]:
        for (namespace, cache), known in list(self._known.items()):
            for reason in FALLBACK_REASONS:
                yield (namespace, cache, reason), known.since

    def _warmup_zeros(self) -> Iterator[tuple[tuple[str, ...], float]]:
        for (namespace, cache), known in list(self._known.items()):
            for result in WARMUP_RESULTS:
                yield (namespace, cache, result), known.since

    def count_start(self, namespace: str, cache: str, *, result: str, cause: str) -> None:
        """One pod's verdict (``hit``/``miss`` and a cause from :data:`cachelib.verdict.CAUSES`)."""
        self.workload_starts.labels(namespace, cache, result if result in ("hit", "miss") else "miss",
                                    cause if cause in CAUSES else UNKNOWN_REASON).inc()  # fmt: skip

    def count_prediction(self, namespace: str, cache: str, *, prediction: str, cause: str) -> None:
        """One pod's prediction at admission (compilecache_operator.decisions.prediction)."""
        self.predictions.labels(namespace, cache, prediction if prediction in OUTCOMES else UNKNOWN,
                                cause if cause in PREDICTION_CAUSES else "none").inc()  # fmt: skip

    def count_prediction_outcome(self, namespace: str, cache: str, *, predicted: str, actual: str) -> None:
        """One pod's prediction checked against its verdict (``actual``: warm or cold)."""
        self.prediction_outcomes.labels(namespace, cache, predicted if predicted in OUTCOMES else UNKNOWN,
                                        actual if actual in (WARM, COLD) else COLD).inc()  # fmt: skip

    # -- warm-ups ----------------------------------------------------------------------------------
    def count_warmup(self, namespace: str, cache: str, *, result: str, seconds: float | None) -> None:
        self.warmup_jobs.labels(namespace, cache, result).inc()
        if seconds is not None:
            self.warmup_duration.labels(namespace, cache, result).observe(seconds)

    # -- bundles -----------------------------------------------------------------------------------
    def set_bundles(self, namespace: str, cache: str, bundles: Iterable[BundleRecord]) -> None:
        """Set the bundle gauges of one cache, dropping GPU series that no longer have bundles."""
        per_gpu: dict[str, int] = {}
        count = 0
        bundles = list(bundles)
        for bundle in bundles:
            per_gpu[bundle.gpu] = per_gpu.get(bundle.gpu, 0) + bundle.bytes
            count += 1
        key = (namespace, cache)
        for gone in self._bundle_gpus.get(key, set()) - set(per_gpu):
            self.bundle_bytes.remove(namespace, cache, gone)
        for gpu, size in per_gpu.items():
            self.bundle_bytes.labels(namespace, cache, gpu).set(size)
        self._bundle_gpus[key] = set(per_gpu)
        self.bundles.labels(namespace, cache).set(count)
        states = [b.precompile for b in bundles if b.precompile]
        for state in PRECOMPILE_STATES:
            if states:
                self.bundles_precompile.labels(namespace, cache, state).set(states.count(state))
            else:
                with contextlib.suppress(KeyError):
                    self.bundles_precompile.remove(namespace, cache, state)

    def forget_cache(self, namespace: str, cache: str) -> None:
        """Drop the gauges of a deleted CompileCache and its series still at 0 (counters keep their history)."""
        self._known.pop((namespace, cache), None)
        for gpu in self._bundle_gpus.pop((namespace, cache), set()):
            self.bundle_bytes.remove(namespace, cache, gpu)
        for gauge in (self.bundles, self.cache_ready):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, cache)
        for state in PRECOMPILE_STATES:
            with contextlib.suppress(KeyError):
                self.bundles_precompile.remove(namespace, cache, state)

    # -- the operator itself ---------------------------------------------------------------------
    def observe_cache(self, namespace: str, cache: str, status: Mapping[str, Any] | None) -> None:
        """Set ``compilecache_cache_ready`` from a CompileCache's status as the API server holds it."""
        self.cache_ready.labels(namespace, cache).set(1 if is_ready(status) else 0)

    @contextlib.contextmanager
    def timed(self, handler: str) -> Iterator[None]:
        """Time one run of ``handler`` and count it when it raises (the exception goes on)."""
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            self.handler_errors.labels(handler, error_kind(exc)).inc()
            raise
        finally:
            elapsed = time.perf_counter() - started
            if handler == WEBHOOK_HANDLER:
                self.webhook_duration.observe(elapsed)
            else:
                self.handler_duration.labels(handler).observe(elapsed)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def cache_gpus(status: Mapping[str, Any] | None, node_gpus: Iterable[str]) -> set[str]:
    """The GPU slugs a CompileCache's pods can be counted under: its bundles' and the cluster's GPU types
    (the products the Nodes carry in the GPU label)."""
    return {b.key_gpu_slug for b in bundles_from_status(status)} | {gpu_slug(str(p)) for p in node_gpus if p}


def instrumented(handler: str) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Decorate an async Kopf handler: each run's duration and errors are recorded as ``handler``
    in the :class:`Metrics` of the operator's memo (``memo.state.metrics``); without one the
    handler just runs."""

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            metrics = getattr(getattr(kwargs.get("memo"), "state", None), "metrics", None)
            if not isinstance(metrics, Metrics):
                return await fn(*args, **kwargs)
            with metrics.timed(handler):
                return await fn(*args, **kwargs)

        return run

    return decorate
