"""Runtime counters: torch's compile-cache counters of this process as Prometheus metrics.

A real compile's counters are checked end to end in test_preloaded_compile_hits (the demo's workload);
here the collector is fed counters shaped like torch._dynamo.utils.counters."""

from __future__ import annotations

import sys
import urllib.request
from collections import Counter, defaultdict
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cachelib import metrics, runtime
from testsupport.servers import free_port


def fake_counters() -> defaultdict[str, Counter[str]]:
    counters: defaultdict[str, Counter[str]] = defaultdict(Counter)
    counters["inductor"].update(fxgraph_cache_hit=3, fxgraph_cache_miss=1, async_compile_cache_hit=2)
    counters["aot_autograd"].update(autograd_cache_hit=2, autograd_cache_bypass=1, autograd_cache_saved=4)
    counters["frames"].update(ok=5, total=6)
    counters["graph_break"].update({"reason a": 2, "reason b": 1})
    counters["inductor"]["unrelated_counter"] = 9
    return counters


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples}


def test_cache_events_table() -> None:
    events = metrics.cache_events(fake_counters())
    assert events[("fxgraph", "hit")] == 3 and events[("fxgraph", "miss")] == 1
    assert events[("aotautograd", "hit")] == 2 and events[("aotautograd", "miss")] == 0
    assert events[("aotautograd", "bypass")] == 1 and events[("aotautograd", "saved")] == 4
    assert events[("async_compile", "hit")] == 2
    assert metrics.cache_events({}) == dict.fromkeys(metrics.PRIMARY, 0)


def test_collector_reads_at_scrape_time() -> None:
    counters = fake_counters()
    registry = CollectorRegistry()
    registry.register(metrics.TorchCompileCacheCollector(lambda: counters))
    first = samples(registry)
    events = "compilecache_runtime_cache_events_total"
    assert first[(events, (("cache", "fxgraph"), ("result", "hit")))] == 3
    assert first[("compilecache_runtime_compiled_frames_total", ())] == 5
    assert first[("compilecache_runtime_graph_breaks_total", ())] == 3
    counters["inductor"]["fxgraph_cache_hit"] += 1
    assert samples(registry)[(events, (("cache", "fxgraph"), ("result", "hit")))] == 4
    labels = {dict(k[1]).get("cache") for k in first if k[0] == events}
    assert labels <= {"fxgraph", "aotautograd", "generated_module", "async_compile", "dynamo"}


def test_without_torch_loaded_there_is_nothing_to_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert metrics.torch_counters() == {}
    text = runtime.metrics_text()
    assert 'compilecache_runtime_cache_events_total{cache="fxgraph",result="hit"} 0.0' in text


def test_reads_torch_counters_when_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    class Utils:
        counters: Any = fake_counters()

    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", Utils)
    assert 'cache="fxgraph",result="hit"} 3.0' in runtime.metrics_text()


def test_http_server_serves_the_metrics() -> None:
    registry = CollectorRegistry()
    port = free_port()
    assert runtime.register(registry) is runtime.register(registry)  # idempotent
    server, thread = runtime.start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    assert "# TYPE compilecache_runtime_cache_events_total counter" in body
