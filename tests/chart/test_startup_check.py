"""The post-install/post-upgrade hook that waits for the CompileCache webhook (as cert-manager's startupapicheck):
what it renders, as whom it runs and where its dry-run goes. tests/e2e/test_chart_first_sync.py installs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart import NAMESPACE, Manifest, hook, of_kind, template
from tests.operator.restricted import restricted_violations

pytestmark = pytest.mark.helm


def check_objects(rendered: list[Manifest]) -> list[Manifest]:
    return [m for m in rendered if m["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "startupcheck"]


def test_the_hook_dry_runs_a_compile_cache_as_an_account_that_may_do_nothing_else(
    renderings: dict[str, list[Manifest]],
) -> None:
    objects = check_objects(renderings["default"])
    assert sorted(m["kind"] for m in objects) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    assert all(hook(m) and m["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade" for m in objects)
    weights = {m["kind"]: int(m["metadata"]["annotations"]["helm.sh/hook-weight"]) for m in objects}
    assert weights["ServiceAccount"] < weights["RoleBinding"] < weights["Job"]  # the account exists before the Job
    (role,) = of_kind(objects, "Role")
    assert role["rules"] == [{"apiGroups": ["compilecache.io"], "resources": ["compilecaches"], "verbs": ["create"]}]
    (job,) = of_kind(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert container["command"] == ["python", "-m", "compilecache_operator.startupcheck"]
    assert f"--namespace={NAMESPACE}" in container["args"] and role["metadata"]["namespace"] == NAMESPACE
    assert pod["serviceAccountName"] == of_kind(objects, "ServiceAccount")[0]["metadata"]["name"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 300


def test_a_namespaced_release_checks_in_its_first_watched_namespace(renderings: dict[str, list[Manifest]]) -> None:
    objects = check_objects(renderings["namespaced"])
    (role,) = of_kind(objects, "Role")
    (job,) = of_kind(objects, "Job")
    assert role["metadata"]["namespace"] == "ml-team"  # ci/namespaced-values.yaml's first
    assert "--namespace=ml-team" in job["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("off", ["startupCheck.enabled=false", "confinement.admissionPolicy.enabled=false",
                                 "webhook.enabled=false"])
def test_without_the_webhook_or_the_hook_nothing_is_rendered(helm_bin: Path, off: str) -> None:
    assert not check_objects(template(helm_bin, set_values=[off]))
