"""Multi-tenancy on the real API server: people bound to the built-in view/edit/admin roles in a namespace
manage its CompileCaches (the chart's aggregated ClusterRoles), and a namespaced install's webhook is never
called for pods of other namespaces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.chart.e2e_fixtures import CC_API, Release
from tests.e2e.chart_releases import allowed
from tests.infra.podspec import restricted
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CACHE: dict[str, Any] = {
    "apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": "team-model"},
    "spec": {"image": "example/app:1", "model": {"target": "tiny_mlp"},
             "storage": {"url": "redis://redis.compilecache.svc:6379/0"}}}


def bind(client: KubeClient, namespace: str, user: str, cluster_role: str) -> None:
    client.post(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


def labelled_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "app-", "labels": {"compilecache.io/cache": CACHE["metadata"]["name"]}},
            "spec": restricted({"containers": [{"name": "app", "image": "registry.invalid/app:1"}]})}


def test_namespace_people_and_pods_of_a_namespaced_install(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str,
    namespace_factory: Callable[[str | None], str], install: Callable[..., Release],
) -> None:
    ns, other = kube_namespace, namespace_factory("restricted")
    install("--set", f"operator.watchNamespaces={{{ns}}}", "--set", f"rbac.secretNamespaces={{{ns}}}",
            "--set", "webhook.failurePolicy=Fail", "--set", f"storage.url={CACHE['spec']['storage']['url']}",
            # No operator runs here: CompileCaches are not sent to a check nobody answers (tests/e2e/test_security.py).
            "--set", "confinement.admissionPolicy.enabled=false")
    caches = f"{CC_API}/namespaces/{ns}/compilecaches"
    people = {}
    for role in ("view", "edit", "admin"):
        bind(kube_client, ns, f"{role}-person", role)
        people[role] = kube_cluster.client(user=f"{role}-person")
    try:
        # The built-in roles take the chart's rules in (the aggregation controller): wait until they have.
        wait_for(lambda: all(allowed(c, "GET", caches) for c in people.values()), 60,
                 "the built-in roles to aggregate the CompileCache rules")
        for role, client in people.items():
            assert allowed(client, "GET", f"{caches}/team-model"), role
            writes = role != "view"
            assert allowed(client, "POST", caches, CACHE) == writes, role
            assert allowed(client, "PATCH", f"{caches}/team-model", {"metadata": {"labels": {"a": "b"}}}) == writes
            assert allowed(client, "DELETE", f"{caches}/team-model") == writes, role
            assert not allowed(client, "GET", f"{CC_API}/namespaces/{other}/compilecaches"), role
        people["edit"].post(caches, CACHE)  # for real: the person's own CompileCache
        assert [c["metadata"]["name"] for c in people["view"].get(caches)["items"]] == ["team-model"]
    finally:
        for client in people.values():
            client.close()

    # No operator runs (failurePolicy Fail): a labelled pod of a watched namespace is refused by the unreachable
    # webhook, one of another namespace never reaches it and is admitted.
    with pytest.raises(KubeAPIError) as refused:
        kube_client.post(f"/api/v1/namespaces/{ns}/pods", labelled_pod())
    assert "inject.pods.compilecache.io" in refused.value.body
    admitted = kube_client.post(f"/api/v1/namespaces/{other}/pods", labelled_pod())
    assert admitted["metadata"]["namespace"] == other
