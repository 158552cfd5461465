"""torch's compile-cache hits and misses of the running process, as Prometheus metrics (the collector).

The preloader knows whether a bundle was unpacked; only the workload knows whether its
compiles then hit. This collector reads ``torch._dynamo.utils.counters`` at scrape time
(it never imports torch itself: before torch is loaded there is nothing to report)::

    from cachelib import runtime
    runtime.start_http_server(9400)      # or runtime.register() with your own registry

(:mod:`cachelib.runtime` is what a workload calls; this module is what it serves.)

Metrics:

- ``compilecache_runtime_cache_events_total{cache, result}`` -- torch's cache lookups:
  ``cache`` is ``fxgraph``, ``aotautograd``, ``generated_module``, ``async_compile`` or
  ``dynamo``; ``result`` is ``hit``, ``miss``, ``bypass`` (not cacheable), ``guard_miss`` or
  ``saved``.
- ``compilecache_runtime_compiled_frames_total`` -- frames Dynamo compiled.
- ``compilecache_runtime_graph_breaks_total`` -- graph breaks Dynamo met.
- ``compilecache_runtime_warm_start_levers{lever}`` -- 1 for each lever :func:`cachelib.runtime.warm_start` applied
  (``torch_key``, ``triton_key``, ``caching_precompile``, ``lazy_compile_pool``, ``triton_modules``);
  absent until it was called.
- ``compilecache_runtime_warm_start_fallbacks_total{reason}`` -- precompiled entries refused and
  compiled afresh instead (``unreadable``, ``source_changed``, ``load_failed``, ``install_failed``):
  :func:`cachelib.runtime.warm_start` guards torch's loader, so a bad entry costs a compile, never the process.
- ``compilecache_runtime_graphs_total{result, cause}`` -- graphs this process compiled, by whether
  torch's caches had them (``hit``, ``miss``) and, for a miss, the factor that differed from the
  warm-up's (a bounded ``cause``: :data:`cachelib.verdict.CAUSES`; ``none`` for a hit). Recorded
  from :func:`cachelib.runtime.warm_start` on; without it, or where this torch's internals cannot be read, FX-graph
  misses count as ``unknown``. The names and both values are in :func:`cachelib.runtime.why` and in
  ``compilecache-why.json`` of the cache directory (:mod:`cachelib.verdict`).
- ``compilecache_runtime_preload_wait_seconds{result}`` -- how long
  :func:`cachelib.handoff.wait_for_preload` waited for a preload running beside the workload,
  labelled with the preload's result (hit, miss, error, timeout); absent until it was called.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cachelib import verdict
from cachelib.in_image import factors, precompileguard, warmstart

CACHE_EVENTS: dict[tuple[str, str], tuple[str, str]] = {
    ("inductor", "fxgraph_cache_hit"): ("fxgraph", "hit"),
    ("inductor", "fxgraph_cache_miss"): ("fxgraph", "miss"),
    ("inductor", "fxgraph_cache_bypass"): ("fxgraph", "bypass"),
    ("aot_autograd", "autograd_cache_hit"): ("aotautograd", "hit"),
    ("aot_autograd", "autograd_cache_miss"): ("aotautograd", "miss"),
    ("aot_autograd", "autograd_cache_bypass"): ("aotautograd", "bypass"),
    ("aot_autograd", "autograd_cache_guard_miss"): ("aotautograd", "guard_miss"),
    ("aot_autograd", "autograd_cache_saved"): ("aotautograd", "saved"),
    ("inductor", "generated_module_cache_hit"): ("generated_module", "hit"),
    ("inductor", "generated_module_cache_miss"): ("generated_module", "miss"),
    ("inductor", "async_compile_cache_hit"): ("async_compile", "hit"),
    ("inductor", "async_compile_cache_miss"): ("async_compile", "miss"),
    ("dynamo_cache", "dynamo_cache_hit"): ("dynamo", "hit"),
    ("dynamo_cache", "dynamo_cache_miss"): ("dynamo", "miss"),
}
"""torch counter (group, name) -> metric labels (cache, result). A fixed table keeps label values bounded."""
PRIMARY = (("fxgraph", "hit"), ("fxgraph", "miss"), ("aotautograd", "hit"), ("aotautograd", "miss"))
"""Always exported (as 0 until they happen), so that rates and ratios exist from the first scrape."""
Counters = Mapping[str, Mapping[str, int]]


def torch_counters() -> Counters:
    """``torch._dynamo.utils.counters`` when torch's Dynamo is loaded, else nothing."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return counters if counters is not None else {}


