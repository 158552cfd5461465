"""Release artefacts of one version into a dist directory: the Helm chart package, the CRDs, the operator and
preloader images as tarballs (``podman save``), the Python wheel (``compilecache-<version>-py3-none-any.whl``,
for the runtime in workload images: docs/your-own-server.md), a CycloneDX SBOM of each image, an in-toto
provenance statement (SLSA provenance v1) of everything, and their SHA-256 sums; with ``--sign``, a GnuPG
signature of the chart (``helm package --sign``: ``<package>.prov``, which ``helm verify`` and ``helm install
--verify`` check) and of the sums (``SHA256SUMS.asc``: ``gpg --verify``), which cover every other file.

The version is pyproject.toml's ``[project].version``, the one place it is set; the chart's ``version`` and
``appVersion``, ``cachelib.__version__`` (what ``compilecache --version`` prints) and the image tags must say the
same, or nothing is made. The images are built from ``images/<name>/Dockerfile`` (``--build-arg`` passes on to
``podman build``), or taken as built (``--image operator=REF``), and tagged ``ghcr.io/compilecache/<name>:<version>``
with the OCI labels ``org.opencontainers.image.version`` and ``.revision`` (the commit). ``--platform`` builds
for each platform named (default: this machine's); another architecture needs a binfmt emulator
(qemu-user-static) registered, or the release says so and makes nothing.

The SBOMs are written by ``cyclonedx-py`` (PyPI's cyclonedx-bom; ``--cyclonedx`` names it) from each image's
lock, ``images/<name>/requirements.lock``: every package the image installs, at its version, with its hashes.

    python scripts/release.py --check                      # the versions agree (exit 1 naming each that does not)
    python scripts/release.py --dist dist                  # chart, CRDs, both images built with podman
    python scripts/release.py --dist dist --image operator=REF --image preloader=REF
    python scripts/release.py --dist dist --no-images      # chart, CRDs, the wheel (and the SBOMs) only
    python scripts/release.py --dist dist --sign KEY --keyring secring.gpg   # signed (GnuPG)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import platform as host
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "charts" / "compilecache-operator"
IMAGES = ("operator", "preloader")
REGISTRY = "ghcr.io/compilecache"
SOURCE = "https://github.com/compilecache/compilecache"
BUILD_TYPE = f"{SOURCE}/blob/main/scripts/release.py"
"""The SLSA buildType: how the provenance's parameters are to be read (this script)."""
ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
QEMU_HANDLERS = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
BINFMT = Path("/proc/sys/fs/binfmt_misc")


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


def run(*command: str, env: Mapping[str, str] | None = None) -> str:
    """Run ``command`` from the repository root; its standard output."""
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, **env} if env else None)
    except FileNotFoundError:
        raise ReleaseError(f"{command[0]} not found (--helm, --podman, --gpg, --cyclonedx name the binaries)") from None
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(command[:3])} … failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


@dataclass(frozen=True)
class Signer:
    """Who signs: a GnuPG key (``--sign``), the legacy secret keyring helm reads it from, and gpg itself."""

    key: str
    keyring: Path
    gpg: str = "gpg"


def package_chart(helm: str, dist: Path, signer: Signer | None = None) -> list[Path]:
    """The chart package (and, signed, its ``.prov``)."""
    signing = ["--sign", "--key", signer.key, "--keyring", str(signer.keyring)] if signer else []
    run(helm, "package", str(CHART_DIR), "--destination", str(dist), *signing)
    version = project_version()
    path = dist / f"compilecache-operator-{version}.tgz"
    if not path.is_file():
        raise ReleaseError(f"helm package wrote no {path.name}")
    if signer is None:
        return [path]
    provenance = path.with_name(path.name + ".prov")
    if not provenance.is_file():
        raise ReleaseError(f"helm package --sign wrote no {provenance.name}")
    return [path, provenance]


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


def git_revision(root: Path = ROOT) -> tuple[str, bool]:
    """The commit the release is made from, and whether the work tree differs from it."""
    try:
        revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                  check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return revision, dirty


def architecture(platform: str) -> str:
    """``amd64`` or ``arm64`` of ``linux/<arch>``; refuses another."""
    os_name, _, arch = platform.partition("/")
    if os_name != "linux" or arch not in ("amd64", "arm64"):
        raise ReleaseError(f"--platform {platform!r}: expected linux/amd64 or linux/arm64")
    return arch


