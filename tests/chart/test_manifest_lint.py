"""The rendered chart and examples/ checked by linters made for Kubernetes manifests.

- kubeconform ``-strict`` against the JSON schemas of Kubernetes at the control plane's version, of the
  Prometheus operator's and cert-manager's CRDs, and of our own CRD as it is in crds/ now: every object
  of every values scenario and of examples/ is validated (no schema missing, no field unknown).
- kube-score on every scenario: no critical finding. A check that does not apply to an object is
  ignored on that object with the ``kube-score/ignore`` annotation, and a comment above it says why.

The tools are built by ``python -m tests.infra.linters`` (scripts/test.sh does it); without them these
tests skip, and fail under CI=true.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from tests.chart.chart import (
    CHART_DIR,
    EXAMPLES_DIR,
    MONITORING_APIS,
    NAMESPACE,
    POLICY_APIS,
    RELEASE,
    helm,
    scenario_files,
)
from tests.infra.linters import convert_crds, kube_version, kubernetes_schemas

REPO_ROOT = CHART_DIR.parent.parent
SCENARIOS = scenario_files()
KUBE_SCORE_IGNORE = "kube-score/ignore"
LOCATION = "{{ .ResourceKind }}{{ .KindSuffix }}.json"


def render_scenarios(helm_bin: Path, out_dir: Path, *extra: str) -> dict[str, Path]:
    """Scenario name -> a file holding exactly what ``helm template`` printed for it."""
    out: dict[str, Path] = {}
    for name, values in SCENARIOS.items():
        args = ["template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, *MONITORING_APIS, *extra]
        if values is not None:
            args += ["--values", str(values)]
        out[name] = out_dir / f"{name}.yaml"
        out[name].write_text(helm(helm_bin, *args).stdout)
    return out


@pytest.fixture(scope="session")
def rendered(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return render_scenarios(helm_bin, tmp_path_factory.mktemp("rendered"), *POLICY_APIS)


@pytest.fixture(scope="session")
def rendered_oldest(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """As :func:`rendered`, for the oldest Kubernetes the chart supports."""
    return render_scenarios(helm_bin, tmp_path_factory.mktemp("rendered-oldest"),
                            "--kube-version", kube_version("KUBE_OLDEST_VERSION"))


@pytest.fixture(scope="session")
def our_crd_schemas(linters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JSON schemas of crds/ as the checkout has them, made by kubeconform's own converter."""
    target = tmp_path_factory.mktemp("crd-schemas")
    written = convert_crds(sorted((REPO_ROOT / "crds").glob("*.yaml")), target)
    assert [p.name for p in written] == ["compilecache-compilecache-v1alpha1.json"]
    return target


def kubeconform(linters: dict[str, Path], crd_schemas: Path, *files: Path,
                oldest: bool = False) -> dict[str, Any]:
    """kubeconform -strict on ``files``, against the schemas of the control plane's Kubernetes version (or of the
    oldest supported one)."""
    kubernetes = linters["schemas-kubernetes-oldest" if oldest else "schemas-kubernetes"]
    locations = [kubernetes, linters["schemas-prometheus-operator"], linters["schemas-cert-manager"], crd_schemas]
    args = [str(linters["kubeconform"]), "-strict", "-summary", "-verbose", "-output", "json",
            "-kubernetes-version", kube_version("KUBE_OLDEST_VERSION" if oldest else "KUBE_VERSION")]
    for location in locations:
        args += ["-schema-location", f"{location}/{LOCATION}"]
    proc = subprocess.run([*args, *map(str, files)], capture_output=True, text=True, timeout=300)
    report: dict[str, Any] = json.loads(proc.stdout)
    report["returncode"] = proc.returncode
    return report


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def problems(report: dict[str, Any]) -> list[str]:
    return [f"{r.get('kind')}/{r.get('name')}: {r.get('status')} {r.get('msg')}"
            for r in report.get("resources", []) if r.get("status") != "statusValid"]


