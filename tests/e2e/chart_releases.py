"""Helm releases of the chart on the session's control plane, as the chart's e2e tests install them."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart import CHART_DIR, helm, parse_manifests, scenario_files
from tests.chart.e2e_fixtures import (
    MWC_API,
    Release,
)
from tests.infra.node import GATEWAY, PROJECT_TAGS, RealNode
from tests.operator.e2e_support import (
    OperatorProcess,
)
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.namespaces import create_namespace, delete_namespace
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for


def allowed(client: KubeClient, method: str, path: str, body: Any = None) -> bool:
    """Whether the API server lets ``client`` make the call (create/delete as server-side dry runs)."""
    query = {"dryRun": "All"} if method in ("POST", "DELETE", "PATCH") else None
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    for attempt in range(50):
        try:
            client.request(method, path, body=body, query=query, content_type=content_type)
        except KubeAPIError as error:
            if error.status == 403:
                return False
            if error.status in (404, 409, 422):  # authorized, then refused for another reason
                return True
            if error.status == 429 and attempt < 49:  # a just-installed CRD's storage is initializing
                time.sleep(0.2)
                continue
            raise
        return True
    raise AssertionError("unreachable")


class ChartOperator(OperatorProcess):
    """The operator with the chart's webhook wiring: an external configuration and a certificate directory."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path, webhook_config: str, cert_dir: Path,
                 *extra: str) -> None:
        super().__init__(kubeconfig, namespace, workdir, *extra)
        self.webhook_config = webhook_config
        self.cert_dir = cert_dir

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--webhook-config") + 1] = "external"
        return [*argv, "--webhook-cert-dir", str(self.cert_dir)]

    def start(self, client: KubeClient, timeout: float = 60) -> None:
        """Started and ready: its webhooks answer (the chart's check of CompileCaches fails closed)."""
        super().start(client, timeout)
        wait_for(self.ready, timeout, "the operator ready, its webhooks listening")


def point_webhook_at(client: KubeClient, name: str, url: str, ca: bytes, api: str = MWC_API) -> dict[str, Any]:
    """Replace the chart's webhook clientConfig (Service) by a URL; every other field stays as rendered."""
    config = client.get(f"{api}/{name}")
    (hook,) = config["webhooks"]
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca).decode()}
    return client.request("PUT", f"{api}/{name}", body=config)


OTHER_PROJECTS = ("cert-manager.io/",)


def server_dry_run(cluster: LocalCluster, client: KubeClient, helm_bin: Path, kubectl_bin: Path,
                   values: Path | None, namespace: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Render ``values`` for ``cluster``'s version into ``namespace`` and have the API server dry-run every object;
    the other namespaces the scenario names (its teams', its dashboard's) are made for the run and removed."""
    version = client.get("/version")["gitVersion"].lstrip("v")
    args = ["template", "dry", str(CHART_DIR), "--namespace", namespace, "--kube-version", version]
    if values is not None:
        args += ["--values", str(values)]
    manifests = parse_manifests(helm(helm_bin, *args).stdout)
    ours = [m for m in manifests if not m["apiVersion"].startswith(OTHER_PROJECTS)]
    assert len(ours) >= 5, [m["kind"] for m in manifests]
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(ours))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    others = sorted({m["metadata"]["namespace"] for m in ours if m["metadata"].get("namespace")} - {namespace}
                    - {n["metadata"]["name"] for n in client.get("/api/v1/namespaces")["items"]})
    for name in others:
        client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        return subprocess.run([str(kubectl_bin), "apply", "--server-side", "--force-conflicts", "--dry-run=server",
                               "-f", str(path)],
                              capture_output=True, text=True, timeout=120, env=env)
    finally:
        for name in others:
            delete_namespace(client, name)


def assert_the_server_accepts(cluster: LocalCluster, client: KubeClient, helm_bin: Path, kubectl_bin: Path,
                              scenario: str, tmp_path: Path, make_default_account: bool = False) -> None:
    """The API server of ``cluster`` dry-runs every object of ``scenario`` without an error or a warning (the
    namespace's default ServiceAccount made by the test where no controller manager makes it)."""
    namespace = create_namespace(client, "restricted", prefix="ccdry", make_default_account=make_default_account)
    try:
        proc = server_dry_run(cluster, client, helm_bin, kubectl_bin, scenario_files()[scenario], namespace, tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Warning" not in proc.stderr, proc.stderr
    finally:
        delete_namespace(client, namespace)


def operator_values(tmp_path: Path, api: tuple[str, int], namespace: str, replicas: int) -> Path:
    """Values for the chart's operator as pods here: our images as the node has them, one watched namespace,
    the tests' stores allowed, the API server at the relay."""
    def image(name: str) -> dict[str, str]:
        repository, tag = PROJECT_TAGS[name].rsplit(":", 1)
        return {"repository": repository, "tag": tag, "pullPolicy": "Never"}  # no registry: imported images only

    values = {
        "images": {"operator": image("operator"), "preloader": image("preloader")},
        "highAvailability": {"replicas": replicas},
        "confinement": {"storeHosts": [GATEWAY, "127.0.0.1"]},  # redis_server; the HA test's unreachable store
        "operator": {"watchNamespaces": [namespace], "verbose": True, "extraEnv": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": api[0]},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(api[1])},
        ]},
    }
    path = tmp_path / "operator-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def operator_pods(client: KubeClient, release: Release) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator"
    return list(client.get(f"/api/v1/namespaces/{release.namespace}/pods", labelSelector=selector)["items"])


@pytest.fixture
def pod_release(
    install: Callable[..., Release], kube_client: KubeClient, real_node: RealNode, api_for_pods: tuple[str, int],
    kube_namespace: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> Callable[..., Release]:
    """``pod_release(replicas, *helm args)``: the chart installed with its operator as pods on the real node,
    watching ``kube_namespace``; the operator pods' logs go into the report of a failed test."""

    def make(replicas: int, *args: str) -> Release:
        release = install("--values", str(operator_values(tmp_path, api_for_pods, kube_namespace, replicas)), *args)
        request.addfinalizer(lambda: request.node.add_report_section("teardown", "operator pods", "\n".join(
            real_node.container_log(release.namespace, p["metadata"]["name"], "operator")[-4000:]
            for p in operator_pods(kube_client, release))))
        return release

    return make
