"""Every Secret a warm-up can reach, on the real node, with a Secret outside the cluster admin's lists (``team-db``)
and one on them (``hub``): ``warmup.env[].valueFrom.secretKeyRef``, a ``warmup.volumes[].secret``,
``warmup.imagePullSecrets`` and the ServiceAccount's API token (``warmup.automountServiceAccountToken``).

- Applied while no admission check runs (the operator as a host process without ``--check-caches-at-admission``,
  as for a spec stored before the lists changed): each is InvalidSpec at reconcile, its field named in the
  condition and a Warning event, and no Job is created.
- With the operator's validating webhook: the API server refuses each at create, naming the field; what the CRD
  does not offer (``envFrom``, a ``projected`` volume with a Secret or a ``serviceAccountToken``) never reaches
  the operator at all.
- The allowed Secret still reaches the warm-up: its compile command prints a hash of it and fails unless it
  came, and finds no API token mounted.
- The refused Secret's value is in no pod log, status, event or operator log.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.e2e.operator_on_node import kubectl
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WARM_UP_TIMEOUT = 240
HUB = {"name": "HUB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}
TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# Prints the sha256 of the allowed Secret's value (never the value); exit status 7 without it, 8 with an API token.
CHECK = (
    'python -c "import hashlib, os, sys; token = os.environ.get(\'HUB_TOKEN\', \'\'); '
    "print('hub token sha256', hashlib.sha256(token.encode()).hexdigest()); "
    f"sys.exit(7 if not token else 8 if os.path.exists('{TOKEN_FILE}') else 0)\""
)
# (name, spec.warmup, the field the refusal names)
PATHS: list[tuple[str, dict[str, Any], str]] = [
    ("env", {"env": [HUB, {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "team-db", "key": "password"}}}]},
     "spec.warmup.env[1].valueFrom.secretKeyRef.name: Secret 'team-db' is not allowed for warm-ups to read"),
    ("volume", {"volumes": [{"name": "db", "secret": {"secretName": "team-db"}}],
                "volumeMounts": [{"name": "db", "mountPath": "/etc/db", "readOnly": True}]},
     "spec.warmup.volumes[0].secret.secretName: Secret 'team-db' is not allowed for warm-ups to read"),
    ("pull", {"imagePullSecrets": [{"name": "team-db"}]},
     "spec.warmup.imagePullSecrets[0].name: Secret 'team-db' is not allowed as an image pull Secret of warm-ups"),
    ("token", {"automountServiceAccountToken": True},
     "spec.warmup.automountServiceAccountToken: the API token of ServiceAccount 'default' is not allowed"),
]


def spec_of(store_url: str, warmup: dict[str, Any]) -> dict[str, Any]:
    return {"image": WORKLOAD_IMAGE, "model": {"command": CHECK}, "storage": {"url": store_url},
            "warmup": {"backoffLimit": 0, **warmup}}


def flags(redis: RedisServer) -> tuple[str, ...]:
    return ("--allowed-store-hosts", f"{redis.host}:{redis.port}", "--allowed-store-secrets", "",
            "--allowed-warmup-secrets", "hub", "--allowed-warmup-pull-secrets", "",
            "--allowed-warmup-service-account-tokens", "")


def test_every_secret_path_is_refused_unless_allowed_and_the_value_shows_nowhere(
    start_operator: Callable[..., e2e.OperatorProcess], kube_client: KubeClient, kube_namespace: str,
    kube_cluster: LocalCluster, redis_server: RedisServer,
) -> None:
    ns = kube_namespace
    db_password, hub_token = f"pw-{secrets.token_hex(12)}", f"hf_{secrets.token_hex(12)}"
    for name, data in (("team-db", {"password": db_password}), ("hub", {"token": hub_token})):
        kube_client.post(f"/api/v1/namespaces/{ns}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data})
    store_url = redis_server.store_url()

    # 1. no admission check: each spec is stored, and refused when reconciled, before any Job
    unchecked = start_operator(*flags(redis_server))
    for name, warmup, _ in PATHS:
        kube_client.post(e2e.cache_path(ns, ""), e2e.compile_cache(f"stored-{name}", spec_of(store_url, warmup)))
    kube_client.post(e2e.cache_path(ns, ""), e2e.compile_cache("allowed", spec_of(store_url, {"env": [HUB]})))
    for name, _, named in PATHS:
        cache = e2e.wait_condition(kube_client, ns, f"stored-{name}", "Ready", "False", 60, reason="InvalidSpec")
        assert named in e2e.condition(cache, "Ready")["message"], e2e.condition(cache, "Ready")
        wait_for(lambda n=name: [e for e in events(kube_client, ns) if e["involvedObject"]["name"] == f"stored-{n}"
                                 and e["type"] == "Warning" and e["reason"] == "InvalidSpec"],
                 30, f"the InvalidSpec event of stored-{name}")

    # the allowed Secret reaches the compile command; no API token is mounted there
    e2e.wait_condition(kube_client, ns, "allowed", "Ready", "True", WARM_UP_TIMEOUT)
    (job,) = e2e.jobs_of(kube_client, ns, "allowed")
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    log = kubectl(kube_cluster, "logs", "-n", ns, f"job/{job['metadata']['name']}", "-c", "compile")
    assert f"hub token sha256 {hashlib.sha256(hub_token.encode()).hexdigest()}" in log, log
    time.sleep(4)  # more resyncs (every 3 s): still no Job for a refused cache
    for name, _, _ in PATHS:
        assert e2e.jobs_of(kube_client, ns, f"stored-{name}") == [], name

    # 2. the operator's validating webhook: the API server refuses each at create, naming the field
    checked = start_operator(*flags(redis_server), "--check-caches-at-admission")
    probes = itertools.count()

    def in_force() -> bool:
        try:
            kube_client.post(e2e.cache_path(ns, ""), e2e.compile_cache(f"probe-{next(probes)}",
                                                               spec_of(store_url, PATHS[0][1])))
        except KubeAPIError as refused:
            return "not allowed for warm-ups to read" in str(refused)
        return False

    wait_for(in_force, 60, "the admission check to be in force")
    for name, warmup, named in PATHS:
        with pytest.raises(KubeAPIError) as caught:
            kube_client.post(e2e.cache_path(ns, ""), e2e.compile_cache(f"admitted-{name}", spec_of(store_url, warmup)))
        assert caught.value.status in (403, 422) and named in str(caught.value), str(caught.value)
    # what the CRD does not offer: envFrom is dropped by the schema, a projected volume is refused by it
    env_from = e2e.compile_cache("env-from", spec_of(store_url, {
        "env": [HUB], "envFrom": [{"secretRef": {"name": "team-db"}}]}))
    offered = kube_client.request("POST", e2e.cache_path(ns, ""), body=env_from, query={"dryRun": "All"})
    assert "envFrom" not in offered["spec"]["warmup"] and offered["spec"]["warmup"]["env"] == [HUB]
    for source in ({"secret": {"name": "team-db"}}, {"serviceAccountToken": {"path": "token"}}):
        with pytest.raises(KubeAPIError) as projected:
            kube_client.post(e2e.cache_path(ns, ""), e2e.compile_cache("projected", spec_of(store_url, {
                "volumes": [{"name": "p", "projected": {"sources": [source]}}]})))
        assert projected.value.status == 422 and "spec.warmup.volumes[0]" in str(projected.value)

    # 3. the refused Secret's value: in no pod log, status, event or operator log
    shown = [kubectl(kube_cluster, "logs", "-n", ns, pod["metadata"]["name"], "--all-containers")
             for pod in kube_client.get(f"/api/v1/namespaces/{ns}/pods")["items"]]
    shown += [json.dumps(c.get("status")) for c in kube_client.get(e2e.cache_path(ns, ""))["items"]]
    shown += [json.dumps(e) for e in events(kube_client, ns)]
    shown += [p.log_path.read_text(errors="replace") for p in (unchecked, checked)]
    assert shown and not [text[:200] for text in shown if db_password in text]
    assert not [text[:200] for text in shown if hub_token in text], "the allowed one is printed only as a hash"


def events(client: KubeClient, namespace: str) -> list[dict[str, Any]]:
    return list(client.get(f"/api/v1/namespaces/{namespace}/events")["items"])
