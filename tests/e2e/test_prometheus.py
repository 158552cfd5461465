"""A real Prometheus scrapes the operator and an instrumented workload on the real node, evaluates the chart's
recording and alerting rules, and answers every Grafana dashboard panel's query.

The chart is rendered with its ServiceMonitor, PodMonitor and PrometheusRule (``for: 0s`` and small thresholds,
so that alerts fire within the test); tests/infra/prometheus.py turns them into Prometheus's own
configuration, as prometheus-operator would. Then real pods hit, miss and fail:

- one CompileCache warms ``tiny_mlp``; its pods preload it (hit) and compile warm, serving cachelib.runtime's
  metrics on the PodMonitor's port; pods pinned to a GPU type without a bundle miss;
- another CompileCache's warm-up fails (a target that does not exist);
- finally the operator stops.

Every outcome happens once: the operator makes a CompileCache's counter series at 0 when it learns of the
cache and its GPU types, so ``increase()`` sees the first hit, miss and failed warm-up of each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chart import CHART_DIR, one, template
from tests.e2e.conftest import GPU_LABEL, GPU_PRODUCT, WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.infra.podspec import restricted
from tests.infra.prometheus import PodDiscovery, PrometheusServer, operator_job, pod_monitor_job, rule_groups
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
TIMEOUT = 420
METRICS_PORT = 9400
SERVE_RUNTIME_METRICS = e2e.COMPILE_TINY_MLP + f"""
import time
from cachelib import runtime
runtime.start_http_server({METRICS_PORT})
time.sleep(3600)
"""
RULE_VALUES = (
    "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.for=0s", "metrics.prometheusRule.minPreloads=1",  # hitRateThreshold: 0.8, the default
    "metrics.prometheusRule.operatorDown.for=0s", "metrics.prometheusRule.warmupFailing.failures=1",
    "metrics.prometheusRule.notReady.for=0s",
)


@pytest.fixture
def prometheus(
    operator: e2e.OperatorProcess, kube_cluster: LocalCluster, kube_namespace: str, helm_bin: Path, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[PrometheusServer]:
    rendered = template(helm_bin, set_values=RULE_VALUES, namespace=kube_namespace)
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    client = kube_cluster.client()
    discovery = PodDiscovery(client, workdir / "pods.json")
    jobs = [
        operator_job(one(rendered, "ServiceMonitor"), one(rendered, "Service", "-metrics"),
                     f"127.0.0.1:{operator.metrics_port}", "1s"),
        pod_monitor_job(one(rendered, "PodMonitor"), discovery.path, interval="1s"),
    ]
    server = PrometheusServer(workdir, jobs, rule_groups(one(rendered, "PrometheusRule")))
    try:
        yield server
    finally:
        request.node.add_report_section("teardown", "prometheus log", server.process.log_tail())
        server.stop()
        discovery.stop()
        client.close()


def app_pod(name: str, cache: str, command: str, **spec: Any) -> dict[str, Any]:
    app = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", command],
           "ports": [{"name": "compilecache", "containerPort": METRICS_PORT}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
            "spec": restricted({"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [app],
                                **spec})}


def values(prometheus: PrometheusServer, expr: str) -> list[float]:
    return [float(sample["value"][1]) for sample in prometheus.query(expr)]


def firing(prometheus: PrometheusServer, name: str, **labels: str) -> bool:
    return any(a["labels"].get("alertname") == name and a["state"] == "firing"
               and all(a["labels"].get(k) == v for k, v in labels.items()) for a in prometheus.alerts())


def test_prometheus_computes_the_hit_rate_fires_the_alerts_and_feeds_every_dashboard_panel(
    operator: e2e.OperatorProcess, prometheus: PrometheusServer, kube_client: KubeClient, kube_namespace: str,
    redis_server: RedisServer, real_node: RealNode,
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
    e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", TIMEOUT)
    pods = f"/api/v1/namespaces/{ns}/pods"

    # the cache's series exist at 0 before anything happened to them (and Prometheus scrapes the operator)
    mlp = f'namespace="{ns}", cache="mlp"'
    wait_for(lambda: values(prometheus, f'compilecache_preloads_total{{{mlp}, result="hit"}}'), 60,
             "the zero series of the preloads in Prometheus")
    assert set(values(prometheus, f'compilecache_preloads_total{{{mlp}}}')) == {0.0}
    broken = {"image": WORKLOAD_IMAGE, "model": {"target": "no_such_module:build"},
              "storage": {"url": redis_server.store_url()}, "warmup": {"backoffLimit": 0}}
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("broken", broken))

    # one warm pod (serving its runtime metrics until Prometheus has them) and one pinned pod that misses
    kube_client.post(pods, app_pod("warm", "mlp", SERVE_RUNTIME_METRICS))
    kube_client.post(pods, app_pod("pinned", "mlp", "pass", nodeSelector={GPU_LABEL: GPU_PRODUCT}))
    # the workload's own counters start with its first compile: two scrapes of them give rate() a value
    wait_for(lambda: values(prometheus, 'count_over_time(compilecache_runtime_cache_events_total{pod="warm", '
                                        'torch_cache="fxgraph", result="hit"}[10m]) >= 2'), TIMEOUT,
             "Prometheus to scrape the warm pod twice")
    wait_for(lambda: e2e.pod_terminated(kube_client, ns, "pinned"), TIMEOUT, "the pinned pod to finish")
    wait_for(lambda: values(prometheus, f'sum(compilecache_preloads_total{{{mlp}}})') == [2.0], 60,
             "the operator's counts in Prometheus")
    kube_client.delete(f"{pods}/warm")

    # the first hit, the first miss and the first failed warm-up are each seen by increase()
    for what, expr in (("hit", f'compilecache_preloads_total{{{mlp}, result="hit"}}'),
                       ("miss", f'compilecache_preloads_total{{{mlp}, result="miss"}}'),
                       ("failed warm-up", f'compilecache_warmup_jobs_total{{namespace="{ns}", cache="broken", '
                                          'result="failed"}')):
        wait_for(lambda expr=expr: sum(values(prometheus, f"increase({expr}[1h])")) > 0, TIMEOUT,
                 f"increase() to see the first {what}")

    # the recording rules: one hit of two preloads
    ratio = wait_for(lambda: values(prometheus, f'namespace_cache:compilecache_preload_hit_ratio:rate1h'
                                                f'{{namespace="{ns}", cache="mlp"}}') or None, 60, "the hit ratio")
    assert len(ratio) == 1 and 0.2 < ratio[0] < 0.8, ratio
    assert values(prometheus, f'namespace_cache:compilecache_preloads:increase1h{{namespace="{ns}", cache="mlp"}}')
    # the alerts: a low hit rate, a failing warm-up, a cache that is not Ready
    wait_for(lambda: firing(prometheus, "CompileCacheHitRateLow", namespace=ns, cache="mlp"), 60,
             "CompileCacheHitRateLow to fire")
    wait_for(lambda: firing(prometheus, "CompileCacheNotReady", namespace=ns, cache="broken"), 60,
             "CompileCacheNotReady to fire")
    wait_for(lambda: firing(prometheus, "CompileCacheWarmupFailing", namespace=ns, cache="broken"), TIMEOUT,
             "CompileCacheWarmupFailing to fire")

    # every panel of the Grafana dashboard returns data for this namespace
    dashboard = json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets") or []:
            expr = (target["expr"].replace("$cluster", ".*").replace("$namespace", ns).replace("$cache", ".*")
                    .replace("$__range", "1h").replace("$__rate_interval", "10m"))
            found = values(prometheus, expr)
            if not found or all(math.isnan(v) for v in found):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "\n".join(empty)

    # the operator goes away: CompileCacheOperatorDown
    operator.stop()
    wait_for(lambda: firing(prometheus, "CompileCacheOperatorDown", namespace=ns), 60,
             "CompileCacheOperatorDown to fire")
