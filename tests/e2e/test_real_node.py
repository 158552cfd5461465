"""What only a real kubelet can show: the preload under its memory limit, the cache emptyDir's sizeLimit,
``kubectl logs`` of the preload, and a pod deleted in the middle of a preload into a node cache.

A warm-up whose ``model.command`` writes ``BUNDLE_MIB`` of random bytes (incompressible) into the inductor
cache directory publishes a bundle larger than the preload's memory limit. The kubelet then enforces what
the operator set: the memory limit (an OOMKill would fail the pod), the emptyDir ``sizeLimit`` (the eviction
manager evicts a pod whose volume grows past it), and the grace period of a deleted pod.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.e2e.operator_on_node import kubectl
from tests.infra.node import RealNode
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
PRELOAD = "compilecache-preload"
TIMEOUT = 300
BUNDLE_MIB = 160
MEMORY_LIMIT = "96Mi"
SIZE_LIMIT = "192Mi"
WRITE_BIG_FILE = (
    "python -c \"import os; d = os.environ['TORCHINDUCTOR_CACHE_DIR'] + '/fxgraph/zz'; os.makedirs(d, exist_ok=True); "
    f"f = open(d + '/big.bin', 'wb'); [f.write(os.urandom(1 << 20)) for _ in range({BUNDLE_MIB})]\""
)


def big_cache(store_url: str, **preload: Any) -> dict[str, Any]:
    return {"image": WORKLOAD_IMAGE, "model": {"command": WRITE_BIG_FILE}, "storage": {"url": store_url},
            "preload": {"resources": {"limits": {"memory": MEMORY_LIMIT}, "requests": {"memory": MEMORY_LIMIT}},
                        **preload}}


def app_pod(name: str, cache: str, command: list[str]) -> dict[str, Any]:
    app = {"name": "app", "image": WORKLOAD_IMAGE, "command": command}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
            "spec": restricted({"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "containers": [app]})}


def preload_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("initContainerStatuses") or []
    (status,) = [s for s in statuses if s["name"] == PRELOAD] or [{}]
    return dict(status)


def volume_stats(client: KubeClient, node: str, namespace: str, pod: str, volume: str) -> tuple[int, str]:
    """The kubelet's own measure of a pod volume (its Summary API, through the API server's node proxy): what
    its eviction manager compares with the emptyDir's sizeLimit; (used bytes, time of the measure)."""
    summary = client.get(f"/api/v1/nodes/{node}/proxy/stats/summary")
    for entry in summary.get("pods") or []:
        ref = entry["podRef"]
        if ref["namespace"] == namespace and ref["name"] == pod:
            for stats in entry.get("volume") or []:
                if stats["name"] == volume:
                    return int(stats.get("usedBytes") or 0), str(stats.get("time", ""))
    return 0, ""


CHECK_CONFINEMENT = """
import json, os, pathlib
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
try:
    pathlib.Path("/probe").write_text("x")
    root = "writable"
except OSError as error:
    root = error.strerror
pathlib.Path("/cache/file").write_text("x")
stat = os.stat("/cache/file")
report = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "root": root,
          "seccomp": status["Seccomp"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
          "cap_eff": status["CapEff"].strip(), "file_owner": [stat.st_uid, stat.st_gid]}
pathlib.Path("/dev/termination-log").write_text(json.dumps(report))
print("confined", flush=True)
"""


def test_the_kubelet_confines_a_restricted_pod_and_serves_its_logs(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, real_node: RealNode,
) -> None:
    """Pod Security "restricted" as users run it: uid, gid and fsGroup, a read-only root file system, the
    runtime's seccomp profile, no capabilities, no privilege escalation; all enforced by runc for the app."""
    ns = kube_namespace
    app = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", CHECK_CONFINEMENT],
           "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
           "securityContext": {"readOnlyRootFilesystem": True}}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "confined"},
            "spec": restricted({"restartPolicy": "Never", "containers": [app],
                                "volumes": [{"name": "cache", "emptyDir": {}}]}, uid=1000, gid=3000, fs_group=2000)}
    kube_client.post(f"/api/v1/namespaces/{ns}/pods", body)
    done = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "confined"), TIMEOUT, "the confined pod to finish")
    assert done["spec"]["nodeName"] == real_node.name
    assert done["status"]["phase"] == "Succeeded", done["status"]
    report = e2e.terminated_message(done, "app")
    assert report == {"uid": 1000, "gid": 3000, "groups": [2000, 3000], "root": "Read-only file system",
                      "seccomp": "2", "no_new_privs": "1", "cap_eff": "0000000000000000",
                      "file_owner": [1000, 2000]}, report
    assert kubectl(kube_cluster, "logs", "-n", ns, "confined") == "confined\n"


