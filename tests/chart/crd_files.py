"""The CRD files of the repository (crds/ and the chart's copy), and a walk over a schema's fields."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
