"""The chart's generated documents are current: README.md is what helm-docs writes from README.md.gotmpl and
values.yaml's `# --` comments."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.infra.chartdocs import README, render


def test_the_chart_readme_is_what_helm_docs_writes(linters: dict[str, Path]) -> None:
    text = README.read_text()
    assert text == render(linters["helm-docs"]), "README.md is not current: run python -m tests.infra.chartdocs"
    assert "| operator.watchNamespaces |" in text and "| metrics.prometheusRule.notReady.for |" in text


def value_keys(tree: object, prefix: str = "") -> list[str]:
    """Every key of values.yaml as helm-docs names it (``a.b.c``), sections and leaves."""
    if not isinstance(tree, dict):
        return []
    keys = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys.append(path)
        keys += value_keys(value, f"{path}.")
    return keys


def test_every_values_key_has_its_row() -> None:
    """helm-docs drops a key whose comment it misreads (a `--` inside the text, as in a CLI flag), silently:
    every key of values.yaml has its row in the README."""
    values = yaml.safe_load((README.parent / "values.yaml").read_text())
    text = README.read_text()
    missing = [k for k in value_keys(values) if f"\n| {k} |" not in text]
    assert not missing, f"README.md has no row for {missing}"
