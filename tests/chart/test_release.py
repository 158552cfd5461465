"""scripts/release.py: one version everywhere, and a release's artefacts — the chart package helm installs from,
the CRDs, and the images as tarballs podman loads back under the release's tags."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from cachelib import __version__
from tests.chart.chart import helm
from tests.infra import images

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "release.py"


def release(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(cwd / "scripts" / "release.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=1200, env=images.podman_env())


def test_every_stated_version_is_pyprojects() -> None:
    proc = release("--check")
    assert proc.returncode == 0, proc.stderr
    version = proc.stdout.split()[1].rstrip(":")
    chart = yaml.safe_load((ROOT / "charts/compilecache-operator/Chart.yaml").read_text())
    assert version == chart["version"] == chart["appVersion"] == __version__
    cli = subprocess.run([sys.executable, "-m", "cachelib.cli", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert cli.stdout.strip() == f"compilecache {version}", cli.stdout + cli.stderr
    from compilecache_operator import main

    assert main._version() == version  # the operator's default preloader image tag


@pytest.mark.parametrize("where", ["charts/compilecache-operator/Chart.yaml", "cachelib/__init__.py", "CHANGELOG.md"])
def test_a_version_that_disagrees_is_named_and_nothing_is_made(tmp_path: Path, where: str) -> None:
    copy = tmp_path / "repo"
    for part in ("pyproject.toml", "cachelib/__init__.py", "charts/compilecache-operator/Chart.yaml",
                 "scripts/release.py", "CHANGELOG.md"):
        (copy / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / part, copy / part)
    text = (copy / where).read_text()
    (copy / where).write_text(text.replace(f'"{__version__}"', '"9.9.9"').replace(f"version: {__version__}",
                                                                                    "version: 9.9.9")
                              .replace(f"## [{__version__}]", "## [9.9.9]"))
    proc = release("--dist", str(tmp_path / "dist"), "--no-images", cwd=copy)
    assert proc.returncode == 1
    assert where in proc.stderr and "9.9.9" in proc.stderr, proc.stderr
    assert not (tmp_path / "dist").exists()


def test_the_chart_package_and_crds_install_as_they_are(helm_bin: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    proc = release("--dist", str(dist), "--no-images", "--helm", str(helm_bin))
    assert proc.returncode == 0, proc.stderr
    package = dist / f"compilecache-operator-{__version__}.tgz"
    with tarfile.open(package) as tar:
        chart = yaml.safe_load(tar.extractfile("compilecache-operator/Chart.yaml").read())  # type: ignore[union-attr]
    assert chart["version"] == chart["appVersion"] == __version__
    rendered = helm(helm_bin, "template", "compilecache", str(package)).stdout
    assert f"ghcr.io/compilecache/operator:{__version__}" in rendered
    assert (dist / "compilecache.io_compilecaches.yaml").read_bytes() == \
        (ROOT / "crds/compilecache.io_compilecaches.yaml").read_bytes()
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines())
    wheel = dist / f"compilecache-{__version__}-py3-none-any.whl"
    assert set(sums) == {package.name, "compilecache.io_compilecaches.yaml", wheel.name}
    assert sums[package.name] == hashlib.sha256(package.read_bytes()).hexdigest()
    # the wheel workload images install the runtime from (docs/your-own-server.md): the whole cachelib, its extras
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"compilecache-{__version__}.dist-info/METADATA").decode()
    assert {"cachelib/runtime.py", "cachelib/harness.py", "cachelib/cli/__main__.py"} <= names
    assert 'Provides-Extra: metrics' in metadata and "prometheus-client" in metadata
    assert sums[wheel.name] == hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_the_image_tarballs_load_under_the_release_tags(helm_bin: Path, tmp_path: Path) -> None:
    unusable = images.podman_usable()
    if unusable:
        pytest.skip(f"podman: {unusable}")
    built = images.current_references()
    if not all(built.values()):
        pytest.skip("the images are not built for this checkout: python -m tests.infra.images")
    dist = tmp_path / "dist"
    given = [a for name, ref in built.items() for a in ("--image", f"{name}={ref}")]
    proc = release("--dist", str(dist), "--helm", str(helm_bin), *given)
    assert proc.returncode == 0, proc.stderr
    try:
        for name in images.IMAGE_NAMES:
            tarball = dist / f"compilecache-{name}-{__version__}.tar"
            with tarfile.open(tarball) as tar:
                manifest = yaml.safe_load(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
            assert manifest[0]["RepoTags"] == [f"ghcr.io/compilecache/{name}:{__version__}"], manifest
            sums = (dist / "SHA256SUMS").read_text()
            assert f"  {tarball.name}" in sums
    finally:
        for name in images.IMAGE_NAMES:
            release_tag = f"ghcr.io/compilecache/{name}:{__version__}"
            # `podman untag IMAGE` alone removes every name of the image (the content tags the e2e tests use)
            images.podman("untag", release_tag, release_tag, check=False)
