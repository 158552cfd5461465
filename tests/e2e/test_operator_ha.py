"""Several operator replicas on the real API server: one leads (a Lease), every one serves the webhook.

The replicas share one serving certificate and sit behind a loopback TCP balancer that routes only to
replicas whose ``/readyz`` answers, as a Service does with its ready endpoints; the
MutatingWebhookConfiguration points at the balancer. Under a steady stream of labelled pod creates the
replicas are replaced one by one (a rolling update: a new one starts and gets ready, then an old one
stops), and no pod is admitted without the webhook knowing its CompileCache (no ``unknown-cache`` skip,
no pod without the webhook's annotation). The Lease moves to a live replica, which goes on reconciling.

The stream runs at 25 creates per second (``COMPILECACHE_HA_POD_RATE``; 50 passes too). A pod once went
through uninjected at that rate, the API server saying "failing open ... write: broken pipe": the
balancer, not a replica, had closed a kept-alive connection (it kept the connect timeout on the upstream
socket, so every connection idle for 2 s was torn down, racing the API server's next admission on it).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.edge import certs

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.infra.relay import TcpRelay
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e]

CACHE_LABEL = "compilecache.io/cache"
SKIPPED = "compilecache.io/skipped"
INJECTED = "compilecache.io/injected"
LEASE = "compilecache-operator"
RATE = float(os.environ.get("COMPILECACHE_HA_POD_RATE", "25"))
"""Labelled pod creates per second during the replacement (the issue's sweeps ran 20 to 50)."""


class Replica(e2e.OperatorProcess):
    """One replica: the shared certificate, the webhook configuration left to the test, a Lease."""

    def __init__(self, cluster: LocalCluster, namespace: str, workdir: Path, cert_dir: Path) -> None:
        super().__init__(cluster.kubeconfig, namespace, workdir, "--webhook-config", "external",
                         "--webhook-cert-dir", str(cert_dir), "--leader-election-namespace", namespace)

    def start(self, client: KubeClient, timeout: float = 60) -> None:
        self.spawn()
        wait_for(lambda: self._alive() and self.ready(), timeout, "the replica's /readyz")


class Balancer(TcpRelay):
    """A TCP balancer on loopback over the replicas that are ready, as a Service routes to its ready endpoints:
    a replica leaves after ``FAILURE_THRESHOLD`` failed readiness probes in a row (a kubelet's default), and a
    connection, once made, stays up until one of its ends closes it, however long it is idle (kube-proxy's
    conntrack keeps an established connection for days)."""

    FAILURE_THRESHOLD = 3
    connect_timeout = 2.0

    def __init__(self) -> None:
        self.replicas: list[Replica] = []
        self._ready: list[int] = []
        self._failures: dict[int, int] = {}
        self._turn = itertools.count()
        super().__init__(("127.0.0.1", 0))
        threading.Thread(target=self._probe, daemon=True).start()

    def _probe(self) -> None:
        while not self._stop.is_set():
            for replica in list(self.replicas):
                ok = replica.ready()
                self._failures[replica.webhook_port] = 0 if ok else self._failures.get(replica.webhook_port, 0) + 1
            self._ready = [r.webhook_port for r in list(self.replicas)
                           if self._failures.get(r.webhook_port, self.FAILURE_THRESHOLD) < self.FAILURE_THRESHOLD]
            time.sleep(0.5)

    def pick(self) -> tuple[str, int] | None:
        ready = self._ready
        return ("127.0.0.1", ready[next(self._turn) % len(ready)]) if ready else None


def webhook_configuration(name: str, namespace: str, port: int, ca: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "inject-pods.compilecache.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "timeoutSeconds": 5, "reinvocationPolicy": "Never",
            "clientConfig": {"url": f"https://127.0.0.1:{port}/inject-pods", "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "objectSelector": {"matchExpressions": [{"key": CACHE_LABEL, "operator": "Exists"}]},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        }],
    }


class PodStream:
    """Labelled pods created at ``rate`` per second (from ``workers`` threads, each create waiting for the
    webhook) until stopped; ``names`` are those the API server created."""

    def __init__(self, client: KubeClient, namespace: str, rate: float = RATE, workers: int = 6) -> None:
        self.client, self.namespace, self.rate = client, namespace, rate
        self.names: list[str] = []
        self.refused: list[str] = []
        self._slots = itertools.count()
        self._stop = threading.Event()
        self._began = time.monotonic()
        self._ended: float | None = None
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            n = next(self._slots)
            if self._stop.wait(max(0.0, self._began + n / self.rate - time.monotonic())):
                return
            name = f"app-{n:05d}"
            try:
                self.client.post(f"/api/v1/namespaces/{self.namespace}/pods", {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: "mlp"}},
                    "spec": restricted({"restartPolicy": "Never", "nodeSelector": {"compilecache.test/nowhere": "1"},
                                        "containers": [{"name": "app", "image": WORKLOAD_IMAGE,
                                                        "command": ["python", "-c", "pass"]}]}),
                })
            except KubeAPIError as exc:
                self.refused.append(f"{name}: {exc}")
                continue
            self.names.append(name)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self._ended = time.monotonic()

    @property
    def achieved(self) -> float:
        """Pods created per second, over the stream's life."""
        return len(self.names) / max(1e-9, (self._ended or time.monotonic()) - self._began)


