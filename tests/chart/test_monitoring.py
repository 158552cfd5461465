"""The monitoring kit: PrometheusRule (checked and unit-tested with the real promtool), the Grafana dashboard
(its warm-start rate evaluated by promtool too), the workloads' PodMonitor, and that they only query metrics
and labels the operator, or the workloads through the PodMonitor, export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from tests.chart.chart import (
    CHART_DIR,
    CI_DIR,
    MONITORING_APIS,
    NAMESPACE,
    RELEASE,
    REPO_ROOT,
    Manifest,
    helm,
    of_kind,
    one,
    template,
)
from testsupport import unavailable

pytestmark = pytest.mark.helm

PODMONITOR_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "cache"}
"""Labels Prometheus gives every series scraped through the chart's PodMonitor (``cache``: the pod's CompileCache)."""
RUNTIME_LABELS = {"cache": "torch_cache"}
"""The runtime metrics' own labels the PodMonitor renames (their ``cache`` collides with the target's)."""
SELECTOR = re.compile(r"(?<![\w:])(compilecache_[a-z_]+)(?![\w:])(\{[^}]*\})?")
LABEL_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)")
RUNBOOKS = "https://github.com/compilecache/compilecache/blob/main/docs/runbooks.md"


@pytest.fixture(scope="module")
def promtool() -> Path:
    """Debian's promtool (the ``prometheus`` package, whose server the end-to-end tests run); skipped outside CI
    when absent, a failure in CI."""
    found = shutil.which("promtool")
    if found is None:
        unavailable("promtool not found: apt-get install prometheus")
    return Path(found)


def runtime_series() -> dict[str, set[str]]:
    """Series name -> label names of the workloads' runtime metrics as the PodMonitor stores them."""
    from prometheus_client import CollectorRegistry

    from cachelib import handoff, metrics

    registry = CollectorRegistry()
    counters = {"inductor": {"fxgraph_cache_hit": 1}, "frames": {"ok": 1}, "graph_break": {"x": 1}}
    registry.register(metrics.TorchCompileCacheCollector(lambda: counters, lambda: handoff.Waited("hit", 0.5)))
    out: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            labels = {RUNTIME_LABELS.get(k, k) for k in sample.labels}
            out.setdefault(sample.name, set()).update(labels | PODMONITOR_LABELS)
    return out


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, for every metric of the operator's registry and the runtime metrics."""
    from compilecache_operator.edge.metrics import Metrics

    metrics = Metrics()
    out: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, Counter | Gauge | Histogram):
            continue
        labels = set(metric._labelnames)
        name = metric._name
        if isinstance(metric, Counter):
            out[f"{name}_total"] = labels
        elif isinstance(metric, Histogram):
            out.update({f"{name}_{s}": labels for s in ("sum", "count")})
            out[f"{name}_bucket"] = labels | {"le"}
        else:
            out[name] = labels
    return {**runtime_series(), **out}


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """(metric name, label names matched) for each compilecache_* selector in a PromQL expression."""
    for match in SELECTOR.finditer(expr):
        yield match.group(1), {m.group(1) for m in LABEL_MATCHER.finditer(match.group(2) or "")}


FLEET_LABELS = {"cluster"}
"""Labels a fleet's Prometheus puts on every series (external labels, Thanos or Mimir), not the operator."""


def assert_queries_exported_series(exprs: list[str], where: str) -> None:
    series = exported_series()
    assert series, "the operator exports no metrics"
    checked = 0
    for expr in exprs:
        for name, labels in selectors(expr):
            if ":" in name:
                continue
            assert name in series, f"{where}: {name} is not exported by the operator ({sorted(series)})"
            assert labels - FLEET_LABELS <= series[name], f"{where}: {name} has no label(s) {labels - series[name]}"
            checked += 1
    assert checked, f"{where}: no compilecache_* selectors found"


def rule_groups(rendered: list[Manifest]) -> dict[str, object]:
    return {"groups": one(rendered, "PrometheusRule")["spec"]["groups"]}


def test_rules_pass_promtool_check(renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(renderings["monitoring"])))
    proc = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 7 rules found" in proc.stdout


