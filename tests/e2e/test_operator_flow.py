"""The operator's main job on a real API server: warm up, publish, inject, preload, hit, count.

A CompileCache for the built-in ``tiny_mlp`` target publishes its bundle to a real redis-server through a
warm-up Job that the real Job controller runs and the real node's kubelet executes; then a labelled pod goes through
the real admission chain to the operator's webhook, its preload init container fills the cache directory,
and the app's first compile hits torch's FX-graph cache. The operator's /metrics counts that hit, a miss
(a pod pinned to a GPU type that has no bundle) and a skipped pod (a cache that does not exist).
"""

from __future__ import annotations

from typing import Any

import pytest

from cachelib.in_image import compilestep
from cachelib.stores import open_store
from tests.e2e.conftest import GPU_LABEL, GPU_PRODUCT, WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
WARM_UP_TIMEOUT = 420

def labelled_pod(name: str, cache: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """An opted-in pod of a careful user: "restricted"-compliant, running as its own uid 1000."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
        "spec": restricted({"restartPolicy": "Never",
                            "containers": [{"name": "app", "image": WORKLOAD_IMAGE, "command": command}], **spec}),
    }


def test_warm_up_publish_inject_preload_hit_and_count(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    store_url = redis_server.store_url()
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE,
        "model": {"target": "tiny_mlp"},
        "storage": {"url": store_url},
    }))

    # CompileCache -> one warm-up Job -> bundle in Redis -> Ready=True with the bundle in status
    cache = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", WARM_UP_TIMEOUT)
    status = cache["status"]
    assert status["observedGeneration"] == 1 and status["bundleCount"] == 1
    assert e2e.condition(cache, "Ready")["reason"] == "BundlesAvailable"
    assert e2e.condition(cache, "Warming")["status"] == "False"
    assert e2e.condition(cache, "Degraded")["status"] == "False"
    (bundle,) = status["bundles"]
    assert bundle["key"].startswith(f"cc1/{ns}/mlp/") and "/cpu/cpu/torch-" in bundle["key"]
    installed = compilestep.detect_versions()  # the warm-up ran with this very installation
    assert bundle["gpu"] == "cpu" and bundle["torch"] == installed["torch"] and bundle["python"]
    assert bundle["triton"] == installed["triton"]
    assert len(bundle["digest"]) == 64 and bundle["bytes"] > 0 and bundle["compileSeconds"] > 0
    assert bundle["generation"] == 1 and bundle["image"] == WORKLOAD_IMAGE and bundle["jobId"]
    with open_store(store_url) as store:
        stored = store.head(bundle["key"])
    assert stored is not None and stored.size == bundle["bytes"]
    (job,) = e2e.jobs_of(kube_client, ns, "mlp")
    assert job["metadata"]["name"] == f"cc-mlp-{bundle['variant']}-g1"
    assert job["metadata"]["ownerReferences"][0]["uid"] == cache["metadata"]["uid"]
    wait_for(lambda: operator.sample("compilecache_warmup_jobs_total", result="succeeded") == 1, 30,
             "the succeeded warm-up Job in /metrics")
    assert operator.sample("compilecache_bundles", namespace=ns, cache="mlp") == 1
    assert operator.sample("compilecache_bundle_bytes", namespace=ns, cache="mlp", gpu="cpu") == bundle["bytes"]

    # a labelled pod: the real API server calls the webhook, which puts the preload container first
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods",
                               labelled_pod("app", "mlp", ["python", "-c", e2e.COMPILE_TINY_MLP]))
    init = created["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["compilecache-preload"]
    assert init[0]["command"][:4] == ["compilecache", "preload", "--store", store_url]
    assert ["--key", bundle["key"]] == init[0]["command"][4:6]
    app_env = {e["name"]: e.get("value") for e in created["spec"]["containers"][0]["env"]}
    assert app_env["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/compilecache/inductor"
    assert app_env["TORCH_COMPILE_JOB_ID"] == bundle["jobId"]
    assert created["metadata"]["annotations"]["compilecache.io/injected"] == "mlp"

    # the kubelet runs the preload, then the app: its first compile hits the FX graph cache
    pod = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "app"), WARM_UP_TIMEOUT, "the app pod to finish")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    preload = e2e.terminated_message(pod, "compilecache-preload", init=True)
    assert preload["result"] == "hit" and preload["bytes"] > 0, preload
    report = e2e.terminated_message(pod, "app")
    assert report["cache"]["fxgraph_hit"] >= 1 and report["cache"]["fxgraph_miss"] == 0, report
    assert report["job_id"] == bundle["jobId"]

    # a pod pinned to a GPU type without a bundle: injected, preloads nothing, counted as a miss
    pinned = labelled_pod("pinned", "mlp", ["python", "-c", "pass"], nodeSelector={GPU_LABEL: GPU_PRODUCT})
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", pinned)
    gpu_slug = GPU_PRODUCT.lower()
    command = created["spec"]["initContainers"][0]["command"]
    assert command[command.index("--gpu") + 1] == gpu_slug
    # a pod asking for a cache that does not exist: not injected, counted as skipped
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", labelled_pod("stray", "nope", ["python", "-c", "pass"]))
    assert "initContainers" not in created["spec"]
    annotations = created["metadata"]["annotations"]
    assert annotations["compilecache.io/skipped"] == "unknown-cache"
    assert annotations["compilecache.io/skipped-detail"] == f"no CompileCache 'nope' in namespace '{ns}'"

    for name in ("pinned", "stray"):
        wait_for(lambda name=name: e2e.pod_terminated(kube_client, ns, name), 120, f"pod {name} to finish")
    miss = e2e.terminated_message(kube_client.get(f"/api/v1/namespaces/{ns}/pods/pinned"), "compilecache-preload",
                              init=True)
    assert miss["result"] == "miss", miss

    def counted() -> bool:
        return (
            operator.sample("compilecache_preloads_total", namespace=ns, cache="mlp", gpu="cpu", result="hit") == 1
            and operator.sample("compilecache_preloads_total", cache="mlp", gpu=gpu_slug, result="miss") == 1
            and operator.sample("compilecache_preloads_total", cache="nope", result="skipped") == 1
        )

    wait_for(counted, 30, "hit, miss and skipped in /metrics")
    assert operator.sample("compilecache_preload_bytes_total", namespace=ns, cache="mlp") == preload["bytes"]
    assert operator.sample("compilecache_preload_duration_seconds_count", cache="mlp", result="hit") == 1
    pod = kube_client.get(f"/api/v1/namespaces/{ns}/pods/app")
    assert pod["metadata"]["annotations"]["compilecache.io/preload-counted"] == "hit"
    # counted once: later pod events do not count the same pods again
    kube_client.merge_patch(f"/api/v1/namespaces/{ns}/pods/app", {"metadata": {"labels": {"touched": "yes"}}})
    wait_for(lambda: "touched" in kube_client.get(f"/api/v1/namespaces/{ns}/pods/app")["metadata"]["labels"], 10,
             "the label")
    assert operator.sample("compilecache_preloads_total", namespace=ns, cache="mlp", result="hit") == 1


def test_gpu_discovery_plans_the_node_gpu_type(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    """``gpuDiscovery.auto`` finds the node's GPU product; the warm-up pod selects it and asks for one GPU.

    The node here has the GPU label and an nvidia.com/gpu capacity but no GPU, so the bundle's key says
    cpu while status records the planned product.
    """
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("auto", {
        "image": WORKLOAD_IMAGE,
        "model": {"command": "python -c pass"},
        "gpuDiscovery": {"auto": True},
        "storage": {"url": redis_server.store_url()},
    }))
    cache = e2e.wait_condition(kube_client, ns, "auto", "Ready", "True", 240)
    assert cache["status"]["plannedGPUs"] == GPU_PRODUCT
    (bundle,) = cache["status"]["bundles"]
    assert bundle["gpu"] == GPU_PRODUCT
    (job,) = e2e.jobs_of(kube_client, ns, "auto")
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {GPU_LABEL: GPU_PRODUCT}
    assert pod_spec["initContainers"][1]["resources"]["limits"]["nvidia.com/gpu"] == "1"
