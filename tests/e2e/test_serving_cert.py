"""The operator's own keys on the real kube-apiserver: two replicas with leader election make the webhook's
serving certificate and the signing key, the API server calls the webhook through the caBundle the leader
wrote, a rotation of the certificate refuses no admission, and a restart keeps the signing key."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.model.names import SKIPPED_ANNOTATION
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from cachelib.signing import Signer
from tests.infra.podspec import restricted
from tests.operator.e2e_support import OperatorProcess
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e]

MWC_API = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VWC_API = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
SERVING, SIGNING = "webhook-serving", "signing"
# Each certificate lives 150 s and is renewed 100 s before its end: a rotation begins ~50 s after the first.
VALIDITY_DAYS, RENEW_BEFORE_DAYS = 150 / 86400, 100 / 86400


class Replica(OperatorProcess):
    """One replica as the chart runs it: external webhook configuration, its own Secrets, leader election."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path, config: str, own: str) -> None:
        super().__init__(kubeconfig, namespace, workdir)
        self.webhook_config, self.own = config, own

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--webhook-config") + 1] = "external"
        return [*argv, "--operator-namespace", self.own,
                "--webhook-cert-secret", SERVING, "--webhook-ca-inject", self.webhook_config,
                "--webhook-cert-validity-days", str(VALIDITY_DAYS),
                "--webhook-cert-renew-before-days", str(RENEW_BEFORE_DAYS),
                "--webhook-cert-overlap-seconds", "4", "--webhook-cert-check-seconds", "1",
                "--signing-key-secret", SIGNING, "--check-caches-at-admission",
                "--leader-election-namespace", self.own, "--leader-election-name", "cc-test"]

    def start(self, client: KubeClient, timeout: float = 60) -> None:
        self.spawn()
        wait_for(lambda: self._alive() and self.ready(), timeout, "the replica to be ready (its certificate loaded)")


def configuration(kind: str, name: str, hook: str, path: str, rule: dict[str, Any], namespace: str, port: int,
                  **extra: Any) -> dict[str, Any]:
    """A webhook configuration of the chart's as a URL on loopback, with no caBundle (the leader writes it) and
    failurePolicy Fail: a webhook the API server cannot reach or does not trust refuses the object."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
            "webhooks": [{
                "name": hook, "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5, "clientConfig": {"url": f"https://127.0.0.1:{port}/{path}"},
                "rules": [{**rule, "operations": ["CREATE", "UPDATE"] if kind.startswith("Validating") else ["CREATE"],
                           "scope": "Namespaced"}],
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}]},
                **extra,
            }]}


def webhook_config(name: str, namespace: str, port: int) -> dict[str, Any]:
    """The chart's pod webhook."""
    return configuration("MutatingWebhookConfiguration", name, "inject.pods.compilecache.io", "inject-pods",
                         {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}, namespace, port,
                         objectSelector={"matchExpressions": [{"key": "compilecache.io/cache", "operator": "Exists"}]})


def cache_check_config(name: str, namespace: str, port: int) -> dict[str, Any]:
    """The chart's check of CompileCaches, of the same name as the pod webhook's configuration: the leader writes
    the caBundle of both."""
    return configuration("ValidatingWebhookConfiguration", name, "validate.compilecaches.compilecache.io",
                         "validate-caches", {"apiGroups": ["compilecache.io"], "apiVersions": ["*"],
                                             "resources": ["compilecaches"]}, namespace, port)


def ca_bundles(client: KubeClient, name: str) -> list[bytes]:
    """The caBundle of the pod webhook's and of the CompileCache check's configuration."""
    return [base64.b64decode(client.get(f"{api}/{name}")["webhooks"][0]["clientConfig"]["caBundle"])
            for api in (MWC_API, VWC_API)]


def secret(client: KubeClient, namespace: str, name: str) -> dict[str, bytes]:
    data = client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}").get("data") or {}
    return {k: base64.b64decode(v) for k, v in data.items()}


def served(port: int, ca: bytes) -> bytes:
    """The certificate (PEM) a replica presents to a client trusting ``ca``."""
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)