def platform_problem(platform: str, machine: str | None = None, binfmt: Path = BINFMT) -> str | None:
    """Why this machine cannot build for ``platform``: another architecture without its binfmt emulator."""
    arch = architecture(platform)
    own = ARCHITECTURES.get(machine or host.machine(), machine or host.machine())
    if arch == own:
        return None
    handler = binfmt / QEMU_HANDLERS[arch]
    if handler.is_file() and "enabled" in handler.read_text():
        return None
    return (f"--platform {platform}: this machine is {own} and has no binfmt_misc emulator for {arch} "
            f"({handler} is not registered): build on an {arch} host, or install and register qemu-user-static")


def tarball_name(name: str, version: str, platform: str) -> str:
    """``compilecache-<name>-<version>.tar`` for linux/amd64, ``…-<version>-<arch>.tar`` for another."""
    arch = architecture(platform)
    return f"compilecache-{name}-{version}{'' if arch == 'amd64' else '-' + arch}.tar"


@dataclass(frozen=True)
class ImageBuild:
    """How the images are made: built with podman (``build_args``, for ``platforms``), or taken as built."""

    podman: str = "podman"
    sources: Mapping[str, str] = field(default_factory=dict)
    build_args: Sequence[str] = ()
    platforms: Sequence[str] = ("linux/amd64",)
    revision: str = "unknown"


def oci_labels(version: str, revision: str) -> list[str]:
    return [f"org.opencontainers.image.version={version}", f"org.opencontainers.image.revision={revision}"]


def save_image(build: ImageBuild, name: str, platform: str, dist: Path) -> Path:
    """Build (or relabel ``source``) as the release's reference, with its version and revision labels, then
    ``podman save`` it."""
    version = project_version()
    reference = image_reference(name, version)
    podman = build.podman
    source = build.sources.get(name)
    labels = oci_labels(version, build.revision)
    if source is None:
        args = [a for arg in [*build.build_args, f"VERSION={version}", f"REVISION={build.revision}"]
                for a in ("--build-arg", arg)]
        run(podman, "build", "--platform", platform, "--file", f"images/{name}/Dockerfile", "--tag", reference,
            *args, ".")
    else:  # an image built elsewhere gets the release's labels in a layer-less build on top of it
        with tempfile.TemporaryDirectory() as context:
            (Path(context) / "Containerfile").write_text(f"FROM {source}\n")
            run(podman, "build", "--pull=never", *[a for label in labels for a in ("--label", label)],
                "--tag", reference, context)
    path = dist / tarball_name(name, version, platform)
    path.unlink(missing_ok=True)
    run(podman, "save", "--format", "docker-archive", "--output", str(path), reference)
    return path


def write_sboms(cyclonedx: str, dist: Path) -> list[Path]:
    """A CycloneDX (JSON) SBOM of each image, from its lock: ``compilecache-<name>-<version>.cdx.json``."""
    version = project_version()
    out = []
    for name in IMAGES:
        path = dist / f"compilecache-{name}-{version}.cdx.json"
        run(cyclonedx, "requirements", str(ROOT / "images" / name / "requirements.lock"),
            "--of", "JSON", "--output-reproducible", "-o", str(path))
        sbom = json.loads(path.read_text())
        sbom.setdefault("metadata", {})["component"] = {
            "type": "container", "bom-ref": image_reference(name, version), "name": f"{REGISTRY}/{name}",
            "version": version, "purl": f"pkg:oci/{name}?repository_url={REGISTRY}&tag={version}",
        }
        path.write_text(json.dumps(sbom, indent=2, sort_keys=True) + "\n")
        out.append(path)
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def base_images() -> list[dict[str, object]]:
    """The base image of each Dockerfile, as its ARGs pin it (repository and digest)."""
    out: list[dict[str, object]] = []
    for name in IMAGES:
        text = (ROOT / "images" / name / "Dockerfile").read_text()
        image = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M)
        digest = re.search(r"^ARG PYTHON_DIGEST=sha256:([0-9a-f]{64})", text, re.M)
        if image and digest:
            out.append({"uri": f"docker://{image.group(1)}", "digest": {"sha256": digest.group(1)},
                        "annotations": {"image": name}})
    return out


def provenance(files: Sequence[Path], *, version: str, revision: str, dirty: bool, images: Mapping[str, str],
               platforms: Sequence[str], signed: bool, started: datetime, builder: str) -> dict[str, object]:
    """An in-toto Statement (v1) whose predicate is SLSA provenance v1: what was made (each file's sha256), from
    which commit and base images, with which parameters, by whom and when."""
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": p.name, "digest": {"sha256": sha256_of(p)}} for p in files],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"version": version, "revision": revision,
                                       "images": {n: images.get(n, "built") for n in IMAGES},
                                       "platforms": list(platforms), "signed": signed},
                "internalParameters": {"workTreeDirty": dirty},
                "resolvedDependencies": [
                    {"uri": f"git+{SOURCE}@{revision}", "digest": {"gitCommit": revision}}, *base_images(),
                ],
            },
            "runDetails": {
                "builder": {"id": builder},
                "metadata": {"invocationId": str(uuid.uuid4()), "startedOn": started.isoformat(timespec="seconds"),
                             "finishedOn": datetime.now(UTC).isoformat(timespec="seconds")},
            },
        },
    }


