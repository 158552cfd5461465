"""Signed bundles and confined CompileCaches on the real API server, redis-server and the preloader image.

- A bundle written straight into Redis by someone without the operator's key (a correct sha256, no
  signature or another key's) is refused by the pod's preload, before anything is unpacked, and counted
  (error, signature-refused); the bundle the operator signed hits; after a key rotation the old key still
  verifies the bundles it signed while it is listed as trusted, and no longer once it is dropped.
- A CompileCache that points a namespace Secret at a store outside the operator's allow-list is InvalidSpec
  (condition and Warning event): no Job is created and no pod is given the Secret.
- The chart's check at admission (the operator pod's validating webhook) makes the API server refuse the same
  CompileCaches at create and at a change of spec, with the operator's message.
"""

from __future__ import annotations

import io
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cachelib.bundlereader import BundleReader
from cachelib.signing import Signer, check_stored, signature_key, write_signature
from cachelib.stores import open_store
from tests.cachelib.helpers import make_outdir
from tests.chart.e2e_fixtures import CC_API, Release
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

# redis_server: the e2e conftest's, reachable from pods

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
WARM_UP_TIMEOUT = 420
POD_TIMEOUT = 180


def key_file(directory: Path, signer: Signer, name: str) -> str:
    path = directory / name
    path.write_bytes(signer.private_pem())
    path.chmod(0o600)
    return str(path)


