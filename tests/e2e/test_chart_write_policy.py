"""rbac.confineWrites on a real API server: the chart's ValidatingAdmissionPolicies, acting as the operator's
ServiceAccount (its token's user and groups), let through every write the operator makes and refuse what RBAC
alone would allow: another annotation or a label of a pod, a Job that is not a labelled, restricted warm-up owned
by a CompileCache, a warm-up in kube-system, a CompileCache's spec, a Secret of another name. Every call is a
server-side dry run (admission runs, nothing is stored). Anyone else is not concerned by the policies.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.chart.e2e_fixtures import CC_API
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def verdict(client: KubeClient, method: str, path: str, body: Any, content_type: str = "application/json") -> str:
    """"ok" when the API server admits the call as a dry run, else its message."""
    for _ in range(50):
        try:
            client.request(method, path, body=body, query={"dryRun": "All"}, content_type=content_type)
        except KubeAPIError as error:
            if error.status == 429:  # a just-installed CRD's storage is initializing
                wait_for(lambda: True, 1, "")
                continue
            return str(error)
        return "ok"
    raise AssertionError("the API server kept answering 429")


def warmup_job(cache: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A Job as the operator makes one (compilecache_operator.decisions.warmup_job's labels, owner and security)."""
    # a deep copy: restricted() shares its capabilities dict between pods
    pod = copy.deepcopy(restricted({"restartPolicy": "Never", "containers": [{"name": "publish",
                                                                               "image": WORKLOAD_IMAGE}]}))
    labels = {"app.kubernetes.io/managed-by": "compilecache-operator", "compilecache.io/warmup-for": "mlp"}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "cc-mlp-0123456789-g1", "labels": labels, "ownerReferences": [{
               "apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "name": "mlp",
               "uid": cache["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
           "spec": {"template": {"metadata": {"labels": labels}, "spec": pod}}}
    for path, value in changes.items():
        target = job
        *parents, leaf = path.split(".")
        for key in parents:
            target = target[key] if not key.isdigit() else target[int(key)]  # type: ignore[index]
        if value is None:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return job


def test_the_operators_writes_are_confined_to_its_own(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, install: Any,
) -> None:
    release = install("--set", "confinement.admissionPolicy.enabled=false")  # no operator runs to answer it
    ns, own = kube_namespace, release.namespace
    kinds = {m["kind"] for m in release.manifest()}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds, kinds
    kube_client.post(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app", "labels": {"app": "x"}, "annotations": {"team": "ml"}},
        "spec": restricted({"containers": [{"name": "app", "image": WORKLOAD_IMAGE}]})})
    cache = kube_client.post(f"{CC_API}/namespaces/{ns}/compilecaches", {
        "apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": "mlp"},
        "spec": {"image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": "redis://r:6379/0"}}})
    operator = kube_cluster.client(release.service_account, ("system:serviceaccounts",
                                                             f"system:serviceaccounts:{own}"))
    pods, jobs = f"/api/v1/namespaces/{ns}/pods", f"/apis/batch/v1/namespaces/{ns}/jobs"
    caches = f"{CC_API}/namespaces/{ns}/compilecaches"
    hostpath = [{"name": "h", "hostPath": {"path": "/etc"}}]
    # (a Job without labels takes its pod template's: both go)
    unlabelled = warmup_job(cache, **{"metadata.labels": {}, "spec.template.metadata.labels": {}})
    root_job = warmup_job(cache)
    root_job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    added_cap = warmup_job(cache)
    added_cap["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    try:
        expectations = {
            # what the operator does: counted marks on pods, warm-up Jobs, its finalizer, its Secrets
            "annotate a pod compilecache.io/": (
                "PATCH", f"{pods}/app", {"metadata": {"annotations": {"compilecache.io/preload-counted": "hit"}}},
                MERGE, True),
            "create a warm-up Job": ("POST", jobs, warmup_job(cache), None, True),
            "annotate a warm-up Job": ("PATCH", f"{jobs}/cc-mlp-0123456789-g1",
                                       {"metadata": {"annotations": {"compilecache.io/recorded": "1"}}}, MERGE, None),
            "add its finalizer": ("PATCH", f"{caches}/mlp",
                                  [{"op": "add", "path": "/metadata/finalizers", "value": ["compilecache.io/bundles"]}],
                                  JSON_PATCH, True),
            "create its signing Secret": ("POST", f"/api/v1/namespaces/{own}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{release.fullname}-signing"}}, None, True),
            # what RBAC alone lets a leaked token do
            "annotate a pod otherwise": ("PATCH", f"{pods}/app", {"metadata": {"annotations": {"team": "other"}}},
                                         MERGE, False),
            "remove a pod's annotation": ("PATCH", f"{pods}/app", {"metadata": {"annotations": {"team": None}}},
                                          MERGE, False),
            "label a pod": ("PATCH", f"{pods}/app", {"metadata": {"labels": {"app": "y"}}}, MERGE, False),
            "change a pod's image": ("PATCH", f"{pods}/app", {"spec": {"containers": [
                {"name": "app", "image": "registry.example/other:1"}]}}, "application/strategic-merge-patch+json",
                False),
            "create an unlabelled Job": ("POST", jobs, unlabelled, None, False),
            "create a Job owned by nothing": ("POST", jobs, warmup_job(cache, **{"metadata.ownerReferences": None}),
                                              None, False),
            "create a warm-up running as root": ("POST", jobs, root_job, None, False),
            "create a warm-up with a capability": ("POST", jobs, added_cap, None, False),
            "create a warm-up with a hostPath": (
                "POST", jobs, warmup_job(cache, **{"spec.template.spec.volumes": hostpath}), None, False),
            "create a warm-up in kube-system": ("POST", "/apis/batch/v1/namespaces/kube-system/jobs",
                                                warmup_job(cache), None, False),
            "change a CompileCache's spec": ("PATCH", f"{caches}/mlp", {"spec": {"image": "registry.example/evil:1"}},
                                             MERGE, False),
            "add another finalizer": ("PATCH", f"{caches}/mlp", [
                {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/block"]}], JSON_PATCH, False),
            "create another Secret": ("POST", f"/api/v1/namespaces/{own}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stolen"}}, None, False),
        }
        def ask(what: str) -> str:
            method, path, body, content_type, _ = expectations[what]
            return verdict(operator, method, path, copy.deepcopy(body), content_type or "application/json")

        # the API server loads each policy and binding on its own: wait for a refusal from each of the four
        for what in ("label a pod", "create an unlabelled Job", "change a CompileCache's spec",
                     "create another Secret"):
            wait_for(lambda what=what: "denied" in ask(what), 60, f"the policy refusing to {what}")
        wrong = {}
        for what, (*_, allowed) in expectations.items():
            said = ask(what)
            # allowed None: the Job does not exist (a dry run made none): authorized and admitted up to the lookup
            admitted = said == "ok" or (allowed is None and "not found" in said)
            if admitted != (allowed is not False):
                wrong[what] = said
            if allowed is False:
                assert "ValidatingAdmissionPolicy" in said or "forbidden" in said.lower(), (what, said)
        assert not wrong, f"calls the write policy decides otherwise than expected: {wrong}"
        # the policies concern the operator's account only
        assert verdict(kube_client, "PATCH", f"{pods}/app", {"metadata": {"labels": {"app": "y"}}}, MERGE) == "ok"
        assert verdict(kube_client, "POST", jobs, unlabelled) == "ok"
    finally:
        operator.close()
        kube_client.delete(f"{pods}/app")
        kube_client.delete(f"{caches}/mlp")
