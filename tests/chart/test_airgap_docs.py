"""docs/airgap.md names every image a cluster must mirror: the images the chart's objects run in every scenario
(hooks and the test pod included) and the one the operator puts into warm-ups and tenants' pods, and no other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.chart.chart import Manifest, operator_container

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]


def run_images(manifests: list[Manifest]) -> set[str]:
    """The repositories of every container the rendered objects run, and of the operator's --preloader-image."""
    found: set[str] = set()
    for m in manifests:
        if m["kind"] not in ("Deployment", "Job", "Pod"):
            continue
        spec = m["spec"] if m["kind"] == "Pod" else m["spec"]["template"]["spec"]
        found |= {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]}
    preloader = [a.split("=", 1)[1] for a in operator_container(manifests)["args"]
                 if a.startswith("--preloader-image=")]
    return {repository(ref) for ref in found | set(preloader)}


def repository(reference: str) -> str:
    """``registry/path/name`` of ``registry/path/name:tag`` or ``…@sha256:…`` (a registry's port stays)."""
    name = reference.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def test_the_page_lists_exactly_the_images_the_chart_and_the_operator_run(
    renderings: dict[str, list[Manifest]],
) -> None:
    text = (ROOT / "docs" / "airgap.md").read_text()
    table = text.split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`:]+):<version>` \|", table, re.M))
    assert listed == {"ghcr.io/compilecache/operator", "ghcr.io/compilecache/preloader"}, listed
    for scenario, manifests in renderings.items():
        if scenario == "production":  # its images come from a private registry, pinned by digest
            continue
        assert run_images(manifests) == listed, scenario
    production = run_images(renderings["production"])
    assert {r.rsplit("/", 1)[1] for r in production} == {"operator", "preloader"}, production