def test_hit_rate_rule_and_alert_behave(renderings: dict[str, list[Manifest]], promtool: Path,
                                        tmp_path: Path) -> None:
    """promtool unit test on synthetic counters (ci/monitoring-values.yaml: window 30m, threshold 0.9, at least 10
    preloads per window, for 15m): a half-missing busy cache and a busy cache that never hits alert; a hitting
    one, a quiet missing one and one whose only non-hits are skipped pods do not."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(renderings["monitoring"])))

    def ratio(cache: str, value: float) -> dict[str, object]:
        labels = f'namespace_cache:compilecache_preload_hit_ratio:rate30m{{namespace="ml",cache="{cache}"}}'
        return {"labels": labels, "value": value}

    def series(cache: str, result: str, per_minute: int) -> dict[str, str]:
        return {"series": f'compilecache_preloads_total{{namespace="ml",cache="{cache}",gpu="h100",result="{result}"}}',
                "values": f"0+{per_minute}x120"}

    def alert(cache: str, rate: str) -> dict[str, object]:
        return {
            "exp_labels": {"namespace": "ml", "cache": cache, "severity": "critical"},
            "exp_annotations": {
                "summary": f"Pods of CompileCache ml/{cache} start cold.",
                "description": (
                    f"Only {rate} of the preloads of CompileCache ml/{cache} hit over the last 30m while pods keep "
                    "starting (threshold 0.9). The reason label of compilecache_preloads_total says why "
                    "(image-mismatch: the pods run an image no bundle was warmed with; no-bundle, store-unavailable, "
                    "deadline-exceeded, preload-failed). Check `kubectl get ccache -n ml` for a cache that is not "
                    "Ready, and compare the pods' images and GPU with the bundles in its status."),
                "runbook_url": f"{RUNBOOKS}#compilecachehitratelow",
            },
        }

    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                series("busy-cold", "hit", 1), series("busy-cold", "miss", 1),
                series("never-hits", "miss", 1), series("never-hits", "error", 1),
                series("warm", "hit", 2),
                {"series": 'compilecache_preloads_total{namespace="ml",cache="quiet",gpu="h100",result="miss"}',
                 "values": "0+0.1x120"},
                series("skips", "hit", 1), series("skips", "skipped", 5),
            ],
            "promql_expr_test": [{
                "expr": "namespace_cache:compilecache_preload_hit_ratio:rate30m",
                "eval_time": "60m",
                "exp_samples": [ratio("busy-cold", 0.5), ratio("warm", 1), ratio("never-hits", 0), ratio("quiet", 0),
                                ratio("skips", 1)],
            }],
            "alert_rule_test": [
                # The condition holds from the first minutes on; `for: 15m` keeps the alert pending until then.
                {"eval_time": "10m", "alertname": "CompileCacheHitRateLow", "exp_alerts": []},
                {"eval_time": "60m", "alertname": "CompileCacheHitRateLow", "exp_alerts": [
                    alert("busy-cold", "50%"), alert("never-hits", "0%")]},
            ],
        }],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    proc = subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_promtool_test(promtool: Path, tmp_path: Path, rendered: list[Manifest], test: dict[str, object]) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(rendered)))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                        "tests": [test]}))
    proc = subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def fired(alert: str, rendered: list[Manifest], labels: dict[str, str], **values: str) -> dict[str, object]:
    """The alert as promtool must see it: its labels, and its annotations with ``values`` filled in."""
    rule = next(r for g in rule_groups(rendered)["groups"] for r in g["rules"] if r.get("alert") == alert)  # type: ignore[attr-defined]
    annotations = {}
    for name, text in rule["annotations"].items():
        for key, value in {**labels, **values}.items():
            text = text.replace("{{ $labels." + key + " }}", value).replace("{{ $" + key + " }}", value)
        annotations[name] = text
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


def test_operator_down_fires_when_its_target_is_down_or_gone(
    renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path
) -> None:
    """`up` of the metrics Service's job: 1 for 20m, then 0 (down); a second release that vanishes (absent).
    Both fire after `for: 5m`; a healthy target never does, nor one replica down while another is up."""
    rendered = renderings["monitoring"]
    job = f"{RELEASE}-compilecache-operator-metrics"
    up = f'up{{job="{job}",namespace="{NAMESPACE}",instance="10.0.0.1:9090"}}'
    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "1m",
        "input_series": [{"series": up, "values": "1x20 0x40"}],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "CompileCacheOperatorDown", "exp_alerts": []},
            {"eval_time": "23m", "alertname": "CompileCacheOperatorDown", "exp_alerts": []},  # pending (for: 5m)
            {"eval_time": "30m", "alertname": "CompileCacheOperatorDown",
             "exp_alerts": [fired("CompileCacheOperatorDown", rendered, {"job": job, "namespace": NAMESPACE})]},
        ],
    })
    other = f'up{{job="{job}",namespace="{NAMESPACE}",instance="10.0.0.2:9090"}}'
    run_promtool_test(promtool, tmp_path, rendered, {  # one replica of two down: the other serves and leads
        "interval": "1m",
        "input_series": [{"series": up, "values": "1x20 0x40"}, {"series": other, "values": "1x60"}],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "CompileCacheOperatorDown", "exp_alerts": []}],
    })
    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "1m",
        "input_series": [{"series": 'up{job="something-else"}', "values": "1x60"}],
        "alert_rule_test": [
            {"eval_time": "30m", "alertname": "CompileCacheOperatorDown",
             "exp_alerts": [fired("CompileCacheOperatorDown", rendered, {"job": job, "namespace": NAMESPACE})]},
        ],
    })


def test_certificate_expiring_fires_for_a_replica_left_with_an_old_certificate(
    renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path
) -> None:
    """Two replicas export their served certificate's expiry (Unix time). One renews in time (its expiry jumps a
    year ahead); the other keeps a certificate that ends at 9 days: the alert fires for that one only once it is
    less than `certificateExpiry.days` (7) away and `for` has passed, never for the renewed one."""
    rendered = renderings["monitoring"]
    day = 86400
    job = f"{RELEASE}-compilecache-operator-metrics"

    def series(instance: str) -> str:
        return (f'compilecache_webhook_certificate_expiry_timestamp_seconds{{job="{job}",namespace="{NAMESPACE}",'
                f'instance="{instance}"}}')

    expected = fired("CompileCacheWebhookCertificateExpiring", rendered,
                     {"job": job, "namespace": NAMESPACE, "instance": "10.0.0.1:8080"})
    annotations = expected["exp_annotations"]
    assert isinstance(annotations, dict)
    annotations["description"] = annotations["description"].replace("{{ $value | humanizeDuration }}", "6d 0h 0m 0s")
    # A sample a minute over 4 days: the stuck replica's certificate ends at 9 days; the renewed one's at 9 days,
    # then (renewed after a day) at 365.
    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "1m",
        "input_series": [
            {"series": series("10.0.0.1:8080"), "values": f"{9 * day}x5760"},
            {"series": series("10.0.0.2:8080"), "values": f"{9 * day}x1440 {365 * day}x4320"},
        ],
        "alert_rule_test": [
            {"eval_time": "47h", "alertname": "CompileCacheWebhookCertificateExpiring", "exp_alerts": []},
            {"eval_time": "72h", "alertname": "CompileCacheWebhookCertificateExpiring", "exp_alerts": [expected]},
        ],
    })


def test_warmup_failing_fires_for_repeated_failures_without_a_success(
    renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path
) -> None:
    """Default window 6h, 2 failures: `broken` fails 3 times, `flaky` fails twice but also succeeds, `once`
    fails once. Only `broken` alerts."""
    rendered = renderings["monitoring"]

    def jobs(cache: str, result: str, values: str) -> dict[str, str]:
        return {"series": f'compilecache_warmup_jobs_total{{namespace="ml",cache="{cache}",result="{result}"}}',
                "values": values}

    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "10m",
        "input_series": [
            jobs("broken", "failed", "0 1 2 3 3 3 3 3 3 3"),
            jobs("flaky", "failed", "0 1 2 2 2 2 2 2 2 2"), jobs("flaky", "succeeded", "0 0 0 1 1 1 1 1 1 1"),
            jobs("once", "failed", "0 1 1 1 1 1 1 1 1 1"),
        ],
        "alert_rule_test": [
            {"eval_time": "60m", "alertname": "CompileCacheWarmupFailing",
             "exp_alerts": [fired("CompileCacheWarmupFailing", rendered, {"namespace": "ml", "cache": "broken"},
                                  value="3")]},
        ],
    })


def test_not_ready_fires_after_its_for(renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path) -> None:
    """Default `for: 1h`: a cache not Ready for 2h alerts; one that became Ready after 30m does not."""
    rendered = renderings["monitoring"]
    ready = 'compilecache_cache_ready{{namespace="ml",cache="{}"}}'
    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "1m",
        "input_series": [{"series": ready.format("stuck"), "values": "0x150"},
                         {"series": ready.format("warmed"), "values": "0x30 1x120"}],
        "alert_rule_test": [
            {"eval_time": "50m", "alertname": "CompileCacheNotReady", "exp_alerts": []},
            {"eval_time": "120m", "alertname": "CompileCacheNotReady",
             "exp_alerts": [fired("CompileCacheNotReady", rendered, {"namespace": "ml", "cache": "stuck"})]},
        ],
    })


def test_every_alert_links_its_runbook(renderings: dict[str, list[Manifest]]) -> None:
    runbooks = (REPO_ROOT / "docs" / "runbooks.md").read_text()
    alerts = [r for g in rule_groups(renderings["monitoring"])["groups"] for r in g["rules"] if "alert" in r]  # type: ignore[attr-defined]
    assert {a["alert"] for a in alerts} == {"CompileCacheHitRateLow", "CompileCacheOperatorDown",
                                            "CompileCacheWarmupFailing", "CompileCacheNotReady",
                                            "CompileCacheWebhookCertificateExpiring"}
    for alert in alerts:
        anchor = alert["alert"].lower()
        assert alert["annotations"]["runbook_url"] == f"{RUNBOOKS}#{anchor}"
        assert f"## {alert['alert']}\n" in runbooks, f"docs/runbooks.md has no section for {alert['alert']}"


def test_rules_query_what_the_operator_exports(renderings: dict[str, list[Manifest]]) -> None:
    groups = rule_groups(renderings["monitoring"])["groups"]
    assert isinstance(groups, list)
    assert_queries_exported_series([r["expr"] for g in groups for r in g["rules"]], "PrometheusRule")


def test_dashboard_configmap_carries_the_dashboard(renderings: dict[str, list[Manifest]]) -> None:
    configmap = one(renderings["monitoring"], "ConfigMap", "-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "compilecache"}
    (name, text), = configmap["data"].items()
    assert name.endswith(".json")
    assert json.loads(text) == json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())


def test_dashboard_panels_and_queries() -> None:
    dashboard = json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    titles = {p["title"] for p in panels}
    assert {"Preload hit rate", "Warm-start rate", "Preload hit rate per cache", "Warm-start rate per cache",
            "Preloads by result and reason", "Preload seconds", "torch cache lookups in workloads", "Warm-up jobs",
            "Bundle bytes"} <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "cluster", "namespace", "cache"} <= variables
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for panel in panels:
        assert panel["targets"], f"panel {panel['title']} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
    hit_rate = next(p for p in panels if p["title"] == "Preload hit rate per cache")["targets"][0]["expr"]
    assert 'result="hit"' in hit_rate and 'result=~"hit|miss|error"' in hit_rate
    quantiles = next(p for p in panels if p["title"] == "Preload seconds")["targets"]
    assert all("histogram_quantile" in t["expr"] and "_bucket" in t["expr"] for t in quantiles)
    assert_queries_exported_series(exprs, "dashboard")


# -- the workloads' warm starts -------------------------------------------------------------------------
def dashboard_expr(title: str) -> str:
    dashboard = json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())
    panel = next(p for p in dashboard["panels"] if p["title"] == title)
    expr: str = panel["targets"][0]["expr"]
    return expr


def as_rule(expr: str) -> str:
    """A dashboard query with Grafana's variables filled in, for promtool."""
    for variable, value in (("$__rate_interval", "5m"), ("$__range", "1h"), ("$cluster", ".*"), ("$namespace", ".*"),
                            ("$cache", ".*")):
        expr = expr.replace(variable, value)
    return expr


