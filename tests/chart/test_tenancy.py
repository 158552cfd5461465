"""Multi-tenancy in the rendering: CompileCache rights aggregated into the built-in view/edit/admin roles, and a
namespaced install's webhook selecting only the namespaces it watches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart import Manifest, of_kind, one, template, user_role

pytestmark = pytest.mark.helm

READ = {"get", "list", "watch"}
WRITE = {"create", "update", "patch", "delete", "deletecollection"}


def user_roles(rendered: list[Manifest]) -> dict[str, Manifest]:
    """Aggregation label -> the ClusterRole carrying it."""
    return {label.removeprefix("rbac.authorization.k8s.io/aggregate-to-"): role
            for role in of_kind(rendered, "ClusterRole") if user_role(role)
            for label in role["metadata"]["labels"] if label.startswith("rbac.authorization.k8s.io/aggregate-to-")}


@pytest.mark.parametrize("scenario", ["default", "namespaced", "production"])
def test_view_edit_and_admin_take_in_compilecache_rights(renderings: dict[str, list[Manifest]], scenario: str) -> None:
    roles = user_roles(renderings[scenario])
    assert set(roles) == {"view", "edit", "admin"}
    for aggregated, role in roles.items():
        assert not any(s for b in of_kind(renderings[scenario], "ClusterRoleBinding")
                       if b["roleRef"]["name"] == role["metadata"]["name"] for s in b["subjects"]), \
            "a user role is bound to nobody by the chart"
        granted: dict[str, set[str]] = {}
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["compilecache.io"]
            for resource in rule["resources"]:
                granted.setdefault(resource, set()).update(rule["verbs"])
        if aggregated == "view":
            assert granted == {"compilecaches": READ, "compilecaches/status": READ}
        else:  # edit and admin also hold view's rules through the built-in roles' own aggregation
            assert granted == {"compilecaches": WRITE}
    assert roles["edit"] is roles["admin"]


def test_the_user_roles_can_be_left_out(helm_bin: Path) -> None:
    assert not user_roles(template(helm_bin, set_values=["rbac.aggregateToDefaultRoles=false"]))


def webhook_namespaces(rendered: list[Manifest]) -> tuple[list[str], list[str]]:
    """(namespaces selected with In, namespaces excluded with NotIn) of the pod webhook's namespaceSelector."""
    (hook,) = one(rendered, "MutatingWebhookConfiguration")["webhooks"]
    expressions = [e for e in hook["namespaceSelector"]["matchExpressions"]
                   if e["key"] == "kubernetes.io/metadata.name"]
    selected = [v for e in expressions if e["operator"] == "In" for v in e["values"]]
    excluded = [v for e in expressions if e["operator"] == "NotIn" for v in e["values"]]
    return selected, excluded


def test_a_namespaced_install_sees_only_its_namespaces(renderings: dict[str, list[Manifest]]) -> None:
    selected, excluded = webhook_namespaces(renderings["namespaced"])
    watched = [a.removeprefix("--namespace=") for a in one(renderings["namespaced"], "Deployment")["spec"]["template"][
        "spec"]["containers"][0]["args"] if a.startswith("--namespace=")]
    assert selected == watched and watched
    assert "kube-system" in excluded
    assert webhook_namespaces(renderings["default"])[0] == [], "a cluster-wide install selects every namespace"
