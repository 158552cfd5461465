"""A new team's store, granted by a ConfigMap in the operator's namespace (no change of the operator's flags):
a CompileCache outside the operator's allow-list is InvalidSpec; a ConfigMap labelled compilecache.io/allow
granting its namespace that store turns it valid (a warm-up Job is created) without any change to the cache;
deleting the ConfigMap makes it InvalidSpec again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.formats import DEFAULT_NODE_CACHE_ROOTS

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.operator.e2e_support import OperatorProcess, cache_path, compile_cache, condition, crd, jobs_of
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

__all__ = ["crd"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def operator_namespace(namespace_factory: Callable[[str | None], str]) -> str:
    return namespace_factory("restricted")


@pytest.fixture
def confined_operator(kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str,
                      operator_namespace: str, crd: None, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube_cluster.kubeconfig, kube_namespace, tmp_path / "operator",
                              "--operator-namespace", operator_namespace,
                              "--allowed-store-hosts", "redis.shared.invalid", "--allowed-store-secrets", "",
                              "--allowed-node-cache-paths", ",".join(DEFAULT_NODE_CACHE_ROOTS))
    process.start(kube_client)
    try:
        yield process
    finally:
        process.stop()
        process.delete_webhook_config(kube_client)


def ready_reason(client: KubeClient, namespace: str) -> str:
    return str(condition(client.get(cache_path(namespace, "team")), "Ready").get("reason", ""))


def test_a_grant_configmap_admits_a_new_teams_store_and_its_removal_refuses_it_again(
    confined_operator: OperatorProcess, kube_client: KubeClient, kube_namespace: str, operator_namespace: str,
    redis_server: RedisServer,
) -> None:
    ns = kube_namespace
    kube_client.post(cache_path(ns), compile_cache("team", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()}}))
    wait_for(lambda: ready_reason(kube_client, ns) == "InvalidSpec", 60, "InvalidSpec: not on the allow-list")
    assert "allow-list" in condition(kube_client.get(cache_path(ns, "team")), "Ready")["message"]
    assert jobs_of(kube_client, ns, "team") == []

    grant: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "team-stores", "labels": {"compilecache.io/allow": "true"}},
                             "data": {"namespaces": ns, "storeHosts": f"{redis_server.host}:{redis_server.port}"}}
    kube_client.post(f"/api/v1/namespaces/{operator_namespace}/configmaps", grant)
    wait_for(lambda: ready_reason(kube_client, ns) not in ("", "InvalidSpec"), 60, "the grant to reach the cache")
    wait_for(lambda: jobs_of(kube_client, ns, "team"), 60, "a warm-up Job")

    kube_client.delete(f"/api/v1/namespaces/{operator_namespace}/configmaps/team-stores")
    wait_for(lambda: ready_reason(kube_client, ns) == "InvalidSpec", 60, "InvalidSpec once the grant is gone")
    log = confined_operator.log_tail(limit=10_000_000)
    assert f"grants now: ConfigMap {operator_namespace}/team-stores -> {ns}" in log and "grants now: none" in log
