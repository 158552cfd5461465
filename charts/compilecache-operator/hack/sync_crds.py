"""Write (or check) the chart's CRD templates from the canonical CRDs in crds/.

Each ``crds/<file>.yaml`` becomes ``templates/crds/<file>.yaml``: the same document wrapped in
``{{- if .Values.crds.enabled }}``, with the chart's labels and, under ``crds.keep``, the annotation
``helm.sh/resource-policy: keep`` added to its metadata. Everything outside ``metadata`` is copied
verbatim, so the chart serves exactly the schema in crds/.

    python charts/compilecache-operator/hack/sync_crds.py          # write
    python charts/compilecache-operator/hack/sync_crds.py --check  # exit 1 and name the files that drifted
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

CHART_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = CHART_DIR.parent.parent
SOURCE_DIR = REPO_ROOT / "crds"
TARGET_DIR = CHART_DIR / "templates" / "crds"
SCRIPT = "charts/compilecache-operator/hack/sync_crds.py"
TOP_LEVEL_KEY = re.compile(r"^([A-Za-z_][\w-]*):")


class CRDSourceError(ValueError):
    """A file in crds/ cannot be turned into a chart template."""


def split_top_level(text: str) -> list[tuple[str | None, str]]:
    """Split one YAML document into (top-level key, block text) pairs, comments kept with their block."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines(keepends=True):
        match = TOP_LEVEL_KEY.match(line)
        if match:
            blocks.append((match.group(1), [line]))
        else:
            blocks[-1][1].append(line)
    return [(key, "".join(lines)) for key, lines in blocks if key is not None or "".join(lines).strip()]


def metadata_block(metadata: dict[str, object]) -> str:
    """The templated metadata: chart labels, the keep annotation, then the CRD's own labels/annotations."""
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise CRDSourceError("metadata.name is missing")
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    if not isinstance(labels, dict) or not isinstance(annotations, dict):
        raise CRDSourceError("metadata.labels/annotations must be mappings")
    extra = set(metadata) - {"name", "labels", "annotations"}
    if extra:
        raise CRDSourceError(f"unsupported metadata fields {sorted(extra)}")
    out = ["metadata:\n", f"  name: {name}\n", "  labels:\n",
           '    {{- include "compilecache-operator.labels" . | nindent 4 }}\n']
    out += _indented(labels, 4)
    if annotations:
        out += ["  annotations:\n", "    {{- if .Values.crds.keep }}\n", "    helm.sh/resource-policy: keep\n",
                "    {{- end }}\n"]
        out += _indented(annotations, 4)
    else:
        out += ["  {{- if .Values.crds.keep }}\n", "  annotations:\n", "    helm.sh/resource-policy: keep\n",
                "  {{- end }}\n"]
    return "".join(out)


def _indented(mapping: dict[object, object], indent: int) -> list[str]:
    if not mapping:
        return []
    dumped = yaml.safe_dump(mapping, default_flow_style=False, sort_keys=True, width=1000)
    return [" " * indent + line + "\n" for line in dumped.splitlines()]


def render_template(source_name: str, text: str) -> str:
    """The chart template for one canonical CRD file."""
    if "{{" in text or "}}" in text:
        raise CRDSourceError(f"{source_name}: contains '{{{{' or '}}}}', which Helm would evaluate")
    documents = [d for d in re.split(r"^---[ \t]*$\n?", text, flags=re.M) if d.strip()]
    if not documents:
        raise CRDSourceError(f"{source_name}: empty")
    rendered = []
    for document in documents:
        parsed = yaml.safe_load(document)
        if not isinstance(parsed, dict) or parsed.get("kind") != "CustomResourceDefinition":
            raise CRDSourceError(f"{source_name}: every document must be a CustomResourceDefinition")
        parts = []
        for key, block in split_top_level(document):
            if key == "metadata":
                parts.append(metadata_block(parsed["metadata"]))
            elif key is None:
                continue  # leading comments and blank lines stay in the source only
            else:
                parts.append(block if block.endswith("\n") else block + "\n")
        rendered.append("".join(parts))
    header = (
        f"{{{{- /* Generated from crds/{source_name} by {SCRIPT}; edit crds/ and re-run it. */}}}}\n"
        "{{- if .Values.crds.enabled }}\n"
    )
    return header + "---\n".join(rendered) + "{{- end }}\n"


def expected_templates(source_dir: Path = SOURCE_DIR) -> dict[str, str]:
    """File name -> template text for every CRD in ``source_dir``."""
    sources = sorted(source_dir.glob("*.yaml"))
    if not sources:
        raise CRDSourceError(f"no CRD files in {source_dir}")
    return {path.name: render_template(path.name, path.read_text()) for path in sources}


def drifted(expected: dict[str, str], target_dir: Path = TARGET_DIR) -> list[str]:
    """Names of templates that are missing, different, or no longer have a source."""
    present = {p.name for p in target_dir.glob("*.yaml")} if target_dir.is_dir() else set()
    out = [name for name, text in expected.items()
           if name not in present or (target_dir / name).read_text() != text]
    return sorted(out + [name for name in present - set(expected)])


def write(expected: dict[str, str], target_dir: Path = TARGET_DIR) -> None:
    target_dir.mkdir(parents=True, exist_ok=True)
    for stale in set(p.name for p in target_dir.glob("*.yaml")) - set(expected):
        (target_dir / stale).unlink()
    for name, text in expected.items():
        tmp = target_dir / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(target_dir / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report drift instead of writing")
    args = parser.parse_args(argv)
    try:
        expected = expected_templates()
    except (CRDSourceError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = drifted(expected)
        for name in stale:
            print(f"drift: templates/crds/{name} differs from crds/{name}; run {SCRIPT}", file=sys.stderr)
        return 1 if stale else 0
    write(expected)
    for name in expected:
        print(f"wrote templates/crds/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
