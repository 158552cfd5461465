"""Chart tests: the real helm binary renders every scenario once per session; the manifest linters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart import Manifest, scenario_files, template
from tests.infra import linters as manifest_linters
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin  # noqa: F401  (fixtures)
from testsupport import unavailable
from testsupport.builds import BuildFailed, wait_for_build


@pytest.fixture(scope="session")
def linters() -> dict[str, Path]:
    """The built linters and schema directories (tests/infra/linters.py), once their build is done when it runs in
    the background; skipped when not built, a failure in CI."""
    try:
        wait_for_build("linters")
        return manifest_linters.built()
    except (BuildFailed, manifest_linters.LintersUnavailable) as absent:
        unavailable(str(absent))


@pytest.fixture(scope="session")
def renderings(helm_bin: Path) -> dict[str, list[Manifest]]:  # noqa: F811
    """Scenario name -> rendered objects, for the default values and every ci/ values file."""
    return {name: template(helm_bin, path) for name, path in scenario_files().items()}


@pytest.fixture(scope="session")
def default_rendering(renderings: dict[str, list[Manifest]]) -> list[Manifest]:
    return renderings["default"]