def test_large_bundle_preloads_under_its_memory_limit_within_the_size_limit_and_logs_its_progress(
    operator: e2e.OperatorProcess, kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str,
    redis_server: RedisServer, real_node: RealNode,
) -> None:
    ns = kube_namespace
    big = big_cache(redis_server.store_url(), sizeLimit=SIZE_LIMIT)
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("big", big))
    cache = e2e.wait_condition(kube_client, ns, "big", "Ready", "True", TIMEOUT)
    (bundle,) = cache["status"]["bundles"]
    assert bundle["bytes"] > BUNDLE_MIB << 20, bundle  # larger than the preload's memory limit

    # the app stays up until the kubelet has measured the cache volume (the eviction manager reads the same)
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods",
                               app_pod("app", "big", ["python", "-c", "import time; time.sleep(3600)"]))
    (preload,) = created["spec"]["initContainers"]
    assert preload["resources"]["limits"]["memory"] == MEMORY_LIMIT
    (volume,) = [v for v in created["spec"]["volumes"] if "emptyDir" in v and v["emptyDir"].get("sizeLimit")]
    assert volume["emptyDir"]["sizeLimit"] == SIZE_LIMIT

    def running() -> dict[str, Any] | None:
        pod = kube_client.get(f"/api/v1/namespaces/{ns}/pods/app")
        assert pod["status"].get("phase") not in ("Failed", "Succeeded"), pod["status"]
        return pod if pod["status"].get("phase") == "Running" else None

    pod = wait_for(running, TIMEOUT, "the app to run after its preload")
    terminated = preload_state(pod)["state"]["terminated"]
    assert terminated["reason"] == "Completed" and terminated["exitCode"] == 0, terminated  # not OOMKilled
    result = e2e.terminated_message(pod, PRELOAD, init=True)
    assert result["result"] == "hit" and result["bytes"] > BUNDLE_MIB << 20, result

    def measured(after: str = "") -> str | None:
        used, when = volume_stats(kube_client, real_node.name, ns, "app", volume["name"])
        return when if used >= BUNDLE_MIB << 20 and when > after else None

    # the full volume measured, then measured twice more (every 10 s; the eviction manager acts on each
    # measure within its own 10 s period): the pod is still running, not Evicted
    when = wait_for(measured, 120, "the kubelet's measure of the full cache volume")
    for _ in range(2):
        when = wait_for(functools.partial(measured, when), 60, "a newer measure of the cache volume")
    assert running() is not None

    # kubectl logs: through the API server to the kubelet, the preload's progress and its result
    logs = kubectl(kube_cluster, "logs", "-n", ns, "app", "-c", PRELOAD)
    assert '"result": "hit"' in logs or '"result":"hit"' in logs, logs
    assert bundle["key"] in logs, logs
    kube_client.delete(f"/api/v1/namespaces/{ns}/pods/app")


@pytest.mark.parametrize("pod_security_level", ["privileged"])
def test_a_pod_deleted_in_mid_preload_leaves_nothing_half_written_in_the_node_cache(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer,
    real_node: RealNode,
) -> None:
    ns = kube_namespace
    node_cache = real_node.workdir / "hostpath" / "node-caches"
    big = big_cache(  # a deadline for a loaded 2-core machine: this is no speed test
        redis_server.store_url(), nodeCache={"hostPath": str(node_cache)}, deadlineSeconds=300)
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("big", big))
    cache = e2e.wait_condition(kube_client, ns, "big", "Ready", "True", TIMEOUT)
    (bundle,) = cache["status"]["bundles"]
    target = node_cache / ns / "big"

    kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod("first", "big", ["python", "-c", "pass"]))
    wait_for(lambda: "running" in preload_state(kube_client.get(f"/api/v1/namespaces/{ns}/pods/first"))
             .get("state", {}), TIMEOUT, "the first pod's preload to run")
    kube_client.delete(f"/api/v1/namespaces/{ns}/pods/first", {"gracePeriodSeconds": 0})

    def gone() -> bool:
        try:
            kube_client.get(f"/api/v1/namespaces/{ns}/pods/first")
        except KubeAPIError as error:
            if error.status == 404:
                return True
            raise
        return False

    wait_for(gone, 120, "the first pod to be gone")
    assert_whole(target)

    # the next pod on the node completes the bundle (or finds it complete) and its app starts warm
    kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod("second", "big", ["python", "-c", "pass"]))
    done = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "second"), TIMEOUT, "the second pod to finish")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    result = e2e.terminated_message(done, PRELOAD, init=True)
    assert result["result"] == "hit", result
    assert_whole(target)
    big = target / "inductor" / "fxgraph" / "zz" / "big.bin"
    assert big.stat().st_size == BUNDLE_MIB << 20
    assert not list(target.rglob(".compilecache-staging-*")), sorted(target.rglob("*"))
    assert bundle["key"]


def assert_whole(target: Path) -> None:
    """Either no bundle file at all, or the whole bundle with its completed marker; staging directories only
    where no live preload holds their lock (the next unpacker removes them)."""
    if not target.exists():
        return
    staged = [p for p in target.rglob(".compilecache-staging-*") if p.is_dir()]
    files = [p for p in target.rglob("*") if p.is_file() and not any(s in p.parents for s in staged)]
    data = [p for p in files if p.name == "big.bin"]
    markers = list(target.rglob(".compilecache/bundles/*.json"))
    if data:
        assert data[0].stat().st_size == BUNDLE_MIB << 20, data
        assert markers, f"bundle data without a completed marker: {sorted(files)}"
