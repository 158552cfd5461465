"""Bad input and bad luck on a real API server: each ends in a clear condition, no crash loop, nothing left over.

Warm-ups whose compiled content does not matter here run ``model.command`` (the harness runs the command
with the cache environment instead of compiling a target), which keeps these tests short.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from cachelib.keyformat import cache_prefix
from cachelib.stores import open_store
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer, free_port
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUICK = {"command": "python -c pass"}
TIMEOUT = 240


def spec(store_url: str, **extra: Any) -> dict[str, Any]:
    return {"image": WORKLOAD_IMAGE, "model": QUICK, "storage": {"url": store_url},
            "warmup": {"backoffLimit": 0}, **extra}


def store_keys(url: str, namespace: str, name: str) -> list[str]:
    with open_store(url) as store:
        return [info.key for info in store.list(cache_prefix(namespace, name))]


def test_invalid_spec_ends_ready_false_with_the_field_paths(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    # what the schema can express, the API server itself refuses
    with pytest.raises(KubeAPIError) as refused:
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache("both", {
            "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp", "command": "x"},
            "storage": {"url": "redis://127.0.0.1:6379/0"}}))
    assert refused.value.status == 422 and "spec.model" in str(refused.value)

    # what it cannot, the operator reports with the field path
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("bad", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"},
        "gpuTypes": ["NVIDIA-L4", "nvidia-l4"],
        "storage": {"url": "redis://127.0.0.1:notaport/0"},
    }))
    cache = e2e.wait_condition(kube_client, ns, "bad", "Ready", "False", 60, reason="InvalidSpec")
    message = e2e.condition(cache, "Ready")["message"]
    assert "spec.storage.url" in message and "port" in message
    assert "spec.gpuTypes[1]" in message
    assert e2e.condition(cache, "Degraded")["status"] == "True"
    assert cache["status"]["observedGeneration"] == 1
    # no Job, and the operator neither crashes nor loops: a few resyncs later nothing changed
    time.sleep(8)
    assert e2e.jobs_of(kube_client, ns, "bad") == []
    assert operator.process is not None and operator.process.poll() is None
    again = kube_client.get(e2e.cache_path(ns, "bad"))
    assert e2e.condition(again, "Ready")["lastTransitionTime"] == e2e.condition(cache, "Ready")["lastTransitionTime"]

    # fixing the spec re-plans from the new generation
    kube_client.merge_patch(e2e.cache_path(ns, "bad"), {"spec": {"gpuTypes": None, "model": {"target": None, **QUICK},
                                                             "storage": {"url": "redis://127.0.0.1:1/0"}}})
    wait_for(lambda: e2e.jobs_of(kube_client, ns, "bad"), 60, "a warm-up Job after the fix")
    (job,) = e2e.jobs_of(kube_client, ns, "bad")
    assert job["metadata"]["name"].endswith("-g2")


def test_failed_warm_up_surfaces_its_reason_without_retrying_forever(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("broken", spec(
        redis_server.store_url(), model={"target": "no_such_module:build"})))
    cache = e2e.wait_condition(kube_client, ns, "broken", "Ready", "False", TIMEOUT, reason="WarmupFailed")
    degraded = e2e.condition(cache, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CompileFailed", degraded
    assert "no_such_module" in degraded["message"] and "exited with code" in degraded["message"]
    assert e2e.condition(cache, "Warming")["status"] == "False"
    wait_for(lambda: operator.sample("compilecache_warmup_jobs_total", result="failed") == 1, 30,
             "the failed Job in /metrics")
    time.sleep(8)  # several resyncs: the failed generation is not warmed again
    assert len(e2e.jobs_of(kube_client, ns, "broken")) == 1
    assert operator.sample("compilecache_warmup_jobs_total", result="failed") == 1


def test_missing_secret_waits_then_warms_with_its_credentials(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("locked", spec(
        "redis://127.0.0.1:6379/0", storage={"url": "redis://127.0.0.1:6379/0", "secretRef": {"name": "creds"}})))
    cache = e2e.wait_condition(kube_client, ns, "locked", "Ready", "False", 60, reason="SecretNotFound")
    assert e2e.condition(cache, "Ready")["message"].startswith("spec.storage.secretRef.name: Secret 'creds' not found")
    assert e2e.jobs_of(kube_client, ns, "locked") == []

    kube_client.post(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"other": "x"}})
    e2e.wait_condition(kube_client, ns, "locked", "Ready", "False", 60, reason="SecretKeyMissing")
    kube_client.merge_patch(f"/api/v1/namespaces/{ns}/secrets/creds", {"stringData": {"password": "s3cret"}})
    (job,) = wait_for(lambda: e2e.jobs_of(kube_client, ns, "locked"), 60, "the warm-up Job once the Secret is complete")
    publish = job["spec"]["template"]["spec"]["containers"][0]
    assert [e for e in publish["env"] if e["name"] != "TMPDIR"] == [  # TMPDIR: its read-only root's way out
        {"name": "COMPILECACHE_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}]


def test_unreachable_store_fails_the_publish_step(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("nostore", spec(f"redis://127.0.0.1:{free_port()}/0")))
    cache = e2e.wait_condition(kube_client, ns, "nostore", "Ready", "False", TIMEOUT, reason="WarmupFailed")
    degraded = e2e.condition(cache, "Degraded")
    assert degraded["reason"] == "PublishFailed", degraded
    assert "publish" in degraded["message"] and "127.0.0.1" in degraded["message"]


def test_restarted_operator_does_not_duplicate_the_warm_up_job(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    url = redis_server.store_url()
    slow = {"command": "python -c 'import time; time.sleep(12)'"}
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("slow", spec(url, model=slow)))
    (job,) = wait_for(lambda: e2e.jobs_of(kube_client, ns, "slow"), 60, "the warm-up Job")
    operator.kill()  # mid-warm-up, no clean-up
    time.sleep(2)
    operator.start(kube_client)
    cache = e2e.wait_condition(kube_client, ns, "slow", "Ready", "True", TIMEOUT)
    jobs = e2e.jobs_of(kube_client, ns, "slow")
    assert [j["metadata"]["uid"] for j in jobs] == [job["metadata"]["uid"]]
    (bundle,) = cache["status"]["bundles"]
    assert bundle["job"] == job["metadata"]["name"]
    assert store_keys(url, ns, "slow") == [bundle["key"]]
    wait_for(lambda: operator.sample("compilecache_warmup_jobs_total", result="succeeded") == 1, 30,
             "the Job counted once by the restarted operator")


def test_deletion_honours_the_policy_even_mid_warm_up(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    url = redis_server.store_url()
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("kept", spec(url)))
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("done", spec(url, deletionPolicy="Delete")))
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("busy", spec(
        url, deletionPolicy="Delete", model={"command": "python -c 'import time; time.sleep(30)'"})))
    for name in ("kept", "done"):
        e2e.wait_condition(kube_client, ns, name, "Ready", "True", TIMEOUT)
    assert not kube_client.get(e2e.cache_path(ns, "kept"))["metadata"].get("finalizers")
    assert kube_client.get(e2e.cache_path(ns, "done"))["metadata"]["finalizers"] == ["compilecache.io/bundles"]
    assert len(store_keys(url, ns, "done")) == 1

    # a pod that already has the preload container gets nothing more from the webhook
    existing = {"name": "compilecache-preload", "image": WORKLOAD_IMAGE, "command": ["python", "-c", "pass"]}
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pre", "labels": {"compilecache.io/cache": "done"}},
        "spec": restricted({"restartPolicy": "Never", "initContainers": [existing], "containers": [
            {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", "pass"]}]}),
    })
    assert [c["name"] for c in created["spec"]["initContainers"]] == ["compilecache-preload"]
    assert all(v["name"] != "compilecache-cache" for v in created["spec"].get("volumes") or [])
    assert "compilecache.io/injected" not in (created["metadata"].get("annotations") or {})

    def pod_running(name: str) -> bool:
        selector = f"compilecache.io/warmup-for={name}"
        pods = kube_client.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)["items"]
        return any(p.get("status", {}).get("phase") == "Running" for p in pods)

    wait_for(lambda: pod_running("busy"), 60, "the busy warm-up pod to run")
    for name in ("kept", "done", "busy"):
        kube_client.delete(e2e.cache_path(ns, name))

    def gone(name: str) -> bool:
        try:
            kube_client.get(e2e.cache_path(ns, name))
        except KubeAPIError as error:
            return error.status == 404
        return False

    for name in ("kept", "done", "busy"):
        wait_for(lambda name=name: gone(name), 90, f"CompileCache {name} to be deleted")
    wait_for(lambda: not any(e2e.jobs_of(kube_client, ns, n) for n in ("done", "busy")), 60, "owned Jobs to go")
    time.sleep(3)  # a publish racing the delete would land now
    assert store_keys(url, ns, "done") == [] and store_keys(url, ns, "busy") == []
    assert len(store_keys(url, ns, "kept")) == 1, "deletionPolicy Keep leaves the bundles"


def test_many_caches_deleted_at_once_each_delete_their_jobs_and_bundles(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    """Twelve caches with three warm-up Jobs each (three GPU types no node has: their pods stay Pending),
    deleted at once: the operator deletes each cache's Jobs one by one while their watch events arrive, then
    the finalizer. Every cache goes, no deletion fails on the way (no CleanupFailed event, no "dictionary
    changed size during iteration" in the log), every Job goes with its cache."""
    ns = kube_namespace
    url = redis_server.store_url()
    names = [f"many-{i}" for i in range(12)]
    for name in names:
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache(name, spec(
            url, deletionPolicy="Delete", gpuTypes=["NVIDIA-A10", "NVIDIA-L4", "NVIDIA-T4"])))
    wait_for(lambda: all(len(e2e.jobs_of(kube_client, ns, n)) == 3 for n in names), TIMEOUT,
             "three warm-up Jobs for each cache")
    for name in names:
        kube_client.delete(e2e.cache_path(ns, name))
    wait_for(lambda: not kube_client.get(e2e.cache_path(ns))["items"], TIMEOUT, "every cache to be deleted")
    wait_for(lambda: not any(e2e.jobs_of(kube_client, ns, n) for n in names), 60, "their Jobs to go")
    events = kube_client.get(f"/api/v1/namespaces/{ns}/events")["items"]
    assert not [e["message"] for e in events if e["reason"] == "CleanupFailed"]
    assert sum(e["reason"] == "BundlesDeleted" for e in events) >= len(names)
    assert "changed size during iteration" not in operator.log_path.read_text(errors="replace")