def test_the_warm_start_rate_counts_only_pods_that_started_warm(promtool: Path, tmp_path: Path) -> None:
    """Three pods of one cache as their runtime metrics arrive through the PodMonitor: one whose compile hit
    the preloaded cache, one that compiled with another image's bundle (torch misses) and one that did not
    see the preloaded directory (misses); a fourth has not compiled yet. Only the first counts as warm;
    a cache whose pods all missed reads 0, not nothing."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:warm_start_rate", "expr": as_rule(dashboard_expr("Warm-start rate"))},
        {"record": "dashboard:warm_start_rate_per_cache", "expr": as_rule(dashboard_expr("Warm-start rate per cache"))},
    ]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))

    def pod(cache: str, pod_name: str, result: str, values: str) -> dict[str, str]:
        labels = (f'namespace="ml",cache="{cache}",pod="{pod_name}",container="app",torch_cache="fxgraph",'
                  f'result="{result}"')
        return {"series": f"compilecache_runtime_cache_events_total{{{labels}}}", "values": values}

    series = [
        pod("mlp", "matching", "hit", "0 0 3x58"), pod("mlp", "matching", "miss", "0x60"),
        pod("mlp", "other-image", "hit", "0x60"), pod("mlp", "other-image", "miss", "0 0 3x58"),
        pod("mlp", "unwired", "hit", "0x60"), pod("mlp", "unwired", "miss", "0 0 2x58"),
        pod("mlp", "idle", "hit", "0x60"), pod("mlp", "idle", "miss", "0x60"),
        pod("cold", "a", "hit", "0x60"), pod("cold", "a", "miss", "0 1x59"),
    ]
    test = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {"expr": "dashboard:warm_start_rate", "eval_time": "30m",
             "exp_samples": [{"labels": "dashboard:warm_start_rate", "value": 0.25}]},
            {"expr": "dashboard:warm_start_rate_per_cache", "eval_time": "30m", "exp_samples": [
                {"labels": 'dashboard:warm_start_rate_per_cache{namespace="ml",cache="mlp"}', "value": 1 / 3},
                {"labels": 'dashboard:warm_start_rate_per_cache{namespace="ml",cache="cold"}', "value": 0},
            ]},
        ],
    }]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    proc = subprocess.run([str(promtool), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def with_pod_monitor(helm_bin: Path) -> list[Manifest]:
    return template(helm_bin, CI_DIR / "monitoring-values.yaml", set_values=["metrics.podMonitor.enabled=true"])


def test_the_pod_monitor_scrapes_opted_in_pods_by_port_name(with_pod_monitor: list[Manifest]) -> None:
    monitor = one(with_pod_monitor, "PodMonitor")
    assert monitor["metadata"]["name"].endswith("-workloads")
    spec = monitor["spec"]
    assert spec["selector"] == {"matchExpressions": [{"key": "compilecache.io/cache", "operator": "Exists"}]}
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("compilecache", "/metrics", False)
    assert endpoint["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_label_compilecache_io_cache"], "targetLabel": "cache"}]
    keep, rename, drop = endpoint["metricRelabelings"]
    assert keep == {"sourceLabels": ["__name__"], "regex": "compilecache_runtime_.+", "action": "keep"}
    assert rename["sourceLabels"] == ["exported_cache"] and rename["targetLabel"] == "torch_cache"
    assert drop == {"regex": "exported_cache", "action": "labeldrop"}


def test_the_pod_monitor_follows_the_watched_namespaces(helm_bin: Path, renderings: dict[str, list[Manifest]]) -> None:
    assert not of_kind(renderings["monitoring"], "PodMonitor"), "off unless asked for"
    watched = template(helm_bin, set_values=["metrics.podMonitor.enabled=true", "operator.watchNamespaces={a,b}"])
    assert one(watched, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}
    chosen = template(helm_bin, set_values=["metrics.podMonitor.enabled=true", "operator.watchNamespaces={a,b}",
                                            "metrics.podMonitor.namespaces={ml}", "metrics.podMonitor.portName=metrics",
                                            "metrics.podMonitor.labels.release=prom"])
    monitor = one(chosen, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_dashboard_queries_honour_the_cluster_namespace_and_cache_variables() -> None:
    """Every query of a metric labelled by namespace and cache filters on $cluster (a Thanos or Mimir fleet view's
    label; All matches series without it), $namespace and $cache, and keeps the cluster apart wherever it keeps
    namespaces apart; the namespace and cache choices follow the cluster chosen."""
    dashboard = json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())
    series = exported_series()
    checked = 0
    for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            for match in SELECTOR.finditer(target["expr"]):
                name, matchers = match.group(1), match.group(2) or ""
                if {"namespace", "cache"} <= series.get(name, set()):
                    assert 'namespace=~"$namespace"' in matchers and 'cache=~"$cache"' in matchers, (
                        f"{panel['title']}: {name}{matchers} ignores the dashboard's variables")
                    assert 'cluster=~"$cluster"' in matchers, f"{panel['title']}: {name}{matchers} ignores $cluster"
                    checked += 1
            for grouping in re.findall(r"(?:by|on) \(([^)]*)\)", target["expr"]):
                labels = [g.strip() for g in grouping.split(",")]
                assert "namespace" not in labels or "cluster" in labels, f"{panel['title']}: by ({grouping})"
    assert checked > 10
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    cluster = variables["cluster"]
    assert cluster["includeAll"] and cluster["allValue"] == ".*" and "cluster)" in cluster["query"]["query"]
    for name in ("namespace", "cache"):
        assert 'cluster=~"$cluster"' in variables[name]["query"]["query"], name


def test_no_dashboard_panel_mixes_units() -> None:
    """One unit per panel: no override gives some of a panel's series another unit (bytes beside bytes/s)."""
    dashboard = json.loads((CHART_DIR / "dashboards" / "compilecache.json").read_text())
    for panel in (p for p in dashboard["panels"] if p["type"] != "row"):
        overrides = panel.get("fieldConfig", {}).get("overrides", [])
        units = [prop for o in overrides for prop in o.get("properties", []) if prop.get("id") == "unit"]
        assert not units, f"{panel['title']}: series with units {[u['value'] for u in units]} beside " \
                          f"{panel['fieldConfig']['defaults'].get('unit')}"
    titles = {p["title"]: p for p in dashboard["panels"]}
    assert titles["Bundle bytes"]["fieldConfig"]["defaults"]["unit"] == "bytes"
    assert titles["Preloaded bytes per second"]["fieldConfig"]["defaults"]["unit"] == "Bps"


