"""A real Prometheus for the end-to-end tests: scrapes the operator and opted-in pods, evaluates the chart's rules.

There is no prometheus-operator here, so the chart's monitoring objects are turned into the configuration
prometheus-operator would generate from them (pure functions, unit-testable):

- ``pod_monitor_job``: the chart's PodMonitor → a pod job (keep pods with the selector's labels and the
  named port, drop finished pods, add ``namespace``, ``pod``, ``container``, ``endpoint`` and ``job``, then
  the PodMonitor's own relabelings and metric relabelings). Debian's ``prometheus`` is built without
  Kubernetes service discovery, so the targets come from ``PodDiscovery``: it lists the pods of the real API
  server and writes, for ``file_sd_configs``, the targets and ``__meta_kubernetes_pod_*`` labels that
  ``kubernetes_sd_configs`` (role pod) would give (``pod_targets``, a stand-in for that discovery only);
- ``operator_job``: the ServiceMonitor's endpoint → a static target for an operator that runs as a process
  on this host, labelled as the Service's endpoints would be (``job`` = the metrics Service, ``namespace``),
  with the ServiceMonitor's ``honorLabels``, relabelings and metric relabelings;
- ``rule_groups``: the PrometheusRule's ``spec.groups``, as a rule file.

``PrometheusServer`` runs Debian's ``prometheus`` (2.42 on bookworm: every query and rule of the chart
parses there) on a free loopback port with its own TSDB, and answers instant queries and the alerts API.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from testsupport.kube.cluster import ManagedProcess
from testsupport.kube.rest import KubeClient
from testsupport.servers import free_port
from testsupport.wait import wait_for

JSON = dict[str, Any]


def _label_meta(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def pod_monitor_job(monitor: Mapping[str, Any], targets_file: Path, interval: str = "") -> JSON:
    """The scrape job prometheus-operator generates for ``monitor`` (one endpoint), its pods discovered through
    ``targets_file`` (see ``PodDiscovery``)."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    meta = monitor["metadata"]
    relabel: list[JSON] = []
    for key, value in (spec.get("selector", {}).get("matchLabels") or {}).items():
        relabel.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{_label_meta(key)}"],
                        "regex": value})
    for expression in spec.get("selector", {}).get("matchExpressions") or []:
        present = f"__meta_kubernetes_pod_labelpresent_{_label_meta(expression['key'])}"
        if expression["operator"] == "Exists":
            relabel.append({"action": "keep", "source_labels": [present], "regex": "true"})
        elif expression["operator"] == "DoesNotExist":
            relabel.append({"action": "drop", "source_labels": [present], "regex": "true"})
        else:
            raise ValueError(f"selector operator {expression['operator']} is not translated")
    relabel += [
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *(_relabel(r) for r in endpoint.get("relabelings") or []),
    ]
    names = (spec.get("namespaceSelector") or {}).get("matchNames")
    if names:
        relabel.insert(0, {"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                           "regex": "|".join(names)})
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": interval or endpoint.get("interval", "30s"),
        "scrape_timeout": interval or endpoint.get("scrapeTimeout", "10s"),
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
        "relabel_configs": relabel,
        "metric_relabel_configs": [_relabel(r) for r in endpoint.get("metricRelabelings") or []],
    }


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """What Prometheus's Kubernetes discovery (role pod) gives for ``pods``: a target per container port (a
    container without ports gives its pod IP alone), with its ``__meta_kubernetes_*`` labels."""
    found: list[JSON] = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        meta = pod["metadata"]
        common = {
            "__meta_kubernetes_namespace": meta["namespace"], "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip, "__meta_kubernetes_pod_phase": pod["status"].get("phase", ""),
            "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
            "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        }
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{_label_meta(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{_label_meta(key)}"] = "true"
        for container in pod["spec"]["containers"]:
            labels = {**common, "__meta_kubernetes_pod_container_name": container["name"]}
            ports = container.get("ports") or []
            if not ports:
                found.append({"targets": [ip], "labels": labels})
            for port in ports:
                found.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **labels, "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }})  # fmt: skip
    return found


class PodDiscovery:
    """Lists the API server's pods every ``interval`` seconds into ``path`` (file_sd JSON, ``pod_targets``)."""

    def __init__(self, client: KubeClient, path: Path, interval: float = 0.5) -> None:
        self.client, self.path, self.interval = client, path, interval
        self._stop = threading.Event()
        self.write()
        self._thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        self._thread.start()

    def write(self) -> None:
        pods = self.client.get("/api/v1/pods")["items"]
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(pod_targets(pods)))
        scratch.replace(self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a failed listing keeps the last targets, as Prometheus does
                self.write()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _relabel(rule: Mapping[str, Any]) -> JSON:
    """A prometheus-operator RelabelConfig (camelCase) as Prometheus's relabel_config (snake_case)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label", "separator": "separator",
             "regex": "regex", "replacement": "replacement", "action": "action", "modulus": "modulus"}
    return {names[k]: v for k, v in rule.items()}


def operator_job(service_monitor: Mapping[str, Any], service: Mapping[str, Any], target: str, interval: str) -> JSON:
    """The ServiceMonitor's job for an operator serving /metrics at ``target`` (host:port) on this host."""
    (endpoint,) = service_monitor["spec"]["endpoints"]
    return {
        "job_name": "serviceMonitor/{namespace}/{name}/0".format(**service_monitor["metadata"]),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "static_configs": [{"targets": [target], "labels": {
            "job": service["metadata"]["name"], "namespace": service["metadata"]["namespace"],
            "endpoint": endpoint["port"],
        }}],
        "relabel_configs": [_relabel(r) for r in endpoint.get("relabelings") or []],
        "metric_relabel_configs": [_relabel(r) for r in endpoint.get("metricRelabelings") or []],
    }  # fmt: skip


def rule_groups(prometheus_rule: Mapping[str, Any]) -> JSON:
    """The rule file of a PrometheusRule."""
    return {"groups": list(prometheus_rule["spec"]["groups"])}


class PrometheusServer:
    """``prometheus`` on a free loopback port with ``jobs`` and ``rules``, evaluating every ``interval``."""

    def __init__(self, workdir: Path, jobs: Iterable[JSON], rules: JSON, interval: str = "1s") -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (Debian: apt-get install prometheus)")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": [str(workdir / "rules.yml")], "scrape_configs": list(jobs)}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        check = subprocess.run([shutil.which("promtool") or "promtool", "check", "config",
                                str(workdir / "prometheus.yml")], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"promtool check config failed:\n{check.stdout}\n{check.stderr}")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.process = ManagedProcess("prometheus", [
            binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn",
        ], workdir / "prometheus.log")  # fmt: skip

        def ready() -> bool:
            self.process.check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        wait_for(ready, 60, "prometheus /-/ready", interval=0.2)

    def stop(self) -> None:
        self.process.stop()

    def api(self, path: str, **query: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {query}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[JSON]:
        """An instant query now; the vector's samples (``metric``, ``value``)."""
        data = self.api("query", query=expr, time=f"{time.time():.3f}")
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[JSON]:
        return list(self.api("alerts")["alerts"])

    def targets(self) -> list[JSON]:
        return list(self.api("targets")["activeTargets"])
