"""The chart's knobs an SRE sets: PodDisruptionBudget maxUnavailable (or minAvailable), readiness probe timings,
topologySpreadConstraints, a NetworkPolicy, and the monitors' honorLabels and relabelings, with the per-namespace
metrics kept right under honorLabels false, checked with a real Prometheus scraping the operator's real metrics."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from tests.chart.chart import CHART_DIR, NAMESPACE, RELEASE, Manifest, helm, one, operator_container, template
from tests.infra.prometheus import PrometheusServer, operator_job
from testsupport.servers import free_port
from testsupport.wait import wait_for

pytestmark = pytest.mark.helm


def pdb_spec(helm_bin: Path, *sets: str) -> dict[str, object]:
    spec = one(template(helm_bin, set_values=sets), "PodDisruptionBudget")["spec"]
    return {k: v for k, v in spec.items() if k != "selector"}


def test_the_disruption_budget_takes_min_available_or_max_unavailable(helm_bin: Path) -> None:
    assert pdb_spec(helm_bin) == {"minAvailable": 1}
    assert pdb_spec(helm_bin, "highAvailability.minAvailable=null", "highAvailability.maxUnavailable=1") == {
        "maxUnavailable": 1}
    assert pdb_spec(helm_bin, "highAvailability.minAvailable=null", "highAvailability.maxUnavailable=50%") == {
        "maxUnavailable": "50%"}
    both = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--set", "highAvailability.maxUnavailable=1",
                check=False)
    assert both.returncode != 0 and "maxUnavailable" in both.stderr, "the schema takes one of the two"
    neither = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--set", "highAvailability.minAvailable=null",
                   check=False)
    assert neither.returncode != 0


def test_readiness_probe_timings_come_from_values(helm_bin: Path) -> None:
    probe = operator_container(template(helm_bin, set_values=[
        "operator.readinessProbe.periodSeconds=7", "operator.readinessProbe.failureThreshold=4"]))["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": "health"}
    assert (probe["periodSeconds"], probe["failureThreshold"], probe["timeoutSeconds"]) == (7, 4, 5)
    wrong = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--set", "operator.readinessProbe.path=/x",
                 check=False)
    assert wrong.returncode != 0, "the probe's endpoint is not a value"


def test_topology_spread_constraints_select_the_operator_unless_they_say(helm_bin: Path) -> None:
    base = "operator.topologySpreadConstraints[{i}].{k}={v}"
    wanted = (("zone", "ScheduleAnyway"), ("h", "DoNotSchedule"))
    sets = [base.format(i=i, k=k, v=v) for i, (key, when) in enumerate(wanted)
            for k, v in (("maxSkew", 1), ("topologyKey", key), ("whenUnsatisfiable", when))]
    sets.append("operator.topologySpreadConstraints[1].labelSelector.matchLabels.team=a")
    rendered = template(helm_bin, set_values=sets)
    pod = one(rendered, "Deployment")["spec"]["template"]
    first, second = pod["spec"]["topologySpreadConstraints"]
    assert first["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert first["topologyKey"] == "zone" and first["whenUnsatisfiable"] == "ScheduleAnyway"
    assert second["labelSelector"] == {"matchLabels": {"team": "a"}}
    assert "topologySpreadConstraints" not in one(template(helm_bin), "Deployment")["spec"]["template"]["spec"]


def monitors(helm_bin: Path, *sets: str) -> tuple[Manifest, Manifest]:
    rendered = template(helm_bin, set_values=["metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
                                              *sets])
    return one(rendered, "ServiceMonitor"), one(rendered, "PodMonitor")


def test_monitors_take_honor_labels_and_extra_relabelings(helm_bin: Path) -> None:
    service, pod = monitors(helm_bin)
    (endpoint,) = service["spec"]["endpoints"]
    (pod_endpoint,) = pod["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is False and pod_endpoint["honorLabels"] is False
    assert "relabelings" not in endpoint
    service, pod = monitors(
        helm_bin, "metrics.serviceMonitor.honorLabels=true",
        "metrics.serviceMonitor.relabelings[0].targetLabel=cluster",
        "metrics.serviceMonitor.relabelings[0].replacement=eu-1",
        "metrics.serviceMonitor.metricRelabelings[0].regex=process_.*",
        "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
        "metrics.serviceMonitor.metricRelabelings[0].action=drop",
        "metrics.podMonitor.relabelings[0].targetLabel=cluster", "metrics.podMonitor.relabelings[0].replacement=eu-1")
    (endpoint,) = service["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == [{"targetLabel": "cluster", "replacement": "eu-1"}]
    assert endpoint["metricRelabelings"][-1] == {"regex": "process_.*", "sourceLabels": ["__name__"], "action": "drop"}
    (pod_endpoint,) = pod["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["relabelings"][0]["targetLabel"] == "cache", "the chart's own relabeling stays first"
    assert pod_endpoint["relabelings"][-1] == {"targetLabel": "cluster", "replacement": "eu-1"}
    unknown = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--set", "metrics.serviceMonitor.relabelings[0].x=1",
                   check=False)
    assert unknown.returncode != 0


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus is not installed")
@pytest.mark.parametrize("honor", [False, True])
def test_per_namespace_metrics_keep_their_namespace_in_a_real_prometheus(helm_bin: Path, tmp_path: Path,
                                                                         honor: bool) -> None:
    """The operator's real metrics (a CompileCache of team-a Ready, one of team-b not) scraped by a real
    Prometheus through the rendered ServiceMonitor: with honorLabels false as with true, each series keeps its
    CompileCache's namespace, series without one carry the operator's, and no `exported_namespace` is left."""
    from compilecache_operator.edge.metrics import Metrics

    metrics = Metrics()
    metrics.observe_cache("team-a", "llama", {"conditions": [{"type": "Ready", "status": "True"}]})
    metrics.observe_cache("team-b", "bert", {"conditions": [{"type": "Ready", "status": "False"}]})
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    rendered = template(helm_bin, set_values=["metrics.serviceMonitor.enabled=true",
                                              f"metrics.serviceMonitor.honorLabels={str(honor).lower()}"])
    job = operator_job(one(rendered, "ServiceMonitor"), one(rendered, "Service", "-metrics"), f"127.0.0.1:{port}", "1s")
    prometheus = PrometheusServer(tmp_path / "prometheus", [job], {"groups": []})
    try:
        wait_for(lambda: len(prometheus.query("compilecache_cache_ready")) == 2, 30, "both caches scraped")
        ready = {(s["metric"]["namespace"], s["metric"]["cache"]): s["value"][1]
                 for s in prometheus.query("compilecache_cache_ready")}
        assert ready == {("team-a", "llama"): "1", ("team-b", "bert"): "0"}
        assert not prometheus.query('{exported_namespace!=""}')
        (build,) = prometheus.query("compilecache_operator_build_info")
        assert build["metric"]["namespace"] == NAMESPACE
    finally:
        prometheus.stop()
        server.shutdown()
        thread.join(5)


def test_network_policy_lets_in_the_webhook_and_scrapes_and_out_dns_the_api_server_and_the_stores(
    renderings: dict[str, list[Manifest]],
) -> None:
    assert not [m for m in renderings["default"] if m["kind"] == "NetworkPolicy"], "off by default"
    rendered = renderings["production"]
    policy = one(rendered, "NetworkPolicy")["spec"]
    pod = one(rendered, "Deployment")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in operator_container(rendered)["ports"]}
    webhook, scrape = policy["ingress"]
    assert [p["port"] for p in webhook["ports"]] == [ports["webhook"]] and "from" not in webhook
    assert [p["port"] for p in scrape["ports"]] == [ports["metrics"]]
    assert scrape["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    test_pod = one(rendered, "Pod", "-test")
    assert any(peer.keys() == {"podSelector"}  # the release's own namespace: `helm test` reads the metrics
               and peer["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
               for peer in scrape["from"]), scrape["from"]
    dns, api, store = policy["egress"]
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert [p["port"] for p in api["ports"]] == [443] and api["to"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert store["ports"] == [{"port": 6380, "protocol": "TCP"}]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
