"""A tenant namespace as GPU platforms run them: a ResourceQuota on ``limits.*`` and ``requests.*`` and a
ValidatingAdmissionPolicy that refuses any container without cpu and memory limits (what Kyverno's
"require limits" does, here in the API server's own CEL). A CompileCache with no resources of its own warms
(its Job's pod is admitted, runs on the real node and succeeds) and an opted-in pod preloads and runs: the
operator's default requests and limits pass both.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT = 300
POLICY = "compilecache-test-require-limits"
QUOTA = {"limits.cpu": "16", "limits.memory": "40Gi", "requests.cpu": "4", "requests.memory": "8Gi"}
APP_LIMITS = {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "50m", "memory": "64Mi"}}
EVERY_CONTAINER = "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"


def require_limits_policy(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A policy refusing pods with a container (init containers included) that lacks a cpu or memory limit,
    bound to ``namespace`` only."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{POLICY}-{namespace}"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                                                    "operations": ["CREATE", "UPDATE"]}]},
            "validations": [{
                "expression": f"({EVERY_CONTAINER}).all(c, has(c.resources) && has(c.resources.limits) && "
                              "'cpu' in c.resources.limits && 'memory' in c.resources.limits)",
                "message": "every container needs cpu and memory limits",
            }],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"{POLICY}-{namespace}"},
        "spec": {"policyName": f"{POLICY}-{namespace}", "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }
    return policy, binding


def app_pod(name: str, cache: str, resources: dict[str, Any] | None) -> dict[str, Any]:
    app: dict[str, Any] = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", "print('started')"]}
    if resources is not None:
        app["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"compilecache.io/cache": cache}},
            "spec": restricted({"restartPolicy": "Never", "containers": [app]})}


def test_a_limits_quota_and_a_require_limits_policy_admit_warm_up_and_preload(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer,
    real_node: RealNode,
) -> None:
    ns = kube_namespace
    kube_client.post(f"/api/v1/namespaces/{ns}/resourcequotas",
                     {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-tenant"},
                      "spec": {"hard": QUOTA}})
    policy, binding = require_limits_policy(ns)
    base = "/apis/admissionregistration.k8s.io/v1"
    kube_client.post(f"{base}/validatingadmissionpolicies", policy)
    kube_client.post(f"{base}/validatingadmissionpolicybindings", binding)
    try:
        # both bite: a pod without limits is refused (the policy; the quota would refuse it too)
        def refused() -> str | None:
            try:
                kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod("no-limits", "none", None))
            except KubeAPIError as exc:
                return str(exc)
            kube_client.delete(f"/api/v1/namespaces/{ns}/pods/no-limits", {"gracePeriodSeconds": 0})
            return None

        said = wait_for(refused, 60, "the policy to refuse a pod without limits")  # bindings apply within seconds
        assert "limits" in said, said

        kube_client.post(e2e.cache_path(ns), e2e.compile_cache("tenant", {
            "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
        cache = e2e.wait_condition(kube_client, ns, "tenant", "Ready", "True", TIMEOUT)
        (bundle,) = cache["status"]["bundles"]
        (job,) = e2e.jobs_of(kube_client, ns, "tenant")
        assert job["status"].get("succeeded") == 1, job["status"]
        quota = kube_client.get(f"/api/v1/namespaces/{ns}/resourcequotas/gpu-tenant")
        assert set(QUOTA) <= set(quota["status"]["used"]), quota["status"]

        created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod("warm", "tenant", APP_LIMITS))
        preload = [c for c in created["spec"].get("initContainers") or [] if c["name"] == "compilecache-preload"]
        assert preload and {"cpu", "memory"} <= set(preload[0]["resources"]["limits"]), created["spec"]
        done = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "warm"), TIMEOUT, "the opted-in pod to finish")
        assert done["spec"]["nodeName"] == real_node.name
        assert done["status"]["phase"] == "Succeeded", done["status"]
        result = e2e.terminated_message(done, "compilecache-preload", init=True)
        assert result["result"] == "hit" and bundle["key"] in result.get("hits", []), result
    finally:
        for kind, body in (("validatingadmissionpolicybindings", binding), ("validatingadmissionpolicies", policy)):
            with contextlib.suppress(KubeAPIError):
                kube_client.delete(f"{base}/{kind}/{body['metadata']['name']}")
