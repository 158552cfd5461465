"""A warm-up that needs a Secret and a file, on a real API server: `warmup.env[].valueFrom` survives the
CRD's schema (nothing pruned) and reaches the compile container, and a Secret volume is mounted where
`warmup.volumeMounts` says. The warm-up's command fails unless it sees both, so Ready=True shows it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT = 240
# Exit status 7 unless the token came through valueFrom and the CA file through the volume. The file's
# path comes in an environment variable, as a client library reads it.
CHECK = (
    'python -c "import os, sys; '
    "ok = os.environ.get('HF_TOKEN') == 'hf_s3cret' and open(os.environ['CA_FILE']).read() == 'CA-PEM'; "
    'sys.exit(0 if ok else 7)"'
)
ENV = [
    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
    {"name": "CA_FILE", "value": "/etc/model-ca/ca.pem"},
]
VOLUMES = [{"name": "ca", "secret": {"secretName": "model-ca", "items": [{"key": "ca.crt", "path": "ca.pem"}]}}]
MOUNTS = [{"name": "ca", "mountPath": "/etc/model-ca", "readOnly": True}]


def create_private_warm_up(client: KubeClient, ns: str, store_url: str, token: str) -> dict[str, Any]:
    """The Secrets (the token, the CA file) and a CompileCache whose warm-up checks both; the stored object."""
    for name, data in (("hub", {"token": token}), ("model-ca", {"ca.crt": "CA-PEM"})):
        client.post(
            f"/api/v1/namespaces/{ns}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data},
        )
    spec = {
        "image": WORKLOAD_IMAGE,
        "model": {"command": CHECK},
        "storage": {"url": store_url},
        "warmup": {"backoffLimit": 0, "env": ENV, "volumes": VOLUMES, "volumeMounts": MOUNTS},
    }
    return dict(client.post(e2e.cache_path(ns), e2e.compile_cache("private", spec)))


def test_a_warm_up_reads_a_secret_through_value_from_and_a_file_from_a_volume(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    stored = create_private_warm_up(kube_client, ns, redis_server.store_url(), "hf_s3cret")
    assert stored["spec"]["warmup"]["env"] == ENV  # not pruned by the schema
    assert stored["spec"]["warmup"]["volumes"] == VOLUMES

    cache = e2e.wait_condition(kube_client, ns, "private", "Ready", "True", TIMEOUT)
    assert e2e.condition(cache, "Degraded")["status"] == "False"
    (job,) = e2e.jobs_of(kube_client, ns, "private")
    compile_ = job["spec"]["template"]["spec"]["initContainers"][1]
    assert compile_["env"][-2:] == ENV
    assert {"name": "ca", "mountPath": "/etc/model-ca", "readOnly": True} in compile_["volumeMounts"]
    # the operator's own metrics saw it: Ready per cache from the stored status, handler runs timed
    wait_for(
        lambda: operator.sample("compilecache_cache_ready", namespace=ns, cache="private") == 1,
        30,
        "compilecache_cache_ready 1 in /metrics",
    )
    assert operator.sample("compilecache_handler_duration_seconds_count", handler="reconcile") >= 1
    assert operator.sample("compilecache_handler_duration_seconds_count", handler="jobs") >= 1
    assert operator.sample("compilecache_handler_errors_total", error="unexpected") == 0
    assert operator.sample("compilecache_operator_build_info") == 1
    assert operator.sample("process_resident_memory_bytes") > 0


def test_a_warm_up_without_the_secret_value_fails_the_check(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    """The same warm-up with the wrong token: the command's check is real, the warm-up fails."""
    ns = kube_namespace
    create_private_warm_up(kube_client, ns, redis_server.store_url(), "wrong")
    cache = e2e.wait_condition(kube_client, ns, "private", "Ready", "False", TIMEOUT, reason="WarmupFailed")
    assert "exited with code" in e2e.condition(cache, "Degraded")["message"]
    wait_for(
        lambda: (
            operator.sample("compilecache_cache_ready", namespace=ns, cache="private") == 0
            and operator.metrics().count('compilecache_cache_ready{cache="private"') == 1
        ),
        30,
        "compilecache_cache_ready 0 in /metrics",
    )
