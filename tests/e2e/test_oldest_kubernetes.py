"""The chart on the oldest Kubernetes it supports: ``helm install`` against a control plane of
versions.env's KUBE_OLDEST_VERSION (built by testsupport/kube/build.sh beside the newest; etcd shared),
the CRD's validation rules in force there, and what that version lacks (the admission policy) left out."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.chart.chart import CHART_DIR, helm, parse_manifests, scenario_files
from tests.chart.e2e_fixtures import CC_API, CRDS_API
from tests.e2e.test_chart_server_dry_run import assert_the_server_accepts
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin
from testsupport.kube.cluster import BinariesMissing, LocalCluster, find_binaries, versions
from testsupport.kube.crd import CRD_NAME
from testsupport.kube.namespaces import create_namespace
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

__all__ = ["helm_bin", "helm_binaries", "kubectl_bin"]

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

OLDEST = versions()["KUBE_OLDEST_VERSION"]


def test_the_chart_states_the_oldest_version_everywhere() -> None:
    """Chart.yaml's kubeVersion, the docs and the version this file installs on name the same minimum."""
    minor = ".".join(OLDEST.split(".")[:2])
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={minor}.0-0"
    docs = CHART_DIR.parent.parent / "docs"
    for path, pattern in ((docs / "install.md", rf"Kubernetes {re.escape(minor)} or newer"),
                          (docs / "operator.md", rf"The oldest supported release is \*\*{re.escape(minor)}\*\*"),
                          (CHART_DIR / "README.md", rf"Kubernetes {re.escape(minor)} or newer")):
        assert re.search(pattern, path.read_text()), f"{path.name} does not say Kubernetes {minor} is the oldest"


@pytest.fixture(scope="module")
def oldest_cluster() -> Iterator[LocalCluster]:
    try:
        binaries = find_binaries(OLDEST)
    except BinariesMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing}")
        pytest.skip(str(missing))
    with LocalCluster(binaries) as cluster:
        yield cluster


def test_the_chart_installs_on_the_oldest_supported_kubernetes(oldest_cluster: LocalCluster, helm_bin: Path,
                                                               tmp_path: Path) -> None:
    client = KubeClient(oldest_cluster.kubeconfig)
    try:
        assert client.get("/version")["gitVersion"] == f"v{OLDEST}"
        ns = create_namespace(client, "restricted", prefix="ccs")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
        env.update(KUBECONFIG=str(oldest_cluster.kubeconfig), HELM_CACHE_HOME=str(tmp_path / "cache"),
                   HELM_CONFIG_HOME=str(tmp_path / "config"), HELM_DATA_HOME=str(tmp_path / "data"))
        helm(helm_bin, "install", "old", str(CHART_DIR), "--namespace", ns, "--timeout", "60s",
             "--set", "storage.url=redis://redis.compilecache.svc:6379/0", env=env)
        rendered = parse_manifests(helm(helm_bin, "get", "manifest", "old", "--namespace", ns, env=env).stdout)
        kinds = {m["kind"] for m in rendered}
        assert {"Deployment", "MutatingWebhookConfiguration", "CustomResourceDefinition", "ClusterRole"} <= kinds
        assert "ValidatingAdmissionPolicy" not in kinds, "admissionregistration.k8s.io/v1 policies need 1.30"

        def established() -> bool:
            conditions = client.get(f"{CRDS_API}/{CRD_NAME}").get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 30, "the chart's CRD to be established")
        cache = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                 "spec": {"image": "example/app:1", "model": {"target": "tiny_mlp"},
                          "storage": {"url": "redis://redis.compilecache.svc:6379/0"}}}
        path = f"{CC_API}/namespaces/{ns}/compilecaches"
        client.post(path, {**cache, "metadata": {"name": "fits"}})
        with pytest.raises(KubeAPIError) as refused:  # a CEL rule of the CRD, evaluated by this API server
            client.post(path, {**cache, "metadata": {"name": "x" * 210}})
        assert refused.value.status == 422 and "metadata.name" in refused.value.body
        helm(helm_bin, "uninstall", "old", "--namespace", ns, "--timeout", "60s", env=env)
    finally:
        client.close()


@pytest.mark.parametrize("scenario", sorted(scenario_files()))
def test_the_oldest_api_server_accepts_every_scenario(scenario: str, oldest_cluster: LocalCluster, helm_bin: Path,
                                                      kubectl_bin: Path, tmp_path: Path) -> None:
    """As tests/e2e/test_chart_server_dry_run.py, on the oldest supported Kubernetes."""
    client = KubeClient(oldest_cluster.kubeconfig)
    try:
        assert_the_server_accepts(oldest_cluster, client, helm_bin, kubectl_bin, scenario, tmp_path)
    finally:
        client.close()