def test_an_operator_scraped_by_another_job_is_down_only_by_its_own_up_series(
    helm_bin: Path, promtool: Path, tmp_path: Path
) -> None:
    """Without the chart's ServiceMonitor the operator's `up` series carries the labels of the user's own scrape:
    the rule takes them from operatorDown.upSelector (a healthy operator then never fires, a down one does), and
    without it the chart refuses to render an alert that would fire forever."""
    base = ["metrics.prometheusRule.enabled=true", "metrics.serviceMonitor.enabled=false"]
    refused = helm(helm_bin, "template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
                   "--api-versions", "monitoring.coreos.com/v1", *[a for s in base for a in ("--set", s)], check=False)
    assert refused.returncode != 0 and "metrics.prometheusRule.operatorDown.upSelector" in refused.stderr
    selector = f'job="kubernetes-pods", namespace="{NAMESPACE}"'
    rendered = template(helm_bin, set_values=[*base, "metrics.prometheusRule.operatorDown.upSelector="
                                              + selector.replace(",", "\\,")],
                        apis=("--api-versions", "monitoring.coreos.com/v1"))
    up = f'up{{job="kubernetes-pods",namespace="{NAMESPACE}",instance="10.0.0.1:8080"}}'
    labels = {"job": "kubernetes-pods", "namespace": NAMESPACE}
    run_promtool_test(promtool, tmp_path, rendered, {
        "interval": "1m",
        "input_series": [{"series": up, "values": "1x20 0x40"}],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "CompileCacheOperatorDown", "exp_alerts": []},
            {"eval_time": "30m", "alertname": "CompileCacheOperatorDown",
             "exp_alerts": [fired("CompileCacheOperatorDown", rendered, labels)]},
        ],
    })


