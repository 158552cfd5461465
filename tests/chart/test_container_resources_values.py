"""The chart's containerResources values: the operator's built-in defaults, passed to it as flags it accepts,
and refused by the values schema when a quantity is not one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from compilecache_operator import main

from tests.chart.chart import CHART_DIR, Manifest, helm, operator_container, template

pytestmark = pytest.mark.helm

FLAGS = {"warmup": "--warmup-resources", "warmupHelpers": "--warmup-helper-resources", "preload": "--preload-resources"}


def test_the_defaults_are_the_operators_own_and_reach_it_as_flags(helm_bin: Path) -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["containerResources"]
    args = operator_container(template(helm_bin))["args"]
    given = [a for a in args if a.split("=", 1)[0] in FLAGS.values()]
    assert len(given) == len(FLAGS), args
    settings = main.settings_from(main.parse_args([*given, "--webhook-config", "off"])).defaults
    built_in = {flag: default.to_dict() for flag, _, default in main.RESOURCE_SETTINGS}
    for key, flag in FLAGS.items():
        assert built_in[flag.removeprefix("--")] == values[key], key  # one set of numbers, the operator's
    assert settings.warmup_resources.to_dict() == values["warmup"]
    assert settings.helper_resources.to_dict() == values["warmupHelpers"]
    assert settings.preload_resources.to_dict() == values["preload"]


def test_a_value_set_at_install_reaches_the_operator(helm_bin: Path) -> None:
    args = operator_container(template(helm_bin, set_values=["containerResources.preload.limits.memory=1Gi"]))["args"]
    flag = next(a for a in args if a.startswith("--preload-resources="))
    settings = main.settings_from(main.parse_args([flag, "--webhook-config", "off"])).defaults
    assert settings.preload_resources.limits == {"cpu": "1", "memory": "1Gi"}


@pytest.mark.parametrize("bad", ["containerResources.preload.limits.memory=lots",
                                 "containerResources.warmup.limit.cpu=1"])
def test_the_schema_refuses_what_is_not_a_quantity(helm_bin: Path, bad: str) -> None:
    proc = helm(helm_bin, "lint", str(CHART_DIR), "--set", bad, check=False)
    assert proc.returncode != 0
    assert "containerResources" in proc.stdout + proc.stderr


def pod_containers(manifests: list[Manifest]) -> list[tuple[str, Manifest]]:
    """(object/container, container) for every container and init container of every pod the chart renders."""
    out = []
    for m in manifests:
        if m["kind"] not in ("Deployment", "Job", "Pod"):
            continue
        spec = m["spec"] if m["kind"] == "Pod" else m["spec"]["template"]["spec"]
        out += [(f"{m['kind']}/{m['metadata']['name']}/{c['name']}", c)
                for c in [*spec.get("initContainers", []), *spec["containers"]]]
    return out


@pytest.mark.parametrize("scenario", ["default", "production"])
def test_the_charts_own_pods_pass_a_policy_that_requires_cpu_and_memory_limits(helm_bin: Path, scenario: str) -> None:
    """Every container the chart itself renders has cpu and memory requests and limits by default (a values file
    that sets only a memory limit keeps the default CPU limit: helm merges the maps); operator.resources.limits.cpu
    set to null removes the operator's CPU limit."""
    values = None if scenario == "default" else CHART_DIR / "ci" / f"{scenario}-values.yaml"
    for name, c in pod_containers(template(helm_bin, values)):
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), name
    unlimited = operator_container(template(helm_bin, values, set_values=["operator.resources.limits.cpu=null"]))
    assert set(unlimited["resources"]["limits"]) == {"memory"}
    text = (CHART_DIR.parent.parent / "docs" / "install.md").read_text()
    assert "operator.resources.limits.cpu=null" in text, "docs/install.md does not say how to remove the CPU limit"