def sign_file(signer: Signer, path: Path) -> Path:
    """``<path>.asc``: an armored detached GnuPG signature of ``path``."""
    signature = path.with_name(path.name + ".asc")
    signature.unlink(missing_ok=True)
    run(signer.gpg, "--batch", "--yes", "--local-user", signer.key, "--armor", "--detach-sign",
        "--output", str(signature), str(path))
    return signature


def write_sums(dist: Path, files: Sequence[Path]) -> Path:
    sums = dist / "SHA256SUMS"
    sums.write_text("".join(f"{sha256_of(path)}  {path.name}\n" for path in files))
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
    parser.add_argument("--platform", action="append", default=[], metavar="linux/ARCH",
                        help="build the images for this platform (repeatable; default this machine's: "
                             f"linux/{ARCHITECTURES.get(host.machine(), host.machine())})")
    parser.add_argument("--no-images", action="store_true",
                        help="the chart, the CRDs and the wheel (and the SBOMs) only")
    parser.add_argument("--no-sbom", action="store_true", help="write no SBOM (a release should have them)")
    parser.add_argument("--sign", metavar="KEY", help="sign the chart package and SHA256SUMS with this GnuPG key")
    parser.add_argument("--keyring", type=Path, default=Path.home() / ".gnupg" / "secring.gpg",
                        help="the legacy secret keyring helm signs from (gpg --export-secret-keys KEY > FILE; "
                             "default ~/.gnupg/secring.gpg)")
    parser.add_argument("--builder-id", default=os.environ.get("RELEASE_BUILDER_ID") or f"{host.node()}",
                        help="who made the release, for the provenance (default this machine's name)")
    parser.add_argument("--helm", default=os.environ.get("HELM", "helm"), help="helm binary (default: helm)")
    parser.add_argument("--podman", default=os.environ.get("PODMAN", "podman"), help="podman binary")
    parser.add_argument("--gpg", default=os.environ.get("GPG", "gpg"), help="gpg binary (with --sign)")
    parser.add_argument("--cyclonedx", default=os.environ.get("CYCLONEDX", "cyclonedx-py"),
                        help="cyclonedx-py binary (pip install cyclonedx-bom) that writes the SBOMs")
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    try:
        wrong = disagreements()
        if wrong:
            raise ReleaseError("the versions disagree:\n  " + "\n  ".join(wrong))
        if args.check:
            print(f"version {project_version()}: every place agrees")
            return 0
        sources = parse_images(args.image)
        platforms = args.platform or [f"linux/{ARCHITECTURES.get(host.machine(), host.machine())}"]
        if not args.no_images:
            problems = [p for p in map(platform_problem, platforms) if p]
            if sources and len(platforms) > 1:
                problems.append("--image takes one built image per name: give one --platform with it")
            if problems:
                raise ReleaseError("\n  ".join(problems))
        signer = Signer(args.sign, args.keyring, args.gpg) if args.sign else None
        if signer is not None and not signer.keyring.is_file():
            raise ReleaseError(f"--keyring {signer.keyring}: no such file (gpg --export-secret-keys {signer.key} "
                               f"> {signer.keyring})")
        revision, dirty = git_revision()
        args.dist.mkdir(parents=True, exist_ok=True)
        files = [*package_chart(args.helm, args.dist, signer), *copy_crds(args.dist), build_wheel(args.dist)]
        if not args.no_images:
            build = ImageBuild(args.podman, sources, args.build_arg, platforms, revision)
            files += [save_image(build, name, platform, args.dist) for platform in platforms for name in IMAGES]
        if not args.no_sbom:
            files += write_sboms(args.cyclonedx, args.dist)
        statement = args.dist / "provenance.intoto.json"
        statement.write_text(json.dumps(provenance(
            files, version=project_version(), revision=revision, dirty=dirty, images=sources,
            platforms=[] if args.no_images else platforms, signed=signer is not None, started=started,
            builder=args.builder_id), indent=2) + "\n")
        files.append(statement)
        sums = write_sums(args.dist, files)
        written = [*files, sums, *([sign_file(signer, sums)] if signer else [])]
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path.relative_to(args.dist.parent) if path.is_relative_to(args.dist.parent) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
