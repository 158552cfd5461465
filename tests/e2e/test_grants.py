"""A new team's store, granted by a ConfigMap in the operator's namespace (no change of the operator's flags):
a CompileCache outside the operator's allow-list is InvalidSpec; a ConfigMap labelled compilecache.io/allow
granting its namespace that store turns it valid (a warm-up Job is created) without any change to the cache;
deleting the ConfigMap makes it InvalidSpec again. With the check at admission on, a store outside every grant
is refused at create with the operator's message, and one granted a moment before is admitted and warms."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.model.formats import DEFAULT_NODE_CACHE_ROOTS

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def operator_namespace(namespace_factory: Callable[[str | None], str]) -> str:
    return namespace_factory("restricted")


CONFINED = ("--allowed-store-hosts", "redis.shared.invalid", "--allowed-store-secrets", "",
            "--allowed-node-cache-paths", ",".join(DEFAULT_NODE_CACHE_ROOTS))


def confined(kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, operator_namespace: str,
             workdir: Path, *extra: str) -> Iterator[e2e.OperatorProcess]:
    """The operator confined to a store no test uses."""
    process = e2e.OperatorProcess(kube_cluster.kubeconfig, kube_namespace, workdir,
                              "--operator-namespace", operator_namespace, *CONFINED, *extra)
    process.start(kube_client)
    try:
        yield process
    finally:
        process.stop()
        process.delete_webhook_config(kube_client)


@pytest.fixture
def confined_operator(kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str,
                      operator_namespace: str, crd: None, tmp_path: Path) -> Iterator[e2e.OperatorProcess]:
    yield from confined(kube_cluster, kube_client, kube_namespace, operator_namespace, tmp_path / "operator")


@pytest.fixture
def checking_operator(kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str,
                      operator_namespace: str, crd: None, tmp_path: Path) -> Iterator[e2e.OperatorProcess]:
    """The confined operator checking CompileCaches at admission too (its managed validating webhook)."""
    processes = confined(kube_cluster, kube_client, kube_namespace, operator_namespace, tmp_path / "operator",
                         "--check-caches-at-admission")
    process = next(processes)
    try:
        wait_for(lambda: process.checks_caches(kube_client), 60, "the managed validating webhook")
        yield process
    finally:
        processes.close()


def ready_reason(client: KubeClient, namespace: str) -> str:
    return str(e2e.condition(client.get(e2e.cache_path(namespace, "team")), "Ready").get("reason", ""))


def test_a_grant_configmap_admits_a_new_teams_store_and_its_removal_refuses_it_again(
    confined_operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, operator_namespace: str,
    redis_server: RedisServer,
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("team", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
    wait_for(lambda: ready_reason(kube_client, ns) == "InvalidSpec", 60, "InvalidSpec: not on the allow-list")
    assert "allow-list" in e2e.condition(kube_client.get(e2e.cache_path(ns, "team")), "Ready")["message"]
    assert e2e.jobs_of(kube_client, ns, "team") == []

    grant: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "team-stores", "labels": {"compilecache.io/allow": "true"}},
                             "data": {"namespaces": ns, "storeHosts": f"{redis_server.host}:{redis_server.port}"}}
    kube_client.post(f"/api/v1/namespaces/{operator_namespace}/configmaps", grant)
    wait_for(lambda: ready_reason(kube_client, ns) not in ("", "InvalidSpec"), 60, "the grant to reach the cache")
    wait_for(lambda: e2e.jobs_of(kube_client, ns, "team"), 60, "a warm-up Job")

    kube_client.delete(f"/api/v1/namespaces/{operator_namespace}/configmaps/team-stores")
    wait_for(lambda: ready_reason(kube_client, ns) == "InvalidSpec", 60, "InvalidSpec once the grant is gone")
    log = confined_operator.log_tail(limit=10_000_000)
    assert f"grants now: ConfigMap {operator_namespace}/team-stores -> {ns}" in log and "grants now: none" in log


def test_at_admission_a_store_outside_every_grant_is_refused_and_one_granted_a_moment_ago_admitted(
    checking_operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, operator_namespace: str,
    redis_server: RedisServer,
) -> None:
    ns = kube_namespace
    store = f"{redis_server.host}:{redis_server.port}"
    cache = e2e.compile_cache("team", {"image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"},
                                   "storage": {"url": redis_server.store_url()}})
    with pytest.raises(KubeAPIError) as refused:
        kube_client.post(e2e.cache_path(ns), cache)
    assert refused.value.status == 422, refused.value
    assert f"spec.storage.url: store {store} is not on the operator's allow-list (redis.shared.invalid" in str(
        refused.value)

    grant: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "team-stores", "labels": {"compilecache.io/allow": "true"}},
                             "data": {"namespaces": ns, "storeHosts": store}}
    kube_client.post(f"/api/v1/namespaces/{operator_namespace}/configmaps", grant)
    kube_client.post(e2e.cache_path(ns), cache)  # at once: the operator reads the grants again before refusing
    wait_for(lambda: e2e.jobs_of(kube_client, ns, "team"), 60, "a warm-up Job")
    assert ready_reason(kube_client, ns) != "InvalidSpec"
