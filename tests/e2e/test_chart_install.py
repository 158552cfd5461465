"""The Helm chart on the real kube-apiserver (1.20): install, upgrade, uninstall, the examples, and the
operator's RBAC checked by acting as its ServiceAccount.

These tests check API objects and RBAC and ask for no node: the operator's pods are not waited for here
(test_chart_operator_pod.py runs them on the real node; test_chart_operator_flow.py runs the operator as a
local process that authenticates as the chart's ServiceAccount).
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart import CHART_DIR, EXAMPLES_DIR
from tests.chart.e2e_fixtures import CC_API, CRDS_API, MWC_API
from tests.e2e.chart_releases import allowed
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CRD_NAME, install_crd
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

def crd_established(client: KubeClient) -> bool:
    conditions = client.get(f"{CRDS_API}/{CRD_NAME}").get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def test_default_chart_installs_upgrades_and_uninstalls(kube_client: KubeClient, install: Any) -> None:
    release = install("--set", "storage.url=redis://redis.compilecache.svc:6379/0")
    ns = release.namespace
    rendered = {(m["kind"], m["metadata"]["name"]) for m in release.manifest()}
    assert ("CustomResourceDefinition", CRD_NAME) in rendered
    for kind, name in rendered:  # every object the chart rendered exists on the server
        path = {
            "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts/{name}",
            "Secret": f"/api/v1/namespaces/{ns}/secrets/{name}",
            "Service": f"/api/v1/namespaces/{ns}/services/{name}",
            "Deployment": f"/apis/apps/v1/namespaces/{ns}/deployments/{name}",
            "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}",
            "ClusterRole": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}",
            "ClusterRoleBinding": f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}",
            "Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
            "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}",
            "MutatingWebhookConfiguration": f"{MWC_API}/{name}",
            "ValidatingWebhookConfiguration":
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}",
            "ValidatingAdmissionPolicy": f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}",
            "ValidatingAdmissionPolicyBinding":
                f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{name}",
            "CustomResourceDefinition": f"{CRDS_API}/{name}",
        }[kind]
        assert kube_client.get(path)["metadata"]["name"] == name
    wait_for(lambda: crd_established(kube_client), 30, "the chart's CRD to be established")
    deployment = kube_client.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{release.fullname}")
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"

    # No key or certificate comes from the chart (the operator makes them at run time: tests/e2e/test_serving_cert.py).
    assert not [name for kind, name in rendered if kind == "Secret"]
    webhook = kube_client.get(f"{MWC_API}/{release.fullname}")["webhooks"][0]
    assert "caBundle" not in webhook["clientConfig"]
    assert webhook["failurePolicy"] == "Ignore"

    # The caBundle the operator writes survives an upgrade (the chart never renders one).
    written = base64.b64encode(b"the operator's CA").decode()
    config = kube_client.get(f"{MWC_API}/{release.fullname}")
    config["webhooks"][0]["clientConfig"]["caBundle"] = written
    kube_client.request("PUT", f"{MWC_API}/{release.fullname}", body=config)
    release.helm("upgrade", release.name, str(CHART_DIR), "--reuse-values", "--set", "operator.verbose=true")
    assert kube_client.get(f"{MWC_API}/{release.fullname}")["webhooks"][0]["clientConfig"]["caBundle"] == written
    args = kube_client.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{release.fullname}")[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--verbose" in args

    # Uninstall removes the release but leaves the CRD (crds.keep), so no CompileCache is lost.
    release.helm("uninstall", release.name, "--timeout", "60s")
    with pytest.raises(KubeAPIError) as gone:
        kube_client.get(f"{MWC_API}/{release.fullname}")
    assert gone.value.status == 404
    crd = kube_client.get(f"{CRDS_API}/{CRD_NAME}")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_operator_rbac_acting_as_its_service_account(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, install: Any,
    kubectl_bin: Path, helm_env: dict[str, str],
) -> None:
    """The chart's RBAC, cluster-wide mode: what the operator needs is allowed, Secrets only in the listed
    namespace (get, never list), nothing else."""
    release = install()
    ns, other = release.namespace, kube_namespace
    for namespace in (ns, other):
        kube_client.post(f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store"}, "stringData": {"password": "x"}})
    operator = kube_cluster.client(release.service_account, ("system:serviceaccounts",
                                                             f"system:serviceaccounts:{ns}"))
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox"}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    try:
        expectations = {
            ("GET", f"/api/v1/namespaces/{ns}/secrets/store"): True,
            ("GET", f"/api/v1/namespaces/{other}/secrets/store"): False,
            ("GET", f"/api/v1/namespaces/{ns}/secrets"): False,
            ("GET", "/api/v1/secrets"): False,
            ("GET", f"{CC_API}/compilecaches"): True,
            ("GET", f"{CC_API}/namespaces/{other}/compilecaches"): True,
            ("PATCH", f"{CC_API}/namespaces/{other}/compilecaches/x/status"): True,
            ("POST", f"/apis/batch/v1/namespaces/{other}/jobs"): True,
            ("DELETE", f"/apis/batch/v1/namespaces/{other}/jobs/probe"): True,
            ("GET", "/apis/batch/v1/jobs"): True,
            ("GET", "/api/v1/pods"): True,
            ("PATCH", f"/api/v1/namespaces/{other}/pods/x"): True,
            ("POST", f"/api/v1/namespaces/{other}/pods"): False,
            ("DELETE", f"/api/v1/namespaces/{other}/pods/x"): False,
            ("GET", "/api/v1/nodes"): True,
            ("PATCH", "/api/v1/nodes/gpu-node-1"): False,
            ("POST", f"/api/v1/namespaces/{other}/events"): True,
            ("GET", CRDS_API): True,
            ("DELETE", f"{CRDS_API}/{CRD_NAME}"): False,
            ("GET", f"/api/v1/namespaces/{other}/configmaps"): False,
            ("POST", MWC_API): False,
            ("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"): False,
        }
        bodies = {"jobs": job, "pods": pod}
        event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "probe"}}
        patch = {"metadata": {"annotations": {"probe": "1"}}}
        observed = {}
        for method, path in expectations:
            body = {"POST": bodies.get(path.rsplit("/", 1)[-1], event), "PATCH": patch}.get(method)
            observed[(method, path)] = allowed(operator, method, path, body)
        wrong = {call: observed[call] for call, expected in expectations.items() if observed[call] != expected}
        assert not wrong, f"calls the chart's RBAC decides otherwise than expected (call: allowed): {wrong}"
    finally:
        operator.close()

    # The same answer through kubectl's impersonation, as an operator's user would check it.
    def can_i(*args: str) -> str:
        proc = subprocess.run([str(kubectl_bin), "auth", "can-i", *args, f"--as={release.service_account}"],
                              capture_output=True, text=True, env=helm_env, timeout=60)
        return proc.stdout.strip()

    assert can_i("get", "secrets", "-n", ns) == "yes"
    assert can_i("get", "secrets", "-n", other) == "no"
    assert can_i("list", "secrets", "-n", ns) == "no"
    assert can_i("create", "jobs.batch", "-n", other) == "yes"
    assert can_i("delete", "nodes") == "no"


def test_namespaced_release_reaches_only_its_namespaces(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, install: Any
) -> None:
    """operator.watchNamespaces: CompileCaches, Jobs and pods only there; no cluster-wide reads of them."""
    release = install("--set", f"operator.watchNamespaces={{{kube_namespace}}}",
                      "--set", f"rbac.secretNamespaces={{{kube_namespace}}}",
                      "--set", "crds.enabled=false", "--set", "webhook.enabled=false")
    outside = release.namespace
    operator = kube_cluster.client(release.service_account, ("system:serviceaccounts",))
    try:
        assert allowed(operator, "GET", f"{CC_API}/namespaces/{kube_namespace}/compilecaches")
        assert allowed(operator, "GET", f"/apis/batch/v1/namespaces/{kube_namespace}/jobs")
        assert allowed(operator, "GET", f"/api/v1/namespaces/{kube_namespace}/secrets/any")
        assert allowed(operator, "GET", "/api/v1/namespaces")  # Kopf follows the listed namespaces
        assert not allowed(operator, "GET", f"{CC_API}/namespaces/{outside}/compilecaches")
        assert not allowed(operator, "GET", f"{CC_API}/compilecaches")
        assert not allowed(operator, "GET", "/api/v1/pods")
        assert not allowed(operator, "GET", f"/api/v1/namespaces/{outside}/secrets/any")
        # Jobs are created and deleted, pods patched, only in the watched namespace
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"},
               "spec": {"template": {"spec": {"restartPolicy": "Never",
                                              "containers": [{"name": "c", "image": "busybox"}]}}}}
        assert allowed(operator, "POST", f"/apis/batch/v1/namespaces/{kube_namespace}/jobs", job)
        assert not allowed(operator, "POST", f"/apis/batch/v1/namespaces/{outside}/jobs", job)
        assert not allowed(operator, "DELETE", f"/apis/batch/v1/namespaces/{outside}/jobs/probe")
        patch = {"metadata": {"annotations": {"probe": "1"}}}
        assert allowed(operator, "PATCH", f"/api/v1/namespaces/{kube_namespace}/pods/x", patch)
        assert not allowed(operator, "PATCH", f"/api/v1/namespaces/{outside}/pods/x", patch)
        # the operator's own signing key by name in the release namespace (no other Secret there: secrets/any
        # above; this release has no webhook, so no serving certificate Secret)
        assert allowed(operator, "GET", f"/api/v1/namespaces/{outside}/secrets/{release.fullname}-signing")
        assert not allowed(operator, "GET", f"/api/v1/namespaces/{outside}/secrets/{release.fullname}-webhook-serving")
    finally:
        operator.close()


def test_examples_apply_without_losing_a_field(
    kube_client: KubeClient, kube_namespace: str, kubectl_bin: Path, helm_env: dict[str, str],
) -> None:
    """Server-side apply of examples/: a field the CRD's structural schema does not know would be pruned
    silently; every field of every example must come back."""
    install_crd(kube_client)
    proc = subprocess.run([str(kubectl_bin), "apply", "--server-side", "-n", kube_namespace, "-f", str(EXAMPLES_DIR)],
                          capture_output=True, text=True, env=helm_env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    paths = {"CompileCache": f"{CC_API}/namespaces/{kube_namespace}/compilecaches",
             "Deployment": f"/apis/apps/v1/namespaces/{kube_namespace}/deployments",
             "Pod": f"/api/v1/namespaces/{kube_namespace}/pods"}
    applied = 0
    for example in sorted(EXAMPLES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(example.read_text()):
            stored = kube_client.get(f"{paths[doc['kind']]}/{doc['metadata']['name']}")
            missing = list(missing_fields(doc["spec"], stored["spec"], "spec"))
            assert not missing, f"{example.name}: the API server dropped or changed {missing}"
            applied += 1
    assert applied >= 4


def missing_fields(wanted: Any, stored: Any, path: str) -> Iterator[str]:
    """Paths where ``stored`` lacks or differs from ``wanted`` (extra server defaults are fine)."""
    if isinstance(wanted, dict):
        if not isinstance(stored, dict):
            yield path
            return
        for key, value in wanted.items():
            if key not in stored:
                yield f"{path}.{key}"
            else:
                yield from missing_fields(value, stored[key], f"{path}.{key}")
    elif isinstance(wanted, list):
        if not isinstance(stored, list) or len(stored) != len(wanted):
            yield path
            return
        for i, (w, s) in enumerate(zip(wanted, stored, strict=True)):
            yield from missing_fields(w, s, f"{path}[{i}]")
    elif wanted != stored and str(wanted) != str(stored):
        yield path
