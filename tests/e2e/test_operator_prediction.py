"""The prediction at admission, through the operator, on a real API server and a real node, checked against the
pods' verdicts.

A CompileCache warms ``tiny_mlp``; three of its pods are created with ``kubectl``: one as the warm-up ran, one with
``TORCHINDUCTOR_NAN_ASSERTS=1`` (a variable that sets an Inductor option: torch's key differs), one with the same
image under another tag (tagged on the node: the same content, another reference). The two bad ones get the
warning in kubectl's output, the ``compilecache.io/predicted: cold`` annotation and the metric; their verdicts
agree with the predictions (``compilecache_prediction_outcomes_total``). With ``preload.onPredictedCold: Deny`` the
differing pod is refused with the same text; with the operator gone (its webhook configuration left behind, as
after a crash) a pod is still admitted.
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
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
TIMEOUT = 420
OTHER_TAG = WORKLOAD_IMAGE.rsplit(":", 1)[0] + ":prediction"
SAYS = "compilecache: this pod will compile: env TORCHINDUCTOR_NAN_ASSERTS: unset → 1"



def app_pod(name: str, env: dict[str, str], image: str = WORKLOAD_IMAGE) -> dict[str, Any]:
    container = {"name": "app", "image": image, "imagePullPolicy": "Never",
                 "command": ["python", "-c", e2e.WARM_START_TINY_MLP],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: "predict"}},
            "spec": restricted({"restartPolicy": "Never", "containers": [container]})}  # fmt: skip


def kubectl_create(kubectl: Path, cluster: LocalCluster, namespace: str, pod: dict[str, Any], tmp_path: Path,
                   *extra: str) -> subprocess.CompletedProcess[str]:  # fmt: skip
    manifest = tmp_path / f"{pod['metadata']['name']}.json"
    manifest.write_text(json.dumps(pod))
    return subprocess.run([str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "create", "-f",
                           str(manifest), *extra], capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_the_prediction_is_said_at_admission_and_agrees_with_the_verdicts(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_cluster: LocalCluster, kube_namespace: str,
    redis_server: RedisServer, real_node: RealNode, kubectl_bin: Path, tmp_path: Path,
) -> None:  # fmt: skip
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("predict", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()},
    }))  # fmt: skip
    e2e.wait_condition(kube_client, ns, "predict", "Ready", "True", TIMEOUT)
    real_node.ctr("images", "tag", "--force", WORKLOAD_IMAGE, OTHER_TAG)

    pods = {"warm": app_pod("warm", {}), "nan": app_pod("nan", {"TORCHINDUCTOR_NAN_ASSERTS": "1"}),
            "tag": app_pod("tag", {}, OTHER_TAG)}  # fmt: skip
    said = {name: kubectl_create(kubectl_bin, kube_cluster, ns, pod, tmp_path) for name, pod in pods.items()}
    assert all(proc.returncode == 0 for proc in said.values()), {n: p.stderr for n, p in said.items()}
    assert "Warning" not in said["warm"].stderr, said["warm"].stderr
    assert SAYS in said["nan"].stderr, said["nan"].stderr
    assert "image-mismatch" in said["tag"].stderr and OTHER_TAG in said["tag"].stderr, said["tag"].stderr

    expected = {"warm": "warm", "nan": "cold", "tag": "cold"}
    for name, outcome in expected.items():
        annotations = kube_client.get(f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["annotations"]
        assert annotations["compilecache.io/predicted"] == outcome, annotations
    assert operator.sample("compilecache_admission_predictions_total", prediction="cold", cause="env") == 1
    assert operator.sample("compilecache_admission_predictions_total", prediction="cold", cause="image") == 1
    assert operator.sample("compilecache_admission_predictions_total", prediction="warm", cause="none") == 1

    for name in ("warm", "nan"):
        pod = wait_for(lambda n=name: e2e.pod_terminated(kube_client, ns, n), TIMEOUT, f"pod {name} to finish")
        verdict = e2e.terminated_message(pod, "app")["compilecache_why"]
        assert verdict["result"] == ("hit" if expected[name] == "warm" else "miss"), verdict
    tagged = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "tag"), TIMEOUT, "pod tag to finish")
    assert "compilecache-preload" not in json.dumps(tagged["spec"]), "another tag gets nothing preloaded"
    wait_for(lambda: operator.sample("compilecache_prediction_outcomes_total", predicted="cold", actual="cold") >= 1
             and operator.sample("compilecache_prediction_outcomes_total", predicted="warm", actual="warm") == 1,
             120, "the predictions counted against the verdicts")  # fmt: skip
    assert operator.sample("compilecache_prediction_outcomes_total", predicted="warm", actual="cold") == 0

    # Deny: the differing pod is refused with the same text, the matching one still admitted.
    kube_client.merge_patch(e2e.cache_path(ns, "predict"), {"spec": {"preload": {"onPredictedCold": "Deny"}}})

    def refused() -> subprocess.CompletedProcess[str] | None:
        proc = kubectl_create(kubectl_bin, kube_cluster, ns, app_pod("nan-denied", {"TORCHINDUCTOR_NAN_ASSERTS": "1"}),
                              tmp_path, "--dry-run=server")  # fmt: skip
        return proc if proc.returncode != 0 else None

    denied = wait_for(refused, 60, "the operator to see onPredictedCold: Deny")
    assert SAYS in denied.stderr and "denied the request" in denied.stderr, denied.stderr
    assert kubectl_create(kubectl_bin, kube_cluster, ns, app_pod("warm-2", {}), tmp_path).returncode == 0

    # A webhook outage: the operator is gone, its configuration stays (failurePolicy Ignore): the pod is admitted.
    operator.kill()
    outage = kubectl_create(kubectl_bin, kube_cluster, ns, app_pod("nan-outage", {"TORCHINDUCTOR_NAN_ASSERTS": "1"}),
                            tmp_path)  # fmt: skip
    assert outage.returncode == 0, outage.stderr
    annotations = kube_client.get(f"/api/v1/namespaces/{ns}/pods/nan-outage")["metadata"].get("annotations") or {}
    assert "compilecache.io/predicted" not in annotations
