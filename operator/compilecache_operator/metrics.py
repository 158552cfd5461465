"""Prometheus metrics of the operator, in a registry of their own.

Label values stay bounded: namespaces and CompileCache names, GPU slugs, and fixed result and
reason sets (:mod:`compilecache_operator.reasons`). The preload rate a dashboard shows is
hits ÷ (hits + misses + errors) of ``compilecache_preloads_total``; skipped pods are counted apart
(no preload was tried for them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from compilecache_operator.plan import BundleRecord
from compilecache_operator.reasons import ERROR, REASONS, RESULTS, SKIPPED
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

UNKNOWN_REASON = "unknown"
PRELOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WARMUP_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)


class Metrics:
    """Every metric the operator exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.preloads = Counter(
            "compilecache_preloads",
            "Opted-in pods by preload result (hit, miss, error, skipped) and its reason (a fixed set).",
            ["namespace", "cache", "gpu", "result", "reason"],
            registry=r,
        )
        self.preload_duration = Histogram(
            "compilecache_preload_duration_seconds",
            "Seconds the preload init container took (fetch, verify, unpack).",
            ["namespace", "cache", "result"],
            buckets=PRELOAD_BUCKETS,
            registry=r,
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
            registry=r,
        )
        self.warmup_duration = Histogram(
            "compilecache_warmup_duration_seconds",
            "Seconds from a warm-up Job's start to its end.",
            ["result"],
            buckets=WARMUP_BUCKETS,
            registry=r,
        )
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
        self._bundle_gpus: dict[tuple[str, str], set[str]] = {}

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
        self.preloads.labels(namespace, cache, gpu or "unknown", result, reason).inc()
        if seconds is not None and result != SKIPPED:
            self.preload_duration.labels(namespace, cache, result).observe(max(0.0, seconds))
        if size > 0:
            self.preload_bytes.labels(namespace, cache).inc(size)

    # -- warm-ups ----------------------------------------------------------------------------------
    def count_warmup(self, namespace: str, cache: str, *, result: str, seconds: float | None) -> None:
        self.warmup_jobs.labels(namespace, cache, result).inc()
        if seconds is not None:
            self.warmup_duration.labels(result).observe(seconds)

    # -- bundles -----------------------------------------------------------------------------------
    def set_bundles(self, namespace: str, cache: str, bundles: Iterable[BundleRecord]) -> None:
        """Set the bundle gauges of one cache, dropping GPU series that no longer have bundles."""
        per_gpu: dict[str, int] = {}
        count = 0
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

    def forget_cache(self, namespace: str, cache: str) -> None:
        """Drop the gauges of a deleted CompileCache (counters keep their history)."""
        for gpu in self._bundle_gpus.pop((namespace, cache), set()):
            self.bundle_bytes.remove(namespace, cache, gpu)
        with contextlib.suppress(KeyError):
            self.bundles.remove(namespace, cache)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
