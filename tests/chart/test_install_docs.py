"""docs/install.md says what the chart and its tests do: the scrape settings it states are the values' defaults,
the chart's own tests name every linter and both Kubernetes versions they check against, and the install from a
release uses the chart package scripts/release.py writes."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cachelib import __version__
from tests.chart.chart import CHART_DIR, helm, of_kind, parse_manifests, template
from tests.infra.linters import TOOLS
from testsupport.kube.cluster import versions

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "docs" / "install.md"


def section(title: str) -> str:
    """The text of docs/install.md's ``## title`` section, up to the next ``## ``."""
    text = INSTALL.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def stated_settings(text: str, key: str) -> list[str]:
    """Every ``key: value`` the text states in code spans, e.g. `honorLabels: true`."""
    return re.findall(rf"`{re.escape(key)}: (\w+)`", text)


def test_the_service_monitor_settings_stated_are_the_defaults() -> None:
    monitor = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["metrics"]["serviceMonitor"]
    text = section("Monitoring")
    stated = stated_settings(text, "honorLabels")
    assert stated, "the Monitoring section does not say how the ServiceMonitor treats the metrics' labels"
    assert set(stated) == {str(monitor["honorLabels"]).lower()}, stated
    for knob in ("honorLabels", "relabelings", "metricRelabelings"):
        assert f"metrics.serviceMonitor.{knob}" in text, f"the Monitoring section does not name {knob}"


def test_the_chart_tests_section_names_every_linter_and_both_kubernetes_versions() -> None:
    text = section("The chart's own tests")
    missing = [tool.name for tool in TOOLS if tool.name not in text]
    assert not missing, f"docs/install.md does not say the chart tests run {missing}"
    for name in ("KUBE_VERSION", "KUBE_OLDEST_VERSION"):
        minor = ".".join(versions()[name].split(".")[:2])
        assert re.search(rf"\b{re.escape(minor)}\b", text), f"the chart tests' Kubernetes {minor} is not named"
    assert "structurally" not in text, "other projects' CRDs are validated against their schemas, not structurally"


def test_the_install_from_a_release_uses_the_package_release_py_writes() -> None:
    text = section("Install from a release")
    package = f"compilecache-operator-{__version__}.tgz"
    commands = re.findall(r"^helm install .*$", text, re.M)
    assert commands and all(package in c or "oci://" in c for c in commands), commands
    assert any(package in c for c in commands), f"no helm install of {package}"
    for name in ("operator", "preloader"):
        assert f"compilecache-{name}-{__version__}.tar" in text, f"the {name} image tarball is not named"


def install_command(text: str) -> list[str]:
    """The section's ``helm install`` of the package, its continuation lines joined, as argv."""
    (command,) = [c for c in re.findall(r"^(helm install (?:.*\\\n)*.*)$", text, re.M) if ".tgz" in c]
    return shlex.split(command.replace("\\\n", " "))


@pytest.mark.helm
def test_the_documented_install_from_a_release_renders_the_released_images(helm_bin: Path, tmp_path: Path) -> None:
    """scripts/release.py makes the package; the section's own install command, as ``helm template``, renders it
    with the images taken from the registry the section names."""
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/release.py"), "--dist", str(dist), "--no-images",
                           "--no-sbom", "--helm", str(helm_bin)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = section("Install from a release")
    (registry,) = re.findall(r"^REGISTRY=(\S+)", text, re.M)
    argv = [arg.replace("$REGISTRY", registry) for arg in install_command(text)]
    assert argv[:2] == ["helm", "install"]
    argv = [str(tmp_path / arg) if arg.startswith("dist/") else arg for arg in argv[2:]]
    manifests = parse_manifests(helm(helm_bin, "template", *argv).stdout)
    images = {c["image"] for m in of_kind(manifests, "Deployment")
              for c in m["spec"]["template"]["spec"]["containers"]}
    assert images == {f"{registry}/operator:{__version__}"}, images
    (deployment,) = of_kind(manifests, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--preloader-image={registry}/preloader:{__version__}" in args, args


NETWORK_POLICY_PEERS = {  # knob -> (direction, port of the rule it fills, "from" or "to")
    "webhookFrom": ("ingress", "webhook", "from"),
    "metricsFrom": ("ingress", "metrics", "from"),
    "dnsTo": ("egress", "dns", "to"),
    "apiServer.to": ("egress", "apiServer", "to"),
}


@pytest.mark.helm
def test_the_network_policy_section_says_what_each_peer_list_allows_by_default(helm_bin: Path) -> None:
    """Each peer list's parenthesis in the NetworkPolicy section says what the default render allows: "any" where
    the rendered rule names no peers, else the peers' namespace."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    ports = {"webhook": values["webhook"]["port"], "metrics": values["metrics"]["port"], "dns": 53,
             "apiServer": values["networkPolicy"]["apiServer"]["ports"][0]}
    (policy,) = of_kind(template(helm_bin, set_values=["networkPolicy.enabled=true"]), "NetworkPolicy")
    text = " ".join(section("NetworkPolicy").split())
    for knob, (direction, port, side) in NETWORK_POLICY_PEERS.items():
        (rule,) = [r for r in policy["spec"][direction] if any(p["port"] == ports[port] for p in r["ports"])]
        said = re.search(rf"\(`(?:networkPolicy\.)?{re.escape(knob)}`([^)]*)\)", text)
        assert said, f"the NetworkPolicy section does not say what {knob} allows"
        peers = rule.get(side)
        if not peers:
            assert re.search(r"\bany\b", said.group(1)), f"{knob}: the default allows any peer; docs: {said[0]!r}"
        else:
            names = {v for peer in peers for v in peer.get("namespaceSelector", {}).get("matchLabels", {}).values()}
            assert names and all(n in said.group(1) for n in names), f"{knob}: rendered {peers}; docs {said[0]!r}"


def table_grants(text: str) -> set[tuple[str, frozenset[str], bool]]:
    """(resource, verbs, by name) of each row of the RBAC table in the section ``text``."""
    out: set[tuple[str, frozenset[str], bool]] = set()
    for row in re.findall(r"^\s*\| (`[a-z/]+`(?:, `[a-z/]+`)*) \| ((?:`[a-z]+` ?)+) \| ([^|]+) \|", text, re.M):
        resources, verbs, where = row
        for resource in re.findall(r"`([a-z/]+)`", resources):
            out.add((resource, frozenset(re.findall(r"`([a-z]+)`", verbs)), "by name" in where))
    return out


def test_the_rbac_table_is_what_the_chart_grants(renderings: dict[str, list[dict[str, object]]]) -> None:
    """Every rule the chart grants the operator (cluster-wide and namespaced) is a row of docs/install.md's table,
    and every row is a rule it grants."""
    from tests.chart.chart import rbac_rules

    rendered: set[tuple[str, frozenset[str], bool]] = set()
    for scenario in ("default", "namespaced"):
        for _, rule in rbac_rules(renderings[scenario]):  # type: ignore[arg-type]
            for resource in rule["resources"]:
                rendered.add((resource, frozenset(rule["verbs"]), bool(rule.get("resourceNames"))))
    documented = table_grants(section("What the chart guarantees"))
    assert documented, "no RBAC table found"
    assert not rendered - documented, f"granted, not in docs/install.md: {sorted(map(str, rendered - documented))}"
    assert not documented - rendered, f"in docs/install.md, not granted: {sorted(map(str, documented - rendered))}"