@pytest.fixture
def replicas(kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, crd: None, tmp_path: Path,
             request: pytest.FixtureRequest) -> Iterator[tuple[Balancer, list[Replica]]]:
    cert_dir = tmp_path / "tls"
    cert_dir.mkdir()
    files = certs.self_signed(["127.0.0.1", "localhost"], cert_dir)
    assert files.ca is not None
    balancer = Balancer()
    config = webhook_configuration(f"{kube_namespace}.ha.compilecache.io", kube_namespace, balancer.port,
                                   files.ca.read_bytes())
    kube_client.post("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", config)
    started: list[Replica] = []
    try:
        yield balancer, started
    finally:
        request.node.add_report_section("teardown", "replica logs", "\n".join(r.log_tail(4000) for r in started))
        for replica in started:
            replica.stop()
        balancer.close()
        with contextlib.suppress(KubeAPIError):
            kube_client.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                               f"{config['metadata']['name']}")


def lease_holder(client: KubeClient, namespace: str) -> str:
    try:
        return str(client.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}")["spec"]
                   .get("holderIdentity") or "")
    except KubeAPIError:
        return ""


def test_a_rolling_replacement_under_a_stream_of_pods_skips_none(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, crd: None, tmp_path: Path,
    replicas: tuple[Balancer, list[Replica]],
) -> None:
    ns = kube_namespace
    balancer, started = replicas
    cert_dir = tmp_path / "tls"
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": "redis://127.0.0.1:1/0"},
    }))

    def replica(index: int) -> Replica:
        r = Replica(kube_cluster, ns, tmp_path / f"replica-{index}", cert_dir)
        started.append(r)
        r.start(kube_client)
        balancer.replicas.append(r)
        return r

    first, second = replica(0), replica(1)
    wait_for(lambda: lease_holder(kube_client, ns), 30, "a leader")
    stream = PodStream(kube_client, ns)
    try:
        time.sleep(3)
        third = replica(2)  # the rolling update: a new replica gets ready, then an old one goes
        first.stop()
        time.sleep(3)
        fourth = replica(3)
        second.stop()
        time.sleep(3)
        assert third.process is not None and fourth.process is not None
    finally:
        stream.stop()

    def annotation_of(name: str) -> tuple[str | None, str | None]:
        meta = kube_client.get(f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]
        annotations = meta.get("annotations") or {}
        return annotations.get(SKIPPED), annotations.get(INJECTED)

    seen = {name: annotation_of(name) for name in stream.names}
    print(f"\n{len(seen)} pods at {stream.achieved:.1f}/s (asked {stream.rate:g}/s)")
    assert not stream.refused, stream.refused[:5]
    assert len(seen) >= 30, f"only {len(seen)} pods were created"
    unserved = [n for n, (skipped, injected) in seen.items() if skipped is None and injected is None]
    unknown = [n for n, (skipped, _) in seen.items() if skipped == "unknown-cache"]
    assert not unserved and not unknown, f"admitted without the webhook: {unserved}; unknown cache: {unknown}"

    # The Lease is with a live replica, which goes on reconciling: a spec change is observed.
    wait_for(lambda: lease_holder(kube_client, ns) and all(r.process is not None for r in (third, fourth)), 30,
             "a live leader")
    kube_client.request("PATCH", e2e.cache_path(ns, "mlp"), body={"spec": {"retention": {"keepGenerations": 3}}},
                        content_type="application/merge-patch+json")
    generation = kube_client.get(e2e.cache_path(ns, "mlp"))["metadata"]["generation"]
    path = e2e.cache_path(ns, "mlp")
    wait_for(lambda: kube_client.get(path).get("status", {}).get("observedGeneration") == generation,
             60, "the new leader to reconcile the change")


class EchoReplica:
    """Stands in for a replica behind the balancer (a mock: only the balancer is under test): an echo server
    on loopback, always ready."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.webhook_port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            connection, _ = self.server.accept()
            while data := connection.recv(1024):
                connection.sendall(data)

    def ready(self) -> bool:
        return True


def test_the_balancer_keeps_an_idle_kept_alive_connection() -> None:
    """The cause of a pod admitted without the webhook (the API server: "Failed calling webhook, failing open
    ... write: broken pipe"): the balancer gave each upstream socket the 2 s connect timeout for its whole
    life, so a kept-alive connection idle for 2 s was torn down, racing the API server's next admission on
    it. A Service keeps it; so must the balancer."""
    balancer = Balancer()
    upstream = EchoReplica()
    balancer.replicas.append(upstream)  # type: ignore[arg-type]
    try:
        wait_for(lambda: balancer._ready, 10, "the balancer to see the replica")
        with socket.create_connection(("127.0.0.1", balancer.port), timeout=10) as connection:
            connection.sendall(b"first")
            assert connection.recv(16) == b"first"
            time.sleep(3)  # idle past the old 2 s
            connection.sendall(b"again")
            assert connection.recv(16) == b"again", "the idle connection was closed"
    finally:
        balancer.close()
        upstream.server.close()