def labelled_pod(name: str, cache: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
        "spec": restricted({"restartPolicy": "Never", "containers": [
            {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", "pass"]}]}),
    }  # fmt: skip


def run_pod(client: KubeClient, namespace: str, name: str, cache: str = "mlp") -> tuple[dict[str, Any], dict[str, Any]]:
    """Create an opted-in pod, wait for it; (the pod as admitted, its preload's result)."""
    created = client.post(f"/api/v1/namespaces/{namespace}/pods", labelled_pod(name, cache))
    finished = wait_for(lambda: e2e.pod_terminated(client, namespace, name), POD_TIMEOUT, f"pod {name} to finish")
    assert finished["status"]["phase"] == "Succeeded", finished["status"]
    return created, e2e.terminated_message(finished, "compilecache-preload", init=True)


def wait_injecting(client: KubeClient, namespace: str, trusted: list[Signer]) -> None:
    """Wait until a (re)started operator's webhook injects pods of cache mlp with these trusted keys: its
    index of CompileCaches fills a moment after it starts. Probed with server-side dry runs, which go
    through admission but create nothing."""
    wanted = [s.public_key.text() for s in trusted]

    def injecting() -> bool:
        probe = client.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=labelled_pod("probe", "mlp"),
                               query={"dryRun": "All"})  # fmt: skip
        return bool(probe["spec"].get("initContainers")) and trusted_keys_of(probe) == wanted

    wait_for(injecting, 60, f"the webhook to inject pods trusting {[s.public_key.id for s in trusted]}")


def trusted_keys_of(pod: dict[str, Any]) -> list[str]:
    command = pod["spec"]["initContainers"][0]["command"]
    return [command[i + 1] for i, arg in enumerate(command) if arg == "--trusted-key"]


def forged_bundle(tmp_path: Path, key: str) -> bytes:
    """Another bundle under the same key, as anyone with write access to the store can make one."""
    from cachelib.keyformat import CacheKey
    from cachelib.publish import pack

    fields = {k: v for k, v in CacheKey.parse(key).to_dict().items() if k != "format"}
    out = make_outdir(tmp_path / "forged", CacheKey(**fields), files={"fxgraph/evil": b"not what was compiled"})
    bundle = tmp_path / "forged.ccb"
    pack(out, bundle)
    return bundle.read_bytes()


def test_only_bundles_the_operator_signed_are_preloaded_and_rotation_keeps_old_ones(
    start_operator: Callable[..., e2e.OperatorProcess], kube_client: KubeClient, kube_namespace: str,
    redis_server: RedisServer, tmp_path: Path,
) -> None:
    ns = kube_namespace
    first, second = Signer.generate(), Signer.generate()
    operator = start_operator("--signing-key-file", key_file(tmp_path, first, "first.key"))
    store_url = redis_server.store_url()
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": store_url}}))
    cache = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", WARM_UP_TIMEOUT)
    (bundle,) = cache["status"]["bundles"]
    key = bundle["key"]
    with open_store(store_url) as store:
        with store.get(key) as stream:
            signed_bytes = stream.read()
        digest = BundleReader(io.BytesIO(signed_bytes)).digest  # type: ignore[arg-type]
        assert check_stored(store, key, digest, [first.public_key]) == first.public_key.id
        with store.get(signature_key(key)) as stream:
            signature_bytes = stream.read()

    # the bundle the operator signed: a hit, naming the signer
    wait_injecting(kube_client, ns, [first])
    created, result = run_pod(kube_client, ns, "signed")
    assert trusted_keys_of(created) == [first.public_key.text()]
    assert result["result"] == "hit" and result["signed_by"] == {key: first.public_key.id}, result

    # a store writer without the key replaces the bundle (the store records its correct sha256)
    forged = forged_bundle(tmp_path, key)
    with open_store(store_url) as store:
        store.put(key, io.BytesIO(forged), size=len(forged))
        head = store.head(key)
        assert head is not None and head.sha256 and head.sha256 != bundle["digest"]
        store.delete(signature_key(key))
    _, unsigned = run_pod(kube_client, ns, "unsigned")
    assert unsigned["result"] == "error" and "is not signed" in unsigned["reason"], unsigned
    assert unsigned["hits"] == [] and unsigned["files"] == 0 and unsigned["unpacked_bytes"] == 0
    with open_store(store_url) as store:  # ... and signs it with a key of their own
        write_signature(store, Signer.generate().sign(key, BundleReader(io.BytesIO(forged)).digest))  # type: ignore[arg-type]
    _, other_key = run_pod(kube_client, ns, "other-key")
    assert other_key["result"] == "error" and "which is not trusted" in other_key["reason"], other_key
    wait_for(lambda: operator.sample("compilecache_preloads_total", namespace=ns, cache="mlp", result="error",
                                     reason="signature-refused") == 2, 30, "two refused signatures in /metrics")

    # the signed bundle back; the operator rotates to a new key and still trusts the first one
    with open_store(store_url) as store:
        store.put(key, io.BytesIO(signed_bytes), size=len(signed_bytes))
        store.put(signature_key(key), io.BytesIO(signature_bytes), size=len(signature_bytes))
    operator = start_operator("--signing-key-file", key_file(tmp_path, second, "second.key"),
                              "--trusted-public-keys", first.public_key.text())  # fmt: skip
    wait_injecting(kube_client, ns, [second, first])
    created, rotated = run_pod(kube_client, ns, "rollover")
    assert trusted_keys_of(created) == [second.public_key.text(), first.public_key.text()]
    assert rotated["result"] == "hit" and rotated["signed_by"] == {key: first.public_key.id}, rotated

    # once the first key is dropped, its bundles are no longer accepted
    operator = start_operator("--signing-key-file", key_file(tmp_path, second, "second.key"))
    wait_injecting(kube_client, ns, [second])
    _, dropped = run_pod(kube_client, ns, "dropped")
    assert dropped["result"] == "error" and "which is not trusted" in dropped["reason"], dropped


def test_a_secret_pointed_outside_the_allow_list_reaches_no_job_and_no_pod(
    start_operator: Callable[..., e2e.OperatorProcess], kube_client: KubeClient, kube_namespace: str,
) -> None:
    ns = kube_namespace
    start_operator("--allowed-store-hosts", "redis.compilecache.svc", "--allowed-store-secrets", "store")
    kube_client.post(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store"}, "stringData": {"password": "s3cret"}})
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("exfil", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"},
        "storage": {"url": "redis://collector.attacker.example:6379/0", "secretRef": {"name": "store"}}}))
    cache = e2e.wait_condition(kube_client, ns, "exfil", "Ready", "False", 60, reason="InvalidSpec")
    message = e2e.condition(cache, "Ready")["message"]
    assert "spec.storage.url: store collector.attacker.example:6379 is not on the operator's allow-list" in message

    def warning() -> dict[str, Any] | None:
        events = kube_client.get(f"/api/v1/namespaces/{ns}/events")["items"]
        found = [e for e in events if e["involvedObject"]["name"] == "exfil" and e["type"] == "Warning"
                 and e["reason"] == "InvalidSpec"]  # fmt: skip
        return found[0] if found else None

    assert "collector.attacker.example" in wait_for(warning, 30, "the InvalidSpec Warning event")["message"]
    time.sleep(6)  # a few resyncs: still no Job
    assert e2e.jobs_of(kube_client, ns, "exfil") == []
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", labelled_pod("app", "exfil"))
    assert "initContainers" not in created["spec"]
    assert created["metadata"]["annotations"]["compilecache.io/skipped"] == "not-ready"
    assert "store" not in json.dumps(created["spec"])  # no reference to the Secret anywhere in the pod


def test_the_charts_admission_check_refuses_the_same_on_the_api_server(
    kube_client: KubeClient, kube_namespace: str, pod_release: Callable[..., Release],
) -> None:
    """The chart's operator as a pod on the real node (its image), answering the ValidatingWebhookConfiguration."""
    ns = kube_namespace
    pod_release(1, "--set", "storage.url=redis://redis.compilecache.svc:6379/0",
            "--set", "storage.credentialsSecret=store",
            "--set", "confinement.storeHosts={*.cache.svc,s3://models}",
            "--set", f"confinement.warmupServiceAccounts={{{ns}/warmup}}")  # fmt: skip

    def create(name: str, storage: dict[str, Any], **extra: Any) -> None:
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache(name, {
            "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": storage, **extra}))

    def refused(name: str, storage: dict[str, Any], **extra: Any) -> str:
        with pytest.raises(KubeAPIError) as caught:
            create(name, storage, **extra)
        assert caught.value.status in (403, 422), caught.value
        return str(caught.value)

    # the webhook answers once an operator replica is Ready behind its Service
    probes = itertools.count()

    def in_force() -> bool:
        try:
            create(f"probe-{next(probes)}", {"url": "redis://collector.attacker.example:6379/0"})
        except KubeAPIError as error:
            return "not on the operator's allow-list" in str(error)
        return False

    wait_for(in_force, 420, "the admission check to be in force")
    for leftover in kube_client.get(f"{CC_API}/namespaces/{ns}/compilecaches")["items"]:
        kube_client.delete(e2e.cache_path(ns, leftover["metadata"]["name"]))

    create("default-store", {"url": "redis://redis.compilecache.svc/0?prefix=a", "secretRef": {"name": "store"}})
    create("domain", {"url": "rediss://redis.team.cache.svc:6380/1"})
    create("bucket", {"url": "s3://models/llama"})
    create("account", {"url": "redis://redis.compilecache.svc:6379/0"}, warmup={"serviceAccountName": "warmup"})

    message = refused("exfil", {"url": "redis://collector.attacker.example:6379/0", "secretRef": {"name": "store"}})
    assert "spec.storage.url: store collector.attacker.example:6379 is not on the operator's allow-list" in message
    assert "not on the operator's allow-list" in refused("port", {"url": "redis://redis.compilecache.svc:7000/0"})
    assert "not on the operator's allow-list" in refused("lookalike", {"url": "redis://evilcache.svc:6379/0"})
    assert "not on the operator's allow-list" in refused(
        "endpoint", {"url": "s3://models/llama?endpoint=https://minio.attacker.example"})
    secret = refused("secret", {"url": "redis://redis.compilecache.svc/0", "secretRef": {"name": "admin-token"}})
    assert "spec.storage.secretRef.name: Secret 'admin-token' is not allowed as store credentials" in secret
    account = refused("sa", {"url": "redis://redis.compilecache.svc/0"}, warmup={"serviceAccountName": "deployer"})
    assert "spec.warmup.serviceAccountName: ServiceAccount 'deployer' is not allowed for warm-ups" in account
    # an update that moves an admitted cache outside the lists is refused too
    with pytest.raises(KubeAPIError) as moved:
        kube_client.merge_patch(e2e.cache_path(ns, "domain"), {"spec": {"storage": {"url": "redis://10.0.0.1:6379/0"}}})
    assert "not on the operator's allow-list" in str(moved.value)
    names = {c["metadata"]["name"] for c in kube_client.get(f"{CC_API}/namespaces/{ns}/compilecaches")["items"]}
    assert names == {"default-store", "domain", "bucket", "account"}
