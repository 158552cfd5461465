"""Opted-in pods as users' clusters run them: "restricted" namespaces, apps that run as their own uid.

The API server enforces Pod Security itself: in a namespace labelled ``enforce=restricted`` it refuses
a pod that the webhook made non-compliant, and a warm-up Job whose pod is not compliant never gets a
pod. A real kubelet runs each container as the uid, gid and groups its pod spec says (the preload from
the preloader image), so a cache the app's uid cannot write fails as it does in users' clusters. Each app
compiles the built-in ``tiny_mlp`` target the way the warm-up did and reports torch's own cache counters.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

# conftest's, reachable from pods

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
WARM_UP_TIMEOUT = 420


def app_pod(name: str, cache: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", e2e.COMPILE_TINY_MLP],
                 "terminationMessagePolicy": "FallbackToLogsOnError"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
            "spec": {"restartPolicy": "Never", "containers": [container], **pod_spec}}


def restricted_app_pod(name: str, uid: int = 1000, fs_group: int | None = None, **pod_spec: Any) -> dict[str, Any]:
    """``app_pod`` of the cache ``mlp`` made "restricted"-compliant, running as ``uid`` (gid the same), by
    default with nothing in common with the preload."""
    body = app_pod(name, "mlp", pod_spec)
    body["spec"] = restricted(body["spec"], uid=uid, gid=uid, fs_group=fs_group)
    return body


def finished(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    pod = wait_for(lambda: e2e.pod_terminated(client, namespace, name), WARM_UP_TIMEOUT, f"pod {name} to finish")
    return dict(pod)


def warm_cache(client: KubeClient, namespace: str, redis: RedisServer, name: str = "mlp") -> dict[str, Any]:
    client.post(e2e.cache_path(namespace), e2e.compile_cache(name, {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis.store_url()}}))
    try:
        return e2e.wait_condition(client, namespace, name, "Ready", "True", WARM_UP_TIMEOUT)
    except TimeoutError as error:
        # A warm-up pod the API server refuses (Pod Security) shows only as the Job controller's events.
        events = client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        warnings = [f"{e['reason']}: {e['message']}" for e in events if e.get("type") == "Warning"]
        raise AssertionError(f"{error}; Warning events: {warnings}") from error


def assert_warm(pod: dict[str, Any], uid: int) -> None:
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    preload = e2e.terminated_message(pod, "compilecache-preload", init=True)
    assert preload["result"] == "hit", preload
    report = e2e.terminated_message(pod, "app")
    assert report["uid"] == uid, report
    assert report["cache"]["fxgraph_hit"] >= 1 and report["cache"]["fxgraph_miss"] == 0, report


def test_restricted_namespace_admits_injected_pods_of_any_uid_and_they_start_warm(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace  # enforces "restricted": the warm-up Job's pod had to pass it too
    warm_cache(kube_client, ns, redis_server)
    pods = {
        "own-uid": restricted_app_pod("own-uid"),  # uid 1000, nothing in common with the preload
        "fs-group": restricted_app_pod("fs-group", uid=1001, fs_group=4000),
        "container-uid": restricted_app_pod("container-uid"),
    }
    # the uid stated by the app container alone, not by the pod
    container_uid = pods["container-uid"]["spec"]
    del container_uid["securityContext"]["runAsUser"], container_uid["securityContext"]["runAsGroup"]
    container_uid["containers"][0]["securityContext"].update(runAsUser=1002, runAsGroup=1002)
    uids = {"own-uid": 1000, "fs-group": 1001, "container-uid": 1002}
    for body in pods.values():
        created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", body)
        (preload,) = created["spec"]["initContainers"]
        context = preload["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        assert context.get("readOnlyRootFilesystem") is True, context
    for name, uid in uids.items():
        assert_warm(finished(kube_client, ns, name), uid)


@pytest.mark.parametrize("pod_security_level", ["baseline"])
def test_non_root_app_writes_the_preloaded_cache(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    """In a "baseline" namespace the API server lets any preload container through; what is left is the
    permission question: an app container running as uid 1000 (its own securityContext, as an image's USER
    would: nothing at the pod level that the preload would inherit) must be able to use the cache."""
    ns = kube_namespace
    warm_cache(kube_client, ns, redis_server)
    body = app_pod("app", "mlp", {})
    body["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000}
    kube_client.post(f"/api/v1/namespaces/{ns}/pods", body)
    assert_warm(finished(kube_client, ns, "app"), 1000)


def test_the_hit_rate_counts_only_the_pod_that_reads_the_cache_preloaded_for_its_image(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    """A matching pod is a hit and compiles warm; a pod of another image gets no bundle warmed for
    something else (a miss, image-mismatch, left unpatched) and compiles cold; a pod whose cache directory
    comes from ``valueFrom`` could not see a preload (skipped, cache-dir-value-from) and compiles cold."""
    ns = kube_namespace
    warm_cache(kube_client, ns, redis_server)
    pods = f"/api/v1/namespaces/{ns}/pods"
    kube_client.post(pods, restricted_app_pod("matching"))

    other = restricted_app_pod("other-image")
    other["spec"]["containers"][0]["image"] = f"{WORKLOAD_IMAGE}-other"
    created = kube_client.post(pods, other)
    assert "initContainers" not in created["spec"]
    assert created["metadata"]["annotations"]["compilecache.io/skipped"] == "image-mismatch"

    kube_client.post(f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "paths"},
        "data": {"cache": "/scratch/inductor"}})
    unwired = restricted_app_pod("unwired", volumes=[{"name": "scratch", "emptyDir": {}}])
    (app,) = unwired["spec"]["containers"]
    app["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    app["env"] = [{"name": "TORCHINDUCTOR_CACHE_DIR",
                   "valueFrom": {"configMapKeyRef": {"name": "paths", "key": "cache"}}},
                  {"name": "TORCH_COMPILE_JOB_ID", "value": "unwired"}]
    created = kube_client.post(pods, unwired)
    assert "initContainers" not in created["spec"]
    assert created["metadata"]["annotations"]["compilecache.io/skipped"] == "cache-dir-value-from"

    assert_warm(finished(kube_client, ns, "matching"), 1000)
    for name in ("other-image", "unwired"):
        done = finished(kube_client, ns, name)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        report = e2e.terminated_message(done, "app")
        assert report["cache"]["fxgraph_hit"] == 0 and report["cache"]["fxgraph_miss"] >= 1, (name, report)

    def counted() -> bool:
        return (
            operator.sample("compilecache_preloads_total", namespace=ns, result="hit") == 1
            and operator.sample("compilecache_preloads_total", namespace=ns, result="miss",
                                reason="image-mismatch") == 1
            and operator.sample("compilecache_preloads_total", namespace=ns, result="skipped",
                                reason="cache-dir-value-from") == 1
        )

    wait_for(counted, 30, "one hit, one image-mismatch miss and one skipped pod in /metrics")


@pytest.mark.parametrize("pod_security_level", ["privileged"])
def test_node_cache_is_fetched_once_per_node_and_shared_by_apps_of_other_uids(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer,
    real_node: RealNode,
) -> None:
    """``preload.nodeCache``: the kubelet makes the hostPath root 0755 (hostPath needs the "privileged"
    level); the first pod's preload fills it and hands it to its app, the second pod on the node finds the
    bundle complete and fetches nothing; both apps, of different uids, compile warm."""
    ns = kube_namespace
    node_cache = real_node.workdir / "hostpath" / "compilecache-nodes"  # on the host: the node's work dir
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()},
        "preload": {"nodeCache": {"hostPath": str(node_cache)}}}))
    e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", WARM_UP_TIMEOUT)
    results = []
    for name, uid in (("first", 1000), ("second", 1001)):
        created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", restricted_app_pod(name, uid=uid))
        (volume,) = [v for v in created["spec"]["volumes"] if "hostPath" in v]
        assert volume["hostPath"]["path"] == f"{node_cache}/{ns}/mlp", volume
        done = finished(kube_client, ns, name)
        assert_warm(done, uid)
        results.append(e2e.terminated_message(done, "compilecache-preload", init=True))
    first, second = results
    assert first["source"] == "store" and first["bytes"] > 0, first
    assert second["source"] == "node-cache" and second["bytes"] == 0, second
    host = node_cache / ns / "mlp"
    assert (host / "inductor").is_dir() or any(host.iterdir()), sorted(host.iterdir())


def test_a_node_cache_never_keeps_a_pod_from_starting_in_a_restricted_or_baseline_namespace(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer,
    real_node: RealNode, kubectl_bin: Path, helm_env: dict[str, str],
) -> None:
    """A cache with ``preload.nodeCache``, its pods in a namespace enforcing "restricted", then (the same namespace
    relabelled, which the operator's index of namespaces follows) "baseline": the API server would refuse the
    hostPath and the root preload; the webhook leaves them out, says so at admission (kubectl prints the warning)
    and in an annotation, and each pod starts and warms from its own emptyDir; each is counted."""
    ns = kube_namespace
    node_cache = real_node.workdir / "hostpath" / "compilecache-fallback"
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()},
        "preload": {"nodeCache": {"hostPath": str(node_cache)}}}))
    e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", WARM_UP_TIMEOUT)
    pods = f"/api/v1/namespaces/{ns}/pods"

    def fallback_of(body: dict[str, Any]) -> str:
        """The fallback a dry-run create of ``body`` gets (the webhook runs; nothing is stored)."""
        dry = kube_client.request("POST", pods, body=body, query={"dryRun": "All"})
        return str(dry["metadata"].get("annotations", {}).get("compilecache.io/node-cache-fallback", ""))

    for level, uid in (("restricted", 1000), ("baseline", 1001)):
        kube_client.merge_patch(f"/api/v1/namespaces/{ns}",
                                {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}})
        name = f"app-{level}"
        body = restricted_app_pod(name, uid=uid)
        wait_for(lambda: fallback_of(body) == f"pod-security-{level}", 30,  # noqa: B023
                 f"the operator to see the namespace at {level}")
        proc = subprocess.run([str(kubectl_bin), "create", "-n", ns, "-f", "-"], input=json.dumps(body),
                              capture_output=True, text=True, env=helm_env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"enforces Pod Security '{level}'" in proc.stderr and "emptyDir" in proc.stderr, proc.stderr
        created = kube_client.get(f"{pods}/{name}")
        assert not any("hostPath" in v for v in created["spec"]["volumes"]), created["spec"]["volumes"]
        assert created["spec"]["initContainers"][0]["securityContext"]["runAsNonRoot"] is True
        done = finished(kube_client, ns, name)
        assert_warm(done, uid)
        assert e2e.terminated_message(done, "compilecache-preload", init=True)["source"] == "store"
    assert not node_cache.exists() or not any(node_cache.iterdir()), "nothing went to the node"

    def counted() -> bool:
        return all(operator.sample("compilecache_node_cache_fallbacks_total", namespace=ns, cache="mlp",
                                   reason=f"pod-security-{level}") == 1 for level in ("restricted", "baseline"))

    wait_for(counted, 30, "each fallback counted once in /metrics")
