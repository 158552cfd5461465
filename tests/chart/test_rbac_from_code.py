"""The operator's RBAC is what its code uses, no more and no less: every Kubernetes API call in
``operator/compilecache_operator`` is read from the source (the method and the path it is made on, through
the path builders and module constants), every resource Kopf watches for it is read from Kopf's registry, every
resource the operator's own watches list and watch from :mod:`compilecache_operator.controller.watches`, and
the verbs they come to are compared with the rules the chart grants, in both of its modes (cluster-wide, and
watching listed namespaces). A call added without its grant, or a grant left without its call, fails here.
docs/install.md's table of grants is checked against the same rendering (tests/chart/test_install_docs.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from tests.chart.chart import Manifest, rbac_rules
from tests.chart.verbs_from_code import (
    api_calls,
    used_verbs,
    verb_of,
)

# -- reading the calls from the source ----------------------------------------------------------------------


def granted_verbs(rendered: Iterable[Manifest]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for _, rule in rbac_rules(rendered):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


# -- the tests -----------------------------------------------------------------------------------------------
def test_every_api_call_of_the_operator_is_read_to_a_resource() -> None:
    """The reader itself: it finds the calls it must (one of each kind), and none stays unknown."""
    calls = api_calls()
    assert len(calls) > 20
    seen = {(verb_of(c) or (("", ""), ""))[1] for c in calls}
    assert seen >= {"get", "list", "create", "update", "patch", "delete"}
    unknown = [c for c in calls if verb_of(c) is None and c.path != "/version"]
    assert not unknown, unknown
    by_path = {(c.method, c.path) for c in calls}
    assert ("PATCH", "/apis/compilecache.io/v1alpha1/namespaces/{}/compilecaches/{}/status") in by_path
    assert ("PATCH", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{}") in by_path


@pytest.mark.parametrize("scenario", ["default", "namespaced"])
def test_the_chart_grants_exactly_the_verbs_the_code_uses(renderings: dict[str, list[Manifest]], scenario: str) -> None:
    used = used_verbs()
    granted = granted_verbs(renderings[scenario])
    missing = {k: sorted(v - granted.get(k, set())) for k, v in used.items() if v - granted.get(k, set())}
    unused = {k: sorted(v - used.get(k, set())) for k, v in granted.items() if v - used.get(k, set())}
    assert not missing, f"{scenario}: the operator makes calls the chart does not grant: {missing}"
    assert not unused, f"{scenario}: the chart grants verbs no code of the operator uses: {unused}"