def admit_pod(client: KubeClient, namespace: str) -> dict[str, Any]:
    """Create a labelled pod (never scheduled: admission is what is looked at)."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"p-{uuid.uuid4().hex[:10]}", "labels": {"compilecache.io/cache": "none"}},
           "spec": restricted({"containers": [{"name": "app", "image": "registry.invalid/app:1"}]})}
    return client.post(f"/api/v1/namespaces/{namespace}/pods", pod)


def signing_key_ids(replica: Replica) -> set[str]:
    ids = set()
    for line in replica.log_path.read_text().splitlines():
        try:
            message = str(json.loads(line).get("message", ""))
        except ValueError:
            continue
        if message.startswith("signing bundles with key "):
            ids.add(message.split()[4])
    return ids


@pytest.fixture
def replicas(kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, crd: None,
             namespace_factory: Callable[[str | None], str], tmp_path: Path,
             request: pytest.FixtureRequest) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas watching ``kube_namespace``, their Secrets and Lease in a namespace of their own."""
    config, own = f"{kube_namespace}.serving-test", namespace_factory("restricted")
    pair = (Replica(kube_cluster.kubeconfig, kube_namespace, tmp_path / "a", config, own),
            Replica(kube_cluster.kubeconfig, kube_namespace, tmp_path / "b", config, own))
    kube_client.post(MWC_API, webhook_config(config, kube_namespace, pair[0].webhook_port))
    kube_client.post(VWC_API, cache_check_config(config, kube_namespace, pair[0].webhook_port))
    try:
        yield pair
    finally:
        for replica in pair:
            replica.stop()
            request.node.add_report_section("teardown", f"replica log {replica.workdir.name}", replica.log_tail())
        kube_client.delete_if_present(f"{MWC_API}/{config}", f"{VWC_API}/{config}")


def test_the_operator_makes_rotates_and_keeps_its_keys(kube_client: KubeClient, kube_namespace: str,
                                                       replicas: tuple[Replica, Replica]) -> None:
    ns, own = kube_namespace, replicas[0].own
    for replica in replicas:
        replica.start(kube_client)
    tls = secret(kube_client, own, SERVING)
    assert ca_bundles(kube_client, replicas[0].webhook_config) == [tls["ca.crt"]] * 2
    for replica in replicas:  # both replicas serve what the Secret holds, only one of them wrote it
        assert served(replica.webhook_port, tls["ca.crt"]) == tls["tls.crt"]
    pod = admit_pod(kube_client, ns)
    assert SKIPPED_ANNOTATION in pod["metadata"]["annotations"], "the webhook answered through the written caBundle"
    key = secret(kube_client, own, SIGNING)["signing.key"]

    # A rotation: labelled pods keep being created (failurePolicy Fail) until the new certificate is served and
    # the old CA retired; none is refused.
    first_cert, refused, admitted = tls["tls.crt"], [], 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        try:
            admit_pod(kube_client, ns)
            admitted += 1
        except KubeAPIError as error:
            refused.append(f"{error.status} {error.body[:300]}")
        now = secret(kube_client, own, SERVING)
        if now["tls.crt"] != first_cert and len(x509.load_pem_x509_certificates(now["ca.crt"])) == 1:
            break
        time.sleep(0.3)
    rotated = secret(kube_client, own, SERVING)
    assert rotated["tls.crt"] != first_cert, "no rotation within 150 s"
    assert not refused, f"{len(refused)} of {admitted + len(refused)} admissions refused: {refused[:3]}"
    assert admitted > 20
    for replica in replicas:
        wait_for(lambda r=replica: served(r.webhook_port, rotated["ca.crt"]) == rotated["tls.crt"], 10,
                 f"replica {replica.workdir.name} to serve the rotated certificate")
    for _ in range(5):
        admit_pod(kube_client, ns)
    assert ca_bundles(kube_client, replicas[0].webhook_config) == [rotated["ca.crt"]] * 2

    # A restart of both replicas keeps the signing key: what was signed before still verifies.
    message = Signer.from_pem(key).sign("cc1/ns/cache/key", "0" * 64)
    before = signing_key_ids(replicas[0]) | signing_key_ids(replicas[1])
    for replica in replicas:
        replica.stop()
    for replica in replicas:
        replica.start(kube_client)
    after = secret(kube_client, own, SIGNING)
    assert after["signing.key"] == key and "trusted.pub" not in after
    assert before == {message.key_id} == signing_key_ids(replicas[0]) | signing_key_ids(replicas[1])
    admit_pod(kube_client, ns)

    # An explicit rotation of the signing key: a new key, the previous one still trusted.
    kube_client.merge_patch(f"/api/v1/namespaces/{own}/secrets/{SIGNING}",
                            {"metadata": {"annotations": {"compilecache.io/rotate-signing-key": "now"}}})
    wait_for(lambda: secret(kube_client, own, SIGNING)["signing.key"] != key, 30, "the signing key's rotation")
    rotated_key = secret(kube_client, own, SIGNING)
    old_public = Signer.from_pem(key).public_key.text()
    assert rotated_key["trusted.pub"].decode().split() == [old_public]
    new_id = Signer.from_pem(rotated_key["signing.key"]).public_key.id
    for replica in replicas:
        wait_for(lambda r=replica: new_id in signing_key_ids(r), 30, "each replica to sign with the new key")
