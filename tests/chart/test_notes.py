"""The NOTES helm prints after an install: the first CompileCache it shows goes into a namespace the operator
handles and whose pods the webhook sees, for cluster-wide and namespaced installs alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart.chart import CHART_DIR, NAMESPACE, RELEASE, helm

EXCLUDED_ALWAYS = ("kube-system", NAMESPACE, "kube-public", "kube-node-lease")


def notes(helm_bin: Path, *set_values: str) -> str:
    """What ``helm install`` prints under NOTES (a client-side dry run: no cluster)."""
    args = ["install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, "--dry-run=client"]
    for item in set_values:
        args += ["--set", item]
    out = helm(helm_bin, *args).stdout
    return out.split("\nNOTES:\n", 1)[1]


def namespaces_used(text: str) -> set[str]:
    """The namespaces the NOTES' first CompileCache is applied to and looked at in (step 2)."""
    step = text.split("\n2. ", 1)[1].split("\n3. ", 1)[0]
    return set(re.findall(r"kubectl (?:apply|get|describe) .*?-n (\S+)", step))


@pytest.mark.helm
@pytest.mark.parametrize("watched", [
    (), ("ml-team",), ("ml-team", "ml-research"), (NAMESPACE, "ml-team"), ("kube-public", "team-b", "team-c"),
], ids=lambda w: ",".join(w) or "cluster-wide")
def test_the_first_compilecache_goes_where_the_operator_and_the_webhook_look(helm_bin: Path,
                                                                            watched: tuple[str, ...]) -> None:
    set_values = [f"operator.watchNamespaces={{{','.join(watched)}}}"] if watched else []
    used = namespaces_used(notes(helm_bin, *set_values))
    assert len(used) == 1, used
    (namespace,) = used
    assert namespace not in EXCLUDED_ALWAYS, f"the webhook never sees pods of {namespace}"
    if watched:
        assert namespace in watched, f"{namespace} is not one of the watched namespaces {watched}"


@pytest.mark.helm
def test_only_excluded_namespaces_watched_leaves_the_namespace_to_the_reader(helm_bin: Path) -> None:
    used = namespaces_used(notes(helm_bin, f"operator.watchNamespaces={{{NAMESPACE}}}"))
    assert used == {"<namespace>"}, used


def test_a_monitoring_object_enabled_but_not_served_is_said(helm_bin: Path) -> None:
    """A client-side dry run serves no prometheus-operator API: each enabled monitoring object is named as not
    installed, with what to do; a disabled one is not mentioned."""
    text = notes(helm_bin, "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
    for kind in ("ServiceMonitor", "PodMonitor"):
        assert re.search(rf"WARNING: metrics\.\w+\.enabled is true, but this cluster does not serve\s+"
                         rf"monitoring\.coreos\.com/v1 {kind}", text), text
    assert "PrometheusRule" not in text and "WARNING: metrics" not in notes(helm_bin)


def test_a_write_policy_the_cluster_cannot_enforce_is_said(helm_bin: Path) -> None:
    """rbac.confineWrites where no ValidatingAdmissionPolicy is served (a client-side dry run serves none): the NOTES
    say the operator's account has its RBAC only; turned off, nothing is said."""
    assert re.search(r"WARNING: rbac\.confineWrites is true, but this cluster serves no ValidatingAdmissionPolicy",
                     notes(helm_bin))
    assert "confineWrites" not in notes(helm_bin, "rbac.confineWrites=false")
