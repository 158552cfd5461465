"""Every values scenario as the API server itself judges it: ``helm template`` for the control plane's version,
then ``kubectl apply --server-side --dry-run=server`` of every object, the release's namespace enforcing the
"restricted" Pod Security level. The server runs its defaulting, validation (CRD schemas and CEL rules included)
and admission on each object, warns of nothing, and keeps nothing. Objects of other projects' CRDs (cert-manager's)
are not served here and are left to the schema checks of tests/chart/test_manifest_lint.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart.chart import CHART_DIR, helm, parse_manifests, scenario_files
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.namespaces import create_namespace, delete_namespace
from testsupport.kube.rest import KubeClient

__all__ = ["helm_bin", "helm_binaries", "kubectl_bin"]

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

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


@pytest.mark.parametrize("scenario", sorted(scenario_files()))
def test_the_api_server_accepts_every_scenario(scenario: str, kube_cluster: LocalCluster, kube_client: KubeClient,
                                               helm_bin: Path, kubectl_bin: Path, tmp_path: Path) -> None:
    assert_the_server_accepts(kube_cluster, kube_client, helm_bin, kubectl_bin, scenario, tmp_path)