@pytest.mark.parametrize("apis", [("--api-versions", "monitoring.coreos.com/v1"), MONITORING_APIS],
                         ids=["group-version", "kinds"])
def test_monitoring_objects_render_where_the_group_version_is_served(helm_bin: Path, apis: tuple[str, ...]) -> None:
    """`helm template --api-versions monitoring.coreos.com/v1` (as Argo CD passes a cluster's APIs) renders the
    ServiceMonitor, PodMonitor and PrometheusRule as the kinds do; without either, none renders."""
    values = CI_DIR / "monitoring-values.yaml"
    sets = ["metrics.podMonitor.enabled=true"]
    kinds = {m["kind"] for m in template(helm_bin, values, set_values=sets, apis=apis)}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    kinds = {m["kind"] for m in template(helm_bin, values, set_values=sets, apis=())}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_only_the_kinds_named_render_where_some_kinds_of_the_group_are_named(helm_bin: Path) -> None:
    """A cluster that serves ServiceMonitor and PodMonitor but not PrometheusRule (helm install names every kind it
    serves, beside the group/version): no PrometheusRule, which the API server would refuse."""
    apis = ("--api-versions", "monitoring.coreos.com/v1", "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor",
            "--api-versions", "monitoring.coreos.com/v1/PodMonitor")
    kinds = {m["kind"] for m in template(helm_bin, CI_DIR / "monitoring-values.yaml",
                                         set_values=["metrics.podMonitor.enabled=true"], apis=apis)}
    assert {"ServiceMonitor", "PodMonitor"} <= kinds and "PrometheusRule" not in kinds