def graph_counts(counters: Counters) -> dict[tuple[str, str], int]:
    """(result, cause) -> graphs compiled in this process; every series present (as 0 until seen)."""
    counts = {("hit", "none"): 0} | {("miss", cause): 0 for cause in verdict.CAUSES if cause != "none"}
    if factors.recorder.installed:
        for labels, value in verdict.diagnose().causes().items():
            counts[labels] = counts.get(labels, 0) + value
        counts["hit", "none"] += int(counters.get("dynamo_cache", {}).get("dynamo_cache_hit", 0))  # loaded precompiled
    else:
        inductor = counters.get("inductor", {})
        counts["hit", "none"] = int(inductor.get("fxgraph_cache_hit", 0))
        counts["miss", "unknown"] = int(inductor.get("fxgraph_cache_miss", 0))
    return counts


def last_preload_wait() -> Any:
    """The last wait for a preload in this process (a :class:`cachelib.handoff.Waited`), if any."""
    handoff = sys.modules.get("cachelib.handoff")
    return getattr(handoff, "last_wait", None)


def cache_events(counters: Counters) -> dict[tuple[str, str], int]:
    """(cache, result) -> count, from a counters mapping (pure)."""
    events = dict.fromkeys(PRIMARY, 0)
    for (group, name), labels in CACHE_EVENTS.items():
        value = counters.get(group, {}).get(name)
        if value:
            events[labels] = events.get(labels, 0) + int(value)
    return events


class TorchCompileCacheCollector(Collector):
    """Reads torch's counters at every scrape; registers no state of its own."""

    def __init__(self, source: Any = torch_counters, waited: Any = None) -> None:
        self._source = source
        self._waited = waited or last_preload_wait

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        counters = self._source()
        events = CounterMetricFamily(
            "compilecache_runtime_cache_events",
            "torch.compile cache lookups in this process, by cache and result.",
            labels=["cache", "result"],
        )
        for (cache, result), value in sorted(cache_events(counters).items()):
            events.add_metric([cache, result], value)
        yield events
        frames = counters.get("frames", {})
        yield CounterMetricFamily(
            "compilecache_runtime_compiled_frames",
            "Frames torch.compile (Dynamo) compiled in this process.",
            value=int(frames.get("ok", 0)),
        )
        breaks = counters.get("graph_break", {})
        yield CounterMetricFamily(
            "compilecache_runtime_graph_breaks",
            "Graph breaks torch.compile (Dynamo) met in this process.",
            value=sum(int(v) for v in breaks.values()),
        )
        graphs = CounterMetricFamily(
            "compilecache_runtime_graphs",
            "Graphs torch.compile compiled in this process, by cache result and the factor that differed "
            "from the warm-up.",
            labels=["result", "cause"],
        )
        for (result, cause), value in sorted(graph_counts(counters).items()):
            graphs.add_metric([result, cause], value)
        yield graphs
        fallbacks = CounterMetricFamily(
            "compilecache_runtime_warm_start_fallbacks",
            "Precompiled entries this process refused and compiled afresh instead, by reason.",
            labels=["reason"],
        )
        for reason in precompileguard.FALLBACK_REASONS:
            fallbacks.add_metric([reason], precompileguard.fallbacks.get(reason, 0))
        yield fallbacks
        prepared = warmstart.last_prepared
        if prepared is not None:
            levers = GaugeMetricFamily(
                "compilecache_runtime_warm_start_levers",
                "Warm-start levers cachelib.runtime.warm_start() applied in this process (1 each).",
                labels=["lever"],
            )
            for lever in prepared.applied:
                levers.add_metric([lever], 1)
            yield levers
        waited = self._waited()
        if waited is not None:
            wait = GaugeMetricFamily(
                "compilecache_runtime_preload_wait_seconds",
                "Seconds the workload waited for the preload running beside it, by the preload's result.",
                labels=["result"],
            )
            wait.add_metric([waited.result], waited.seconds)
            yield wait
