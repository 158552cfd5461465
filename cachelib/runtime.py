"""torch's compile-cache hits and misses of the running process, as Prometheus metrics.

The preloader knows whether a bundle was unpacked; only the workload knows whether its
compiles then hit. This collector reads ``torch._dynamo.utils.counters`` at scrape time
(it never imports torch itself: before torch is loaded there is nothing to report)::

    from cachelib import runtime
    runtime.start_http_server(9400)      # or runtime.register() with your own registry

Metrics:

- ``compilecache_runtime_cache_events_total{cache, result}`` -- torch's cache lookups:
  ``cache`` is ``fxgraph``, ``aotautograd``, ``generated_module``, ``async_compile`` or
  ``dynamo``; ``result`` is ``hit``, ``miss``, ``bypass`` (not cacheable), ``guard_miss`` or
  ``saved``.
- ``compilecache_runtime_compiled_frames_total`` -- frames Dynamo compiled.
- ``compilecache_runtime_graph_breaks_total`` -- graph breaks Dynamo met.
- ``compilecache_runtime_warm_start_levers{lever}`` -- 1 for each lever :func:`warm_start` applied
  (``torch_key``, ``triton_key``, ``caching_precompile``, ``lazy_compile_pool``, ``triton_modules``);
  absent until it was called.
- ``compilecache_runtime_warm_start_fallbacks_total{reason}`` -- precompiled entries refused and
  compiled afresh instead (``unreadable``, ``source_changed``, ``load_failed``, ``install_failed``):
  :func:`warm_start` guards torch's loader, so a bad entry costs a compile, never the process.
- ``compilecache_runtime_graphs_total{result, cause}`` -- graphs this process compiled, by whether
  torch's caches had them (``hit``, ``miss``) and, for a miss, the factor that differed from the
  warm-up's (a bounded ``cause``: :data:`cachelib.factors.CAUSES`; ``none`` for a hit). Recorded
  from :func:`warm_start` on; without it, or where this torch's internals cannot be read, FX-graph
  misses count as ``unknown``. The names and both values are in :func:`why` and in
  ``compilecache-why.json`` of the cache directory (:mod:`cachelib.factors`).
- ``compilecache_runtime_preload_wait_seconds{result}`` -- how long
  :func:`cachelib.handoff.wait_for_preload` waited for a preload running beside the workload,
  labelled with the preload's result (hit, miss, error, timeout); absent until it was called.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cachelib import factors, triton_modules, warmstart
from cachelib.handoff import wait_for_preload

log = logging.getLogger(__name__)

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
    counts = {("hit", "none"): 0} | {("miss", cause): 0 for cause in factors.CAUSES if cause != "none"}
    if factors.recorder.installed:
        for labels, value in factors.diagnose().causes().items():
            counts[labels] = counts.get(labels, 0) + value
        counts["hit", "none"] += int(counters.get("dynamo_cache", {}).get("dynamo_cache_hit", 0))  # loaded precompiled
    else:
        inductor = counters.get("inductor", {})
        counts["hit", "none"] = int(inductor.get("fxgraph_cache_hit", 0))
        counts["miss", "unknown"] = int(inductor.get("fxgraph_cache_miss", 0))
    return counts


def why() -> factors.Diagnosis:
    """Which factor made this process compile afresh, per graph (see :mod:`cachelib.factors`)."""
    return factors.diagnose()


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
        for reason in warmstart.FALLBACK_REASONS:
            fallbacks.add_metric([reason], warmstart.fallbacks.get(reason, 0))
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


def warm_start(cache_dir: str | None = None, *, wait: bool = True) -> warmstart.Prepared:
    """Before the first ``torch.compile``: apply the preloaded bundle's warm-start manifest.

    With a bundle made with ``spec.model.precompile: Auto`` and the very torch and Triton
    installation of the warm-up, torch and Triton get the warm-up's source keys (no hashing of
    their sources) and Dynamo's caching precompile (no re-tracing); on any mismatch, nothing of it,
    and the reasons are in the answer's ``declined``. Torch's loader of precompiled entries is
    guarded: an entry that fails to load is a counted fallback (an ordinary compile, the FX-graph
    cache still hits), never an exception. See :mod:`cachelib.warmstart`.

    Dynamo looks its precompiled entry up when ``torch.compile`` is called, so a preload running
    beside the workload (Sidecar mode) must be done by then: with ``wait`` (the default) this
    first waits for it (:func:`cachelib.handoff.wait_for_preload`, at once where none runs).

    Triton's compiled C modules that the bundle carries (:mod:`cachelib.triton_modules`) are put where
    this process's Triton looks for them, so that it neither runs nor needs a C compiler.

    From here on, every graph compiled is compared with the warm-up's record of the same graph
    (:mod:`cachelib.factors`): :func:`why` and the ``compilecache_runtime_graphs_total`` metric say
    which factor made a graph compile afresh."""
    if wait:
        wait_for_preload()
    prepared = warmstart.prepare(cache_dir)
    if prepared.cache_dir:
        install_triton_modules(Path(prepared.cache_dir), prepared)
    try:
        factors.start_watching(prepared.cache_dir)
    except Exception:  # the diagnosis is optional; the workload is not
        log.warning("compilecache: the compile factors will not be recorded", exc_info=True)
    return prepared


def install_triton_modules(cache_dir: Path, done: warmstart.Prepared) -> None:
    """Install the bundle's Triton modules; the lever ``triton_modules`` when any is in place."""
    installed = triton_modules.install(cache_dir)
    if installed.placed or installed.present:
        done.applied.append("triton_modules")
    for problem in installed.problems[:3]:
        done.declined.append(f"triton_modules: {problem}")


_registered: dict[int, TorchCompileCacheCollector] = {}


def register(registry: CollectorRegistry = REGISTRY) -> TorchCompileCacheCollector:
    """Register the collector with ``registry`` once; later calls return the same collector."""
    if id(registry) not in _registered:
        collector = TorchCompileCacheCollector()
        registry.register(collector)
        _registered[id(registry)] = collector
    return _registered[id(registry)]


def metrics_text(registry: CollectorRegistry | None = None) -> str:
    """The Prometheus text exposition of the runtime metrics (a private registry by default)."""
    if registry is None:
        registry = CollectorRegistry()
        registry.register(TorchCompileCacheCollector())
    return generate_latest(registry).decode()


def start_http_server(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> Any:
    """Register the collector and serve ``/metrics`` on ``addr:port`` from a daemon thread."""
    register(registry)
    return _start_http_server(port, addr=addr, registry=registry)
