"""Every field of the CompileCache schema is described, so that `kubectl explain compilecache.spec…`
answers for each one (the API server publishes these descriptions as they are)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.chart import REPO_ROOT
from tests.chart.crd_files import CRD_FILES, fields, load_crd


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
