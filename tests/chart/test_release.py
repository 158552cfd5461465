"""scripts/release.py: one version everywhere, and a release's artefacts — the chart package helm installs from,
the CRDs, and the images as tarballs podman loads back under the release's tags."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cachelib import __version__
from tests.chart.chart import helm
from tests.infra import images
from tests.infra.releasetools import cyclonedx

__all__ = ["cyclonedx"]

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
    proc = release("--dist", str(tmp_path / "dist"), "--no-images", "--no-sbom", cwd=copy)
    assert proc.returncode == 1
    assert where in proc.stderr and "9.9.9" in proc.stderr, proc.stderr
    assert not (tmp_path / "dist").exists()


def test_the_chart_package_and_crds_install_as_they_are(helm_bin: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    proc = release("--dist", str(dist), "--no-images", "--no-sbom", "--helm", str(helm_bin))
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
    assert set(sums) == {package.name, "compilecache.io_compilecaches.yaml", "provenance.intoto.json", wheel.name}
    assert sums[package.name] == hashlib.sha256(package.read_bytes()).hexdigest()
    # the wheel workload images install the runtime from (docs/your-own-server.md): the whole cachelib, its extras
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"compilecache-{__version__}.dist-info/METADATA").decode()
    assert {"cachelib/runtime.py", "cachelib/in_image/harness.py", "cachelib/cli/__main__.py"} <= names
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
    proc = release("--dist", str(dist), "--helm", str(helm_bin), "--no-sbom", *given)
    assert proc.returncode == 0, proc.stderr
    try:
        for name in images.IMAGE_NAMES:
            tarball = dist / f"compilecache-{name}-{__version__}.tar"
            with tarfile.open(tarball) as tar:
                manifest = yaml.safe_load(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
                config = json.loads(tar.extractfile(manifest[0]["Config"]).read())  # type: ignore[union-attr]
            assert manifest[0]["RepoTags"] == [f"ghcr.io/compilecache/{name}:{__version__}"], manifest
            labels = config["config"]["Labels"]
            assert labels["org.opencontainers.image.version"] == __version__, labels
            assert re.fullmatch(r"[0-9a-f]{40}", labels["org.opencontainers.image.revision"]), labels
            sums = (dist / "SHA256SUMS").read_text()
            assert f"  {tarball.name}" in sums
    finally:
        for name in images.IMAGE_NAMES:
            release_tag = f"ghcr.io/compilecache/{name}:{__version__}"
            # `podman untag IMAGE` alone removes every name of the image (the content tags the e2e tests use)
            images.podman("untag", release_tag, release_tag, check=False)


# -- provenance: signatures, SBOMs, the in-toto statement, OCI labels, platforms -------------------------------
def gpg_key(home: Path) -> tuple[str, Path, Path]:
    """A signing key made for the test (RSA: helm's OpenPGP reads no other), its legacy secret keyring (what helm
    signs from) and its public key."""
    env = {**os.environ, "GNUPGHOME": str(home)}
    home.mkdir(mode=0o700)
    uid = "compilecache release test <release@example.invalid>"
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "rsa2048", "sign", "1d"],
                   check=True, env=env, capture_output=True)
    secring, pubring = home / "secring.gpg", home / "pubring.export.gpg"
    secring.write_bytes(subprocess.run(["gpg", "--batch", "--export-secret-keys", uid], check=True, env=env,
                                       capture_output=True).stdout)
    pubring.write_bytes(subprocess.run(["gpg", "--batch", "--export", uid], check=True, env=env,
                                       capture_output=True).stdout)
    return uid, secring, pubring


@pytest.fixture
def gnupg(tmp_path: Path) -> Iterator[Path]:
    """A GnuPG home of the test's own; the gpg-agent that gpg starts for it is stopped afterwards."""
    home = tmp_path / "gnupg"
    yield home
    subprocess.run(["gpgconf", "--kill", "all"], env={**os.environ, "GNUPGHOME": str(home)}, capture_output=True,
                   check=False)  # fmt: skip


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")
def test_a_signed_release_has_sboms_a_provenance_and_verifies(helm_bin: Path, cyclonedx: Path, tmp_path: Path,
                                                              gnupg: Path) -> None:
    uid, secring, pubring = gpg_key(gnupg)
    dist = tmp_path / "dist"
    env = {"GNUPGHOME": str(gnupg)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dist", str(dist), "--no-images", "--helm", str(helm_bin),
                           "--cyclonedx", str(cyclonedx), "--sign", uid, "--keyring", str(secring),
                           "--builder-id", "https://ci.example/release"],
                          capture_output=True, text=True, timeout=600, env={**images.podman_env(), **env})
    assert proc.returncode == 0, proc.stderr
    package = dist / f"compilecache-operator-{__version__}.tgz"

    # helm verifies the package against the public key; gpg the sums, which cover every other file
    verified = helm(helm_bin, "verify", str(package), "--keyring", str(pubring))
    assert "Signed by: compilecache release test" in verified.stdout + verified.stderr
    subprocess.run(["gpg", "--batch", "--verify", str(dist / "SHA256SUMS.asc"), str(dist / "SHA256SUMS")],
                   check=True, env={**os.environ, **env}, capture_output=True)
    sums = dict(reversed(line.split("  ")) for line in (dist / "SHA256SUMS").read_text().splitlines())
    made = {p.name for p in dist.iterdir()} - {"SHA256SUMS", "SHA256SUMS.asc"}
    assert set(sums) == made, (sorted(sums), sorted(made))
    assert all(hashlib.sha256((dist / n).read_bytes()).hexdigest() == d for n, d in sums.items())
    tampered = dist / "SHA256SUMS"
    tampered.write_text(tampered.read_text().replace(sums[package.name], "0" * 64))
    bad = subprocess.run(["gpg", "--batch", "--verify", str(dist / "SHA256SUMS.asc"), str(tampered)],
                         env={**os.environ, **env}, capture_output=True)
    assert bad.returncode != 0

    # each image's SBOM lists every package its lock installs, at the locked version
    for name in images.IMAGE_NAMES:
        sbom = json.loads((dist / f"compilecache-{name}-{__version__}.cdx.json").read_text())
        assert sbom["bomFormat"] == "CycloneDX" and sbom["metadata"]["component"]["version"] == __version__
        assert sbom["metadata"]["component"]["name"] == f"ghcr.io/compilecache/{name}"
        locked = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", (ROOT / "images" / name /
                                                                     "requirements.lock").read_text(), re.M))
        listed = {c["name"].lower(): c["version"] for c in sbom["components"]}
        assert {k.lower(): v for k, v in locked.items()} == listed, name
        assert all(c["purl"].startswith("pkg:pypi/") for c in sbom["components"])

    # the provenance: an in-toto statement of SLSA provenance over every file, from this commit
    statement = json.loads((dist / "provenance.intoto.json").read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {n: d for n, d in sums.items() if n != "provenance.intoto.json"}
    build = statement["predicate"]["buildDefinition"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert build["externalParameters"]["version"] == __version__ and build["externalParameters"]["signed"] is True
    assert {"uri": f"git+https://github.com/compilecache/compilecache@{head}", "digest": {"gitCommit": head}} \
        in build["resolvedDependencies"]
    assert any(d["uri"].startswith("docker://") and len(d["digest"]["sha256"]) == 64
               for d in build["resolvedDependencies"])
    assert statement["predicate"]["runDetails"]["builder"]["id"] == "https://ci.example/release"


def test_a_platform_this_machine_cannot_build_for_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    release_script = load_release_script()
    empty = tmp_path / "binfmt"
    empty.mkdir()
    assert release_script.platform_problem("linux/amd64", "x86_64", empty) is None
    problem = release_script.platform_problem("linux/arm64", "x86_64", empty)
    assert problem and "qemu-user-static" in problem and "arm64" in problem
    (empty / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n")
    assert release_script.platform_problem("linux/arm64", "x86_64", empty) is None
    assert release_script.platform_problem("linux/arm64", "aarch64", tmp_path / "none") is None
    assert release_script.tarball_name("operator", "1.2.3", "linux/amd64") == "compilecache-operator-1.2.3.tar"
    assert release_script.tarball_name("operator", "1.2.3", "linux/arm64") == "compilecache-operator-1.2.3-arm64.tar"
    with pytest.raises(release_script.ReleaseError, match="linux/riscv64"):
        release_script.architecture("linux/riscv64")
    if release_script.platform_problem("linux/arm64") is not None:  # this machine: the script says so, makes nothing
        proc = release("--dist", str(tmp_path / "dist"), "--platform", "linux/arm64", "--no-sbom")
        assert proc.returncode == 1 and "qemu-user-static" in proc.stderr, proc.stderr
        assert not (tmp_path / "dist").exists()


def load_release_script() -> Any:
    spec = importlib.util.spec_from_file_location("release_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release_script"] = module
    spec.loader.exec_module(module)
    return module
