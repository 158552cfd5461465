"""Chart tests: the real helm binary renders every scenario once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart import Manifest, scenario_files, template
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin  # noqa: F401  (fixtures)


@pytest.fixture(scope="session")
def renderings(helm_bin: Path) -> dict[str, list[Manifest]]:  # noqa: F811
    """Scenario name -> rendered objects, for the default values and every ci/ values file."""
    return {name: template(helm_bin, path) for name, path in scenario_files().items()}


@pytest.fixture(scope="session")
def default_rendering(renderings: dict[str, list[Manifest]]) -> list[Manifest]:
    return renderings["default"]
