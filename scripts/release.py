"""Release artefacts of one version into a dist directory: the Helm chart package, the CRDs, the operator and
preloader images as tarballs (``podman save``), and the Python wheel (``compilecache-<version>-py3-none-any.whl``,
for the runtime in workload images: docs/your-own-server.md), with their SHA-256 sums.

The version is pyproject.toml's ``[project].version``, the one place it is set; the chart's ``version`` and
``appVersion``, ``cachelib.__version__`` (what ``compilecache --version`` prints) and the image tags must say the
same, or nothing is made. The images are built from ``images/<name>/Dockerfile`` (``--build-arg`` passes on to
``podman build``), or taken as built (``--image operator=REF``) and tagged ``ghcr.io/compilecache/<name>:<version>``.

    python scripts/release.py --check                      # the versions agree (exit 1 naming each that does not)
    python scripts/release.py --dist dist                  # chart, CRDs, both images built with podman
    python scripts/release.py --dist dist --image operator=REF --image preloader=REF
    python scripts/release.py --dist dist --no-images      # chart, CRDs and the wheel only
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "charts" / "compilecache-operator"
IMAGES = ("operator", "preloader")
REGISTRY = "ghcr.io/compilecache"


class ReleaseError(RuntimeError):
    """A release that cannot be made; the message says why."""


def project_version(root: Path = ROOT) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def stated_versions(root: Path = ROOT) -> dict[str, str]:
    """Every place that states the version, and what it says."""
    chart = yaml.safe_load((root / "charts/compilecache-operator/Chart.yaml").read_text())
    module = ast.parse((root / "cachelib/__init__.py").read_text())
    package = next(node.value.value for node in module.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", "") == "__version__" for t in node.targets)
                   and isinstance(node.value, ast.Constant))
    return {
        "charts/compilecache-operator/Chart.yaml version": str(chart["version"]),
        "charts/compilecache-operator/Chart.yaml appVersion": str(chart["appVersion"]),
        "cachelib/__init__.py __version__ (compilecache --version)": str(package),
    }


def changelog_versions(root: Path = ROOT) -> list[str]:
    """The versions CHANGELOG.md has a section for (``## [1.2.3] - date``), newest first; ``Unreleased`` is none."""
    path = root / "CHANGELOG.md"
    if not path.is_file():
        return []
    found = re.findall(r"^## \[([^\]]+)\]", path.read_text(), flags=re.MULTILINE)
    return [v for v in found if v.lower() != "unreleased"]


def disagreements(root: Path = ROOT) -> list[str]:
    """One line per place whose version is not pyproject.toml's, and CHANGELOG.md when its newest section is not
    that version's (what a release is said to change must be written before it is made)."""
    version = project_version(root)
    lines = [f"{where} says {said}, pyproject.toml says {version}"
             for where, said in stated_versions(root).items() if said != version]
    listed = changelog_versions(root)
    if not listed or listed[0] != version:
        lines.append(f"CHANGELOG.md's newest section is {listed[0] if listed else 'missing'}, "
                     f"pyproject.toml says {version} (add a ## [{version}] section)")
    return lines


def image_reference(name: str, version: str) -> str:
    return f"{REGISTRY}/{name}:{version}"


def run(*command: str) -> None:
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        raise ReleaseError(f"{command[0]} not found (--helm / --podman name the binaries)") from None
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(command[:3])} … failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def package_chart(helm: str, dist: Path) -> Path:
    run(helm, "package", str(CHART_DIR), "--destination", str(dist))
    version = project_version()
    path = dist / f"compilecache-operator-{version}.tgz"
    if not path.is_file():
        raise ReleaseError(f"helm package wrote no {path.name}")
    return path


def copy_crds(dist: Path) -> list[Path]:
    out = []
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        shutil.copyfile(crd, dist / crd.name)
        out.append(dist / crd.name)
    return out


def build_wheel(dist: Path) -> Path:
    """The project's wheel (pure Python, no dependencies bundled), built offline from the checkout."""
    wheel = dist / f"compilecache-{project_version()}-py3-none-any.whl"
    wheel.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="compilecache-wheel-") as scratch:
        source = Path(scratch) / "source"  # a copy: setuptools writes build/ and egg-info beside the sources
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in ("cachelib", "operator"):
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copyfile(ROOT / name, source / name)
        run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir",
            scratch, str(source))  # fmt: skip
        (built,) = Path(scratch).glob("compilecache-*.whl")
        shutil.copyfile(built, wheel)
    return wheel


def save_image(podman: str, name: str, source: str | None, build_args: Sequence[str], dist: Path) -> Path:
    """Build (or tag ``source``) as the release's reference, then ``podman save`` it."""
    reference = image_reference(name, project_version())
    if source is None:
        args = [a for arg in build_args for a in ("--build-arg", arg)]
        run(podman, "build", "--file", f"images/{name}/Dockerfile", "--tag", reference, *args, ".")
    else:
        run(podman, "tag", source, reference)
    path = dist / f"compilecache-{name}-{project_version()}.tar"
    path.unlink(missing_ok=True)
    run(podman, "save", "--format", "docker-archive", "--output", str(path), reference)
    return path


def write_sums(dist: Path, files: Sequence[Path]) -> Path:
    lines = []
    for path in files:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    sums = dist / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def parse_images(values: Sequence[str]) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, ref = value.partition("=")
        if not sep or name not in IMAGES or not ref:
            raise ReleaseError(f"--image {value!r}: expected NAME=REFERENCE with NAME one of {', '.join(IMAGES)}")
        out[name] = ref
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/release.py", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that every stated version agrees")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output directory (default dist/)")
    parser.add_argument("--image", action="append", default=[], metavar="NAME=REF",
                        help="use this built image instead of building it (repeatable)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="ARG=VALUE",
                        help="passed on to podman build (e.g. PYTHON_DIGEST=sha256:...)")
    parser.add_argument("--no-images", action="store_true", help="the chart, the CRDs and the wheel only")
    parser.add_argument("--helm", default=os.environ.get("HELM", "helm"), help="helm binary (default: helm)")
    parser.add_argument("--podman", default=os.environ.get("PODMAN", "podman"), help="podman binary")
    args = parser.parse_args(argv)
    try:
        wrong = disagreements()
        if wrong:
            raise ReleaseError("the versions disagree:\n  " + "\n  ".join(wrong))
        if args.check:
            print(f"version {project_version()}: every place agrees")
            return 0
        images = parse_images(args.image)
        args.dist.mkdir(parents=True, exist_ok=True)
        files = [package_chart(args.helm, args.dist), *copy_crds(args.dist), build_wheel(args.dist)]
        if not args.no_images:
            files += [save_image(args.podman, name, images.get(name), args.build_arg, args.dist) for name in IMAGES]
        sums = write_sums(args.dist, files)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    for path in [*files, sums]:
        print(path.relative_to(args.dist.parent) if path.is_relative_to(args.dist.parent) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

