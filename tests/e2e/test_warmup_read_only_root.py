"""A warm-up under a policy that requires a read-only root file system in every container, on the real node.

Policy engines (Gatekeeper's ``k8spspreadonlyrootfilesystem``, Kyverno's ``require-ro-rootfs``) cannot be
installed here (their images are not reachable); the same rule is a ValidatingAdmissionPolicy on the local API
server, bound to the test's namespace: a pod with a container whose ``securityContext.readOnlyRootFilesystem``
is not true is refused, so a warm-up Job whose pod breaks it stays without a pod (FailedCreate). The warm-up
compiles the built-in target with torch and Triton in the workload image, writing only into its volumes, and
publishes: the cache turns Ready.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
READ_ONLY = ("has(c.securityContext) && has(c.securityContext.readOnlyRootFilesystem) && "
             "c.securityContext.readOnlyRootFilesystem")


@pytest.fixture
def read_only_root_required(kube_client: KubeClient, kube_namespace: str) -> Iterator[str]:
    name = f"require-ro-rootfs-{kube_namespace}"
    kube_client.post(POLICIES, {"metadata": {"name": name}, "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                                "resources": ["pods"]}]},
        "validations": [{
            "expression": f"object.spec.containers.all(c, {READ_ONLY}) && (!has(object.spec.initContainers) || "
                          f"object.spec.initContainers.all(c, {READ_ONLY}))",
            "message": "every container needs securityContext.readOnlyRootFilesystem: true"}]}})
    kube_client.post(BINDINGS, {"metadata": {"name": name}, "spec": {
        "policyName": name, "validationActions": ["Deny"],
        "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube_namespace}}}}})
    try:
        yield name
    finally:
        kube_client.delete_if_present(f"{BINDINGS}/{name}", f"{POLICIES}/{name}")


def test_a_warmup_passes_a_read_only_root_policy_and_publishes(
    read_only_root_required: str, operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str,
    redis_server: RedisServer,
) -> None:
    ns = kube_namespace
    writable = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "writable"}, "spec": {
        "restartPolicy": "Never", "securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                                      "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": WORKLOAD_IMAGE, "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}}

    def refused() -> bool:
        try:
            kube_client.request("POST", f"/api/v1/namespaces/{ns}/pods", body=writable, query={"dryRun": "All"})
        except KubeAPIError as error:
            return read_only_root_required in str(error)
        return False

    wait_for(refused, 30, "the policy to refuse a pod with a writable root")
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
    try:
        cache = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", 420)
    except TimeoutError as error:
        events = kube_client.get(f"/api/v1/namespaces/{ns}/events")["items"]
        raise AssertionError(f"{error}; Warning events: "
                             f"{[e['message'] for e in events if e.get('type') == 'Warning']}") from error
    (job,) = e2e.jobs_of(kube_client, ns, "mlp")
    compile_container = job["spec"]["template"]["spec"]["initContainers"][1]
    assert compile_container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "compilecache-tmp", "mountPath": "/tmp"} in compile_container["volumeMounts"]
    seconds = (cache["status"]["bundles"][0].get("compileSeconds"))
    print(f"\nwarm-up with a read-only root: compiled in {seconds} s")
