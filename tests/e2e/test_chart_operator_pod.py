"""The chart's operator as pods on the real node: ``helm install`` with the operator image, its webhook served
through the Service's endpoints, a warm-up, a preload, its /metrics, and leader hand-over between pods.

How the operator pod reaches the API server: the API server listens on loopback and no kube-proxy routes the
``kubernetes`` Service's ClusterIP, so a relay on the bridge's gateway (``api_for_pods``, an address in the API
server's serving certificate) stands in for that Service, and the chart's ``operator.extraEnv`` sets
KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT to it, as in a cluster where pods use the API server's
address directly. The pods stay on the pod network (not ``hostNetwork``): two replicas fit on the one node
(no host port clash), Pod Security "restricted" admits them in the release's namespace, and the API server
calls the webhook on the pod's own address, which it learns from the webhook Service's endpoints (the API
server resolves Services to endpoints itself: ``--enable-aggregator-routing``).
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.chart.e2e_fixtures import Release
from tests.e2e.chart_releases import operator_pods
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import PROJECT_TAGS, RealNode
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
PRELOAD = "compilecache-preload"
TIMEOUT = 420
METRICS_PORT = 8080


def ready_pods(client: KubeClient, release: Release) -> list[dict[str, Any]]:
    """The operator pods that are Ready and not being deleted."""
    return [p for p in operator_pods(client, release) if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])]


def wait_ready_pods(client: KubeClient, release: Release, count: int) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        pods = ready_pods(client, release)
        return pods if len(pods) == count else None

    return wait_for(ready, TIMEOUT, f"{count} Ready operator pod(s)", interval=1)


def lease_holder(client: KubeClient, release: Release) -> str:
    """The pod name in the Lease's holder identity (``<hostname>-<8 hex>``), "" without a holder."""
    lease = client.get_if_present(f"/apis/coordination.k8s.io/v1/namespaces/{release.namespace}/leases/"
                                  f"{release.fullname}")
    if lease is None:
        return ""
    holder = str(lease["spec"].get("holderIdentity") or "")
    return holder.rsplit("-", 1)[0]


def scrape(pod: dict[str, Any]) -> str:
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics", timeout=5) as response:
        return str(response.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that carry ``labels``."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def test_the_chart_operator_pod_warms_injects_preloads_and_serves_metrics(
    pod_release: Callable[[int], Release], kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer,
    real_node: RealNode,
) -> None:
    """The first sync as a GitOps tool or a script makes it: `helm install --wait --wait-for-jobs` returns once the
    startupCheck hook saw the CompileCache webhook answer (the release namespace enforces "restricted": its pod
    was admitted), and a CompileCache created at once is admitted by the webhook."""
    ns = kube_namespace
    release = pod_release(1, "--set", "startupCheck.enabled=true", "--wait", "--wait-for-jobs", "--timeout", "300s")
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
    hooks = release.helm("get", "hooks", release.name).stdout
    assert "startupcheck" in hooks and "post-install" in hooks, hooks
    (operator,) = wait_ready_pods(kube_client, release, 1)
    assert operator["spec"]["nodeName"] == real_node.name and not operator["spec"].get("hostNetwork")
    (container,) = operator["status"]["containerStatuses"]
    assert container["image"].endswith(PROJECT_TAGS["operator"].split("/", 1)[1]), container["image"]

    # the webhook Service's endpoints are the operator pod: the API server calls it there
    service = f"{release.fullname}-webhook"
    slices = kube_client.get(f"/apis/discovery.k8s.io/v1/namespaces/{release.namespace}/endpointslices",
                             labelSelector=f"kubernetes.io/service-name={service}")["items"]
    addresses = {a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]}
    assert addresses == {operator["status"]["podIP"]}, slices

    cache = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", TIMEOUT)
    (bundle,) = cache["status"]["bundles"]
    (job,) = e2e.jobs_of(kube_client, ns, "mlp")
    warmups = kube_client.get(f"/api/v1/namespaces/{ns}/pods",
                              labelSelector=f"controller-uid={job['metadata']['uid']}")["items"]
    assert warmups and all(p["spec"]["nodeName"] == real_node.name for p in warmups)
    assert job["status"].get("succeeded") == 1, job["status"]

    app = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", e2e.COMPILE_TINY_MLP]}
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "labels": {CACHE_LABEL: "mlp"}},
        "spec": restricted({"restartPolicy": "Never", "containers": [app]})})
    assert [c["name"] for c in created["spec"].get("initContainers") or []] == [PRELOAD], created["metadata"]
    assert created["spec"]["initContainers"][0]["image"] == PROJECT_TAGS["preloader"]
    done = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "app"), TIMEOUT, "the app pod to finish")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    preload = e2e.terminated_message(done, PRELOAD, init=True)
    assert preload["result"] == "hit" and bundle["key"] in str(preload), preload
    report = e2e.terminated_message(done, "app")
    assert report["cache"]["fxgraph_hit"] >= 1 and report["cache"]["fxgraph_miss"] == 0, report

    # the pod's own /metrics, on its pod address (where the chart's ServiceMonitor has Prometheus scrape it)
    wait_for(lambda: sample(scrape(operator), "compilecache_preloads_total", namespace=ns, cache="mlp",
                            result="hit") == 1, 60, "the hit in the operator pod's /metrics")
    text = scrape(operator)
    assert sample(text, "compilecache_warmup_jobs_total", namespace=ns, cache="mlp", result="succeeded") == 1
    assert sample(text, "compilecache_cache_ready", namespace=ns, cache="mlp") == 1


def test_two_operator_pods_hand_over_the_lease_and_the_deployment_replaces_the_leader(
    pod_release: Callable[[int], Release], kube_client: KubeClient, kube_namespace: str,
) -> None:
    ns = kube_namespace
    release = pod_release(2)
    pods = {p["metadata"]["name"] for p in wait_ready_pods(kube_client, release, 2)}
    leader = wait_for(lambda: lease_holder(kube_client, release) or None, 60, "a leader pod")
    assert leader in pods, (leader, pods)

    # a GPU type no node has: the warm-up Job's pod waits unscheduled, and the leader still reconciles the cache
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "gpuTypes": ["NVIDIA-A100-SXM4-40GB"],
        "storage": {"url": "redis://127.0.0.1:1/0"}}))
    wait_for(lambda: kube_client.get(e2e.cache_path(ns, "mlp")).get("status", {}).get("observedGeneration") == 1, 60,
             "the leader to reconcile the new cache")

    kube_client.delete(f"/api/v1/namespaces/{release.namespace}/pods/{leader}")
    (survivor,) = pods - {leader}
    # the standby or the Deployment's replacement, whichever asks first once the leader has let the Lease go
    def another_holder() -> str | None:
        holder = lease_holder(kube_client, release)
        return holder if holder and holder != leader else None

    successor = wait_for(another_holder, 120, "another pod to take the Lease")
    now = {p["metadata"]["name"] for p in wait_ready_pods(kube_client, release, 2)}
    assert survivor in now and leader not in now and successor in now, (successor, now)  # the replacement is up

    kube_client.request("PATCH", e2e.cache_path(ns, "mlp"), body={"spec": {"retention": {"keepGenerations": 3}}},
                        content_type="application/merge-patch+json")
    generation = kube_client.get(e2e.cache_path(ns, "mlp"))["metadata"]["generation"]
    assert generation == 2
    path = e2e.cache_path(ns, "mlp")
    wait_for(lambda: kube_client.get(path).get("status", {}).get("observedGeneration") == generation,
             60, "the new leader to reconcile the change")