@pytest.mark.helm
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kubeconform_strict_accepts_every_rendered_object(
    scenario: str, rendered: dict[str, Path], linters: dict[str, Path], our_crd_schemas: Path,
) -> None:
    report = kubeconform(linters, our_crd_schemas, rendered[scenario])
    assert not problems(report), "\n".join(problems(report))
    assert report["returncode"] == 0
    assert report["summary"]["valid"] == len(documents(rendered[scenario])) > 0, report["summary"]


@pytest.mark.helm
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kubeconform_strict_accepts_every_object_rendered_for_the_oldest_kubernetes(
    scenario: str, rendered_oldest: dict[str, Path], linters: dict[str, Path], our_crd_schemas: Path,
) -> None:
    """Rendered with ``--kube-version`` of the oldest supported release, every object validates against that
    release's own schemas (an API it lacks, such as admissionregistration.k8s.io/v1 policies before 1.30,
    is left out)."""
    report = kubeconform(linters, our_crd_schemas, rendered_oldest[scenario], oldest=True)
    assert not problems(report), "\n".join(problems(report))
    assert report["returncode"] == 0
    assert report["summary"]["valid"] == len(documents(rendered_oldest[scenario])) > 0, report["summary"]


def test_kubeconform_strict_accepts_the_examples(linters: dict[str, Path], our_crd_schemas: Path) -> None:
    files = sorted(EXAMPLES_DIR.glob("*.yaml"))
    report = kubeconform(linters, our_crd_schemas, *files)
    assert not problems(report), "\n".join(problems(report))
    kinds = {d["kind"] for f in files for d in documents(f)}
    assert "CompileCache" in kinds
    assert report["summary"]["valid"] == sum(len(documents(f)) for f in files)


def test_kubeconform_refuses_unknown_fields_and_bad_values(
    linters: dict[str, Path], our_crd_schemas: Path, tmp_path: Path,
) -> None:
    """The set-up can fail: a field our CRD does not know, a value out of its bounds, a typo in a
    Deployment and a kind without a schema are all reported."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([
        {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": "a"},
         "spec": {"image": "i", "model": {"target": "tiny_mlp"}, "preload": {"deadlineSecond": 30}}},
        {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": "b"},
         "spec": {"image": "i", "model": {"target": "tiny_mlp"}, "preload": {"deadlineSeconds": 601}}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "c"},
         "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
             "metadata": {"labels": {"a": "b"}},
             "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "Always", "ports": [
                 {"containerPort": "http"}]}]}}}},
        {"apiVersion": "example.com/v1", "kind": "Unknown", "metadata": {"name": "d"}},
    ]))
    report = kubeconform(linters, our_crd_schemas, bad)
    assert report["returncode"] != 0
    by_name = {r["name"]: r for r in report["resources"]}
    assert by_name["a"]["status"] == "statusInvalid" and "deadlineSecond" in by_name["a"]["msg"]
    assert by_name["b"]["status"] == "statusInvalid" and "deadlineSeconds" in by_name["b"]["msg"]
    assert by_name["c"]["status"] == "statusInvalid" and "containerPort" in by_name["c"]["msg"]
    assert by_name["d"]["status"] == "statusError" and "could not find schema" in by_name["d"]["msg"]


def test_kubernetes_schemas_are_standalone_and_strict() -> None:
    """The converter on a small OpenAPI document: one file per kind, named as kubeconform looks it up, with the
    definitions it uses embedded, unknown fields refused, and quantities as the API server reads them."""
    swagger = {"definitions": {
        "io.k8s.api.apps.v1.Thing": {
            "type": "object", "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Thing"}],
            "properties": {"kind": {"type": "string"}, "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec"}},
        },
        "io.k8s.api.apps.v1.ThingSpec": {"type": "object", "properties": {
            "size": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
            "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}}},
        "io.k8s.api.core.v1.Plain": {"type": "object", "properties": {"a": {"type": "string"}},
                                     "x-kubernetes-group-version-kind": [{"group": "", "version": "v1",
                                                                          "kind": "Plain"}]},
        "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {
            "type": "object", "x-kubernetes-group-version-kind": [{"group": "", "version": "v1",
                                                                   "kind": "DeleteOptions"}]},
    }}
    schemas = kubernetes_schemas(swagger)
    assert sorted(schemas) == ["plain-v1.json", "thing-apps-v1.json"]
    thing = jsonschema.Draft4Validator(schemas["thing-apps-v1.json"])
    assert sorted(schemas["thing-apps-v1.json"]["definitions"]) == [
        "io.k8s.api.apps.v1.ThingSpec", "io.k8s.apimachinery.pkg.api.resource.Quantity",
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString"]
    assert not list(thing.iter_errors({"kind": "Thing", "spec": {"size": 2, "port": "http"}}))
    assert not list(thing.iter_errors({"kind": "Thing", "spec": {"size": "2Gi", "port": 80}}))
    assert list(thing.iter_errors({"kind": "Thing", "spec": {"sise": "2Gi"}}))  # unknown field
    assert list(thing.iter_errors({"kind": "Thing", "extra": 1}))
    assert list(thing.iter_errors({"kind": "Thing", "spec": {"port": 1.5}}))


# -- kube-score ------------------------------------------------------------------------------------------
# Optional checks turned on: every container we ship has a seccomp profile and named, valid ports.
OPTIONAL_CHECKS = ("container-seccomp-profile", "container-ports-check")


def kube_score(linters: dict[str, Path], *files: Path) -> tuple[int, list[str]]:
    """kube-score's exit status and its findings below OK (critical and warning), one line each; every
    container's requests and limits (cpu and memory) are checked."""
    minor = ".".join(kube_version().split(".")[:2])
    args = [str(linters["kube-score"]), "score", "--output-format", "ci", "--kubernetes-version", f"v{minor}"]
    for check in OPTIONAL_CHECKS:
        args += ["--enable-optional-test", check]
    proc = subprocess.run([*args, *map(str, files)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, [line for line in proc.stdout.splitlines() if line.startswith(("[CRITICAL]", "[WARNING]"))]


@pytest.mark.helm
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kube_score_finds_nothing(
    scenario: str, rendered: dict[str, Path], linters: dict[str, Path],
) -> None:
    code, findings = kube_score(linters, rendered[scenario])
    assert not findings, "\n".join(findings)
    assert code == 0


def test_kube_score_reports_an_insecure_deployment(linters: dict[str, Path], tmp_path: Path) -> None:
    """The linter can fail: a Deployment with no security context, resources or probes is critical."""
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bare", "namespace": "x"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}, "template": {
            "metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:latest"}]}}},
    }))
    code, findings = kube_score(linters, bare)
    assert code == 1
    assert any("readOnlyRootFilesystem" in line or "security context" in line.lower() for line in findings), findings
    assert any("Memory limit is not set" in line for line in findings), findings
    assert any("seccomp" in line.lower() for line in findings), findings


