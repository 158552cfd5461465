"""The chart's CRD templates are generated from crds/ and must not drift from it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.chart.chart import CHART_DIR, REPO_ROOT, Manifest, of_kind, template

SYNC_SCRIPT = CHART_DIR / "hack" / "sync_crds.py"


def load_sync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sync_crds", SYNC_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def canonical_crds() -> dict[str, Manifest]:
    paths = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    docs = [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs}


def test_chart_templates_match_crds_dir() -> None:
    proc = subprocess.run([sys.executable, str(SYNC_SCRIPT), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, f"chart CRDs drifted from crds/ — run {SYNC_SCRIPT.relative_to(REPO_ROOT)}:\n" \
                                 f"{proc.stderr}"


@pytest.mark.helm
def test_rendered_crd_is_the_canonical_crd_plus_chart_metadata(default_rendering: list[Manifest]) -> None:
    """Independent of the generator: what helm renders equals crds/ except the labels and keep annotation."""
    rendered = {c["metadata"]["name"]: c for c in of_kind(default_rendering, "CustomResourceDefinition")}
    canonical = canonical_crds()
    assert rendered.keys() == canonical.keys()
    for name, crd in rendered.items():
        meta = crd["metadata"]
        assert meta["annotations"].pop("helm.sh/resource-policy") == "keep"
        assert meta["labels"].pop("app.kubernetes.io/managed-by") == "Helm"
        for key in [k for k in meta["labels"] if k.startswith(("app.kubernetes.io/", "helm.sh/"))]:
            del meta["labels"][key]
        for field in ("labels", "annotations"):
            if not meta[field]:
                del meta[field]
        assert crd == canonical[name], f"{name}: the chart's CRD differs from crds/"


@pytest.mark.helm
def test_crds_can_be_left_out_or_left_behind(helm_bin: Path) -> None:
    assert not of_kind(template(helm_bin, set_values=["crds.enabled=false"]), "CustomResourceDefinition")
    (crd,) = of_kind(template(helm_bin, set_values=["crds.keep=false"]), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})


def test_drift_is_detected(tmp_path: Path) -> None:
    sync = load_sync()
    source, target = tmp_path / "crds", tmp_path / "templates"
    source.mkdir()
    crd = (REPO_ROOT / "crds").glob("*.yaml")
    for path in crd:
        (source / path.name).write_text(path.read_text())
    expected = sync.expected_templates(source)
    assert sorted(sync.drifted(expected, target)) == sorted(expected)  # nothing written yet
    sync.write(expected, target)
    assert sync.drifted(expected, target) == []
    name = next(iter(expected))
    (target / name).write_text((target / name).read_text().replace("minLength: 1", "minLength: 2", 1))
    assert sync.drifted(expected, target) == [name]
    (target / "stale.yaml").write_text("{}\n")
    assert sync.drifted(expected, target) == sorted([name, "stale.yaml"])
    sync.write(expected, target)
    assert sync.drifted(expected, target) == []


def test_generator_refuses_what_helm_would_evaluate(tmp_path: Path) -> None:
    sync = load_sync()
    with pytest.raises(sync.CRDSourceError, match=r"\{\{"):
        sync.render_template("x.yaml", "kind: CustomResourceDefinition\ndescription: '{{ .Values }}'\n")
    with pytest.raises(sync.CRDSourceError, match="CustomResourceDefinition"):
        sync.render_template("x.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
    with pytest.raises(sync.CRDSourceError, match="no CRD files"):
        sync.expected_templates(tmp_path)


def test_generator_keeps_source_labels_and_annotations() -> None:
    sync = load_sync()
    text = ("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: a.b.c\n"
            "  labels:\n    team: x\n  annotations:\n    note: y\nspec:\n  group: b.c\n")
    out = sync.render_template("a.yaml", text)
    assert "    team: x\n" in out and "    note: y\n" in out and "spec:\n  group: b.c\n" in out
    assert out.rstrip().endswith("{{- end }}")
