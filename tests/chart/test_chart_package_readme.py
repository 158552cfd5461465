"""The README inside the packaged chart (what `helm show readme` and chart registries show, away from the
repository): its relative links point at files the package holds, and it shows the install from a release."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.chart.chart import CHART_DIR, helm

LINK = re.compile(r"\]\(([^)\s]+)\)")


def packaged_chart(helm_bin: Path, tmp_path: Path) -> Path:
    """``helm package`` the chart and unpack it; the unpacked chart's directory."""
    helm(helm_bin, "package", str(CHART_DIR), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("*.tgz")
    with tarfile.open(package) as tar:
        tar.extractall(tmp_path / "unpacked")  # the package helm just made from our own chart
    return tmp_path / "unpacked" / CHART_DIR.name


@pytest.mark.helm
def test_the_packaged_readme_links_only_to_what_the_package_holds(helm_bin: Path, tmp_path: Path) -> None:
    chart = packaged_chart(helm_bin, tmp_path)
    readme = (chart / "README.md").read_text()
    relative = [t for t in LINK.findall(readme) if not re.match(r"[a-z]+://|#", t)]
    broken = [t for t in relative if not (chart / t.split("#", 1)[0]).exists()]
    assert not broken, f"links the packaged chart cannot follow: {broken}"
    home = yaml.safe_load((chart / "Chart.yaml").read_text())["home"]
    assert any(t.startswith(f"{home}/") and "docs/install.md" in t for t in LINK.findall(readme)), \
        "the packaged README does not link docs/install.md on the project's home"


@pytest.mark.helm
def test_the_packaged_readme_shows_the_install_from_the_release_package(helm_bin: Path, tmp_path: Path) -> None:
    chart = packaged_chart(helm_bin, tmp_path)
    version = yaml.safe_load((chart / "Chart.yaml").read_text())["version"]
    readme = (chart / "README.md").read_text()
    assert re.search(rf"^helm install \S+ \S*compilecache-operator-{re.escape(version)}\.tgz ", readme, re.M), \
        "the packaged README shows no install of the release's chart package"
