"""Every field of the CompileCache schema is described, so that `kubectl explain compilecache.spec…`
answers for each one (the API server publishes these descriptions as they are)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart import CHART_DIR, REPO_ROOT

CRD_FILES = [REPO_ROOT / "crds" / "compilecache.io_compilecaches.yaml",
             CHART_DIR / "templates" / "crds" / "compilecache.io_compilecaches.yaml"]  # fmt: skip


def load_crd(path: Path) -> dict[str, Any]:
    """The CRD document; the chart copy's `{{ … }}` lines are template around the same document."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("{{"))
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every field below ``schema``, as `kubectl explain` names them."""
    for name, child in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", child
        yield from fields(child, f"{path}.{name}")
    items = schema.get("items")
    if isinstance(items, dict):
        yield from fields(items, path)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from fields(extra, path)


def undescribed(crd: dict[str, Any]) -> list[str]:
    missing = []
    for version in crd["spec"]["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        for top in ("spec", "status"):
            for path, schema in [(top, root["properties"][top]), *fields(root["properties"][top], top)]:
                if not str(schema.get("description") or "").strip():
                    missing.append(f"{version['name']}: compilecache.{path}")
    return missing


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_spec_and_status_field_is_described(path: Path) -> None:
    missing = undescribed(load_crd(path))
    assert not missing, f"{len(missing)} fields without a description:\n" + "\n".join(missing)


def test_the_walk_finds_nested_fields() -> None:
    """The walk reaches list items and map values: a field hidden there is found undescribed."""
    crd = load_crd(CRD_FILES[0])
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del schema["properties"]["conditions"]["items"]["properties"]["reason"]["description"]
    assert undescribed(crd) == ["v1alpha1: compilecache.status.conditions.reason"]