def ignored_checks() -> list[tuple[str, str, str]]:
    """(template, check, reason) for every check a ``kube-score/ignore`` annotation turns off; the reason is the
    ``# kube-score: <check>: <why>`` comment in the block of comments right above the annotation."""
    out = []
    for template in sorted((CHART_DIR / "templates").rglob("*.yaml")):
        lines = template.read_text().splitlines()
        for i, line in enumerate(lines):
            if not line.strip().startswith(f"{KUBE_SCORE_IGNORE}:"):
                continue
            block: list[str] = []
            for above in reversed(lines[:i]):
                if not above.strip().startswith("#"):
                    break
                block.insert(0, above.strip().lstrip("#").strip())
            reasons = dict(re.findall(r"kube-score: ([a-z-]+): (.+)", "\n".join(block)))
            for check in line.split(":", 1)[1].strip().split(","):
                out.append((template.name, check, reasons.get(check, "")))
    return out


def test_every_ignored_check_says_why(linters: dict[str, Path]) -> None:
    ignored = ignored_checks()
    assert {check for _, check, _ in ignored} >= {"pod-networkpolicy", "deployment-replicas"}
    listed = subprocess.run([str(linters["kube-score"]), "list"], capture_output=True, text=True, check=True)
    known = {row.split(",", 1)[0] for row in listed.stdout.splitlines()}
    for template, check, reason in ignored:
        assert check in known, f"{template}: {check!r} is not a kube-score check"
        assert len(reason) > 20, f"{template}: no '# kube-score: {check}: <why>' comment above the annotation"
