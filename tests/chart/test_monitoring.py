"""The monitoring kit: PrometheusRule (checked and unit-tested with the real promtool), the Grafana dashboard,
and that both only query metrics and labels the operator exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from tests.chart.chart import CHART_DIR, Manifest, one

pytestmark = pytest.mark.helm

SELECTOR = re.compile(r"(?<![\w:])(compilecache_[a-z_]+)(?![\w:])(\{[^}]*\})?")
LABEL_MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(=~|!~|!=|=)")


@pytest.fixture(scope="module")
def promtool() -> Path:
    """Prometheus's promtool (Debian package `prometheus`); skipped outside CI when absent, a failure in CI."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool not found: apt-get install prometheus"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return Path(found)


def exported_series() -> dict[str, set[str]]:
    """Series name -> label names, for every metric of the operator's registry."""
    from compilecache_operator.metrics import Metrics

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
    return out


def selectors(expr: str) -> Iterator[tuple[str, set[str]]]:
    """(metric name, label names matched) for each compilecache_* selector in a PromQL expression."""
    for match in SELECTOR.finditer(expr):
        yield match.group(1), {m.group(1) for m in LABEL_MATCHER.finditer(match.group(2) or "")}


def assert_queries_exported_series(exprs: list[str], where: str) -> None:
    series = exported_series()
    assert series, "the operator exports no metrics"
    checked = 0
    for expr in exprs:
        for name, labels in selectors(expr):
            if ":" in name:
                continue
            assert name in series, f"{where}: {name} is not exported by the operator ({sorted(series)})"
            assert labels <= series[name], f"{where}: {name} has no label(s) {labels - series[name]}"
            checked += 1
    assert checked, f"{where}: no compilecache_* selectors found"


def rule_groups(rendered: list[Manifest]) -> dict[str, object]:
    return {"groups": one(rendered, "PrometheusRule")["spec"]["groups"]}


def test_rules_pass_promtool_check(renderings: dict[str, list[Manifest]], promtool: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(renderings["monitoring"])))
    proc = subprocess.run([str(promtool), "check", "rules", str(rules)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 3 rules found" in proc.stdout


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
                    "starting (threshold 0.9). Check `kubectl get cc -n ml` for a cache that is not Ready, and "
                    "compare the pods' torch/triton versions and GPU with the bundles in its status."),
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
    assert {"Hit rate", "Hit rate per cache", "Preloads by result", "Preload seconds", "Warm-up jobs",
            "Bundle bytes"} <= titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "cache"} <= variables
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for panel in panels:
        assert panel["targets"], f"panel {panel['title']} has no query"
        assert panel["datasource"]["uid"] == "${datasource}"
    hit_rate = next(p for p in panels if p["title"] == "Hit rate per cache")["targets"][0]["expr"]
    assert 'result="hit"' in hit_rate and 'result=~"hit|miss|error"' in hit_rate
    quantiles = next(p for p in panels if p["title"] == "Preload seconds")["targets"]
    assert all("histogram_quantile" in t["expr"] and "_bucket" in t["expr"] for t in quantiles)
    assert_queries_exported_series(exprs, "dashboard")
