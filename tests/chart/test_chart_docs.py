"""The chart's generated documents are current: README.md is what helm-docs writes from README.md.gotmpl and
values.yaml's `# --` comments."""

from __future__ import annotations

from pathlib import Path

from tests.infra.chartdocs import README, render
from tests.infra.linters import linters  # noqa: F401  (the fixture)


def test_the_chart_readme_is_what_helm_docs_writes(linters: dict[str, Path]) -> None:  # noqa: F811
    text = README.read_text()
    assert text == render(linters["helm-docs"]), "README.md is not current: run python -m tests.infra.chartdocs"
    assert "| operator.watchNamespaces |" in text and "| metrics.prometheusRule.notReady.for |" in text
