"""The CompileCache CRD's schema as the tests read it: the file, its one version, a JSON-Schema validator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

CRD = Path(__file__).resolve().parents[2] / "crds" / "compilecache.io_compilecaches.yaml"


def crd_version() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def as_json_schema(node: Any) -> Any:
    """The CRD's OpenAPI v3 schema as JSON Schema (int-or-string and nullable spelled out)."""
    if isinstance(node, list):
        return [as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "format"}
    return out


def validator() -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(as_json_schema(crd_version()["schema"]["openAPIV3Schema"]))
