"""SIGTERM stops the operator at once and releases its Lease, also before it is ready.

Before its watches have listed what it watches, the operator is not ready: no cache is known, the managed webhook
configuration is not written yet, and the stop flag the operator hands Kopf (a ``threading.Event``, waited on in a
thread of the loop's executor, which the loop joins on its way out) must still be set on SIGTERM, or the process
hangs until SIGKILL with its Lease still held and the other replica waits out the Lease's 15 s. The operator here
watches an empty namespace and may not list Namespaces (a user with the chart's rules but ``namespaces``), so its
watch of the Namespaces (whose Pod Security levels the webhook needs before it may answer a pod) never lists and it
never becomes ready, whatever else the session's cluster holds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operator.e2e_support import OperatorProcess
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e]

LEASE = "compilecache-operator"
USER = "system:serviceaccount:kube-system:compilecache-shutdown-test"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def grant(client: KubeClient, namespace: str) -> None:
    """What the operator reads and writes in one watched namespace, its Lease there, CRDs and namespaces, its
    managed webhook configuration: everything it does at start-up except listing Namespaces."""
    rules = [
        {"apiGroups": ["compilecache.io"], "resources": ["compilecaches"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["compilecache.io"], "resources": ["compilecaches/status"], "verbs": ["patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
    ]
    cluster_rules = [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
         "verbs": ["get", "list", "watch", "create", "patch"]},
    ]
    subject = [{"kind": "User", "name": USER, "apiGroup": "rbac.authorization.k8s.io"}]
    name = f"shutdown-{namespace}"
    client.post(f"{RBAC}/namespaces/{namespace}/roles", {"metadata": {"name": name}, "rules": rules})
    client.post(f"{RBAC}/namespaces/{namespace}/rolebindings", {
        "metadata": {"name": name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}})
    client.post(f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": cluster_rules})
    client.post(f"{RBAC}/clusterrolebindings", {
        "metadata": {"name": name}, "subjects": subject,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}})


@pytest.fixture
def unready_operator(kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, crd: None,
                     tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:
    grant(kube_client, kube_namespace)
    kubeconfig = kube_cluster.write_kubeconfig(USER, path=tmp_path / "kubeconfig")
    process = OperatorProcess(kubeconfig, kube_namespace, tmp_path / "operator",
                              "--leader-election-namespace", kube_namespace, "--shutdown-delay", "1")
    try:
        process.spawn()  # not start(): the webhook configuration is written once the watches have listed, never here
        wait_for(lambda: process._alive() and process._healthy(), 60, "the operator's liveness endpoint")
        yield process
    finally:
        process.kill()
        process.delete_webhook_config(kube_client)
        request.node.add_report_section("teardown", "operator log", process.log_tail())
        kube_client.delete_if_present(*(f"{RBAC}/{kind}/shutdown-{kube_namespace}"
                                        for kind in ("clusterroles", "clusterrolebindings")))


def holder(client: KubeClient, namespace: str) -> str:
    lease = client.get_if_present(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}") or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def test_sigterm_before_the_operator_is_ready_stops_it_at_once_and_releases_the_lease(
    unready_operator: OperatorProcess, kube_client: KubeClient, kube_namespace: str,
) -> None:
    wait_for(lambda: holder(kube_client, kube_namespace) or None, 60, "the operator to take its Lease")
    time.sleep(2)  # its watches are running
    # the watch of the Namespaces has not listed (403): not ready, its webhook configuration not written
    assert "watch of namespaces failed" in unready_operator.log_tail(100_000), unready_operator.log_tail()
    assert not unready_operator.ready(), "this test is about the time before the operator is ready"
    process = unready_operator.process
    assert process is not None
    started = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the operator did not exit within 15 s of SIGTERM:\n{unready_operator.log_tail()}")
    took = time.monotonic() - started
    assert process.returncode == 0, (process.returncode, unready_operator.log_tail())
    assert holder(kube_client, kube_namespace) == "", "the Lease was not released"
    print(f"\nexited {took:.1f} s after SIGTERM")
