"""The project's two images (operator, preloader) built with podman for the tests, once per content.

No Docker engine and no registry: the base image is made locally and everything is built with
``--pull=never``.

1. Base: ``localhost/compilecache-pybase:bookworm``, a Debian bookworm ``minbase`` root file system made
   by ``mmdebstrap`` with Python 3.11 (``python3``, ``python3-venv``, ``python-is-python3``,
   ``ca-certificates``, ``netbase``) and ``podman import``-ed. Made once; remade only when the package
   list changes (it is recorded in the label ``io.compilecache.base-packages``).
2. Images: ``images/<name>/Dockerfile`` built from the repository root with its own
   ``Dockerfile.dockerignore`` as the ignore file, the Dockerfile's build arguments pointing at the base
   (``PYTHON_IMAGE=localhost/compilecache-pybase``, ``PYTHON_DIGEST=<the base's digest>``),
   ``--network=host``, and the host's CA bundle mounted read-only over the base's own
   ``/etc/ssl/certs/ca-certificates.crt`` in every ``RUN`` step: pip behind a TLS-intercepting proxy needs
   the proxy's CA, and Debian's pip (the one ``python -m venv`` puts into the build's venv) reads the system
   bundle. No ``pip.conf`` is mounted: a bind mount onto a path the base lacks leaves an empty file at that
   path in the image, and the images must carry nothing of the build host. Built with ``--layers=false``:
   the inputs label is part of every layer's configuration, so no layer of an older build could be
   reused anyway, and no intermediate images pile up.
3. Tags: ``localhost/compilecache-<name>:<inputs hash>``, the first 12 hex digits of a sha256 over
   everything that goes into the image (the Dockerfile, its ignore file, every file the ignore file lets
   into the build context: ``pyproject.toml``, ``README.md``, ``cachelib/``, ``operator/``,
   ``images/slim.py``, ``images/<name>/requirements.lock``; and the base's digest), plus the moving tag
   ``localhost/compilecache-<name>:test``.
   An image whose hash tag exists is reused; podman's storage lives outside the checkout, so a fresh
   clone on a warm machine builds nothing. Older hash tags of the same image are removed.

Every podman call runs with ``CONTAINERS_CONF`` pointing at ``tests/infra/podman-containers.conf``
(runc, ulimits that fit these hosts): use ``podman_env()`` for your own calls. A missing ``podman``,
``runc`` or ``mmdebstrap`` is installed with apt when running as root (or with sudo), else
``ImagesUnavailable`` names the packages to install.

API::

    ensure_images() -> {"operator": "localhost/compilecache-operator:<hash12>", "preloader": ...}
    podman_env() -> os.environ plus CONTAINERS_CONF
    podman_usable() -> None, or the reason podman cannot run containers here

Shell entry (used by the test set-up)::

    python -m tests.infra.images            # build what is missing, print name=reference lines
    python -m tests.infra.images --check    # exit 1 when an image for the current inputs is missing
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = Path(__file__).resolve().parent / "podman-containers.conf"
REGISTRY = "localhost"
TEST_TAG = "test"
HASH_LENGTH = 12
# Bump when the way images are built changes without any input file changing.
BUILD_FORMAT = "1"

BASE_REPOSITORY = f"{REGISTRY}/compilecache-pybase"
BASE_TAG = "bookworm"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "netbase")
BASE_LABEL = "io.compilecache.base-packages"
INPUTS_LABEL = "io.compilecache.inputs"

IMAGE_NAMES = ("operator", "preloader")
# The tools and the Debian packages that bring them.
TOOLS = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap"}

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the base (ca-certificates) keeps its bundle: mounting onto an existing file leaves no trace in a layer.
BUILD_CA_PATH = "/etc/ssl/certs/ca-certificates.crt"

Log = Callable[[str], None]


class ImagesUnavailable(RuntimeError):
    """podman or mmdebstrap is missing, or a build failed; the message says which and why."""


def _stderr_log(message: str) -> None:
    print(f"images: {message}", file=sys.stderr, flush=True)


# -- podman ------------------------------------------------------------------------------------------


def podman_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for every podman call: ``base`` (default os.environ) plus CONTAINERS_CONF and
    CONTAINERS_STORAGE_CONF (:func:`storage_conf`)."""
    return {**(os.environ if base is None else base), "CONTAINERS_CONF": str(CONTAINERS_CONF),
            "CONTAINERS_STORAGE_CONF": str(storage_conf())}


def storage_conf_text(root: Path) -> str:
    """containers-storage.conf with images under ``root``/storage, and a run root of its own (two graph roots must
    never share one)."""
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return (f'[storage]\ndriver = "overlay"\ngraphroot = "{root}/storage"\n'
            f'runroot = "/run/compilecache-test-containers/{digest}"\n')


def storage_conf(cache: Path | None = None) -> Path:
    """The tests' podman keeps its images under the test cache, ``$COMPILECACHE_TEST_CACHE/containers`` (written
    once): like every other build of the set-up, an empty cache is a machine without them."""
    root = (cache or cache_root()) / "containers"
    conf = root / "storage.conf"
    text = storage_conf_text(root)
    if not conf.is_file() or conf.read_text() != text:
        root.mkdir(parents=True, exist_ok=True)
        tmp = conf.with_name(f".storage.conf.{os.getpid()}")
        tmp.write_text(text)
        tmp.rename(conf)
    return conf


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``podman ARGS`` with the project's containers.conf; raise ImagesUnavailable on failure."""
    command = ["podman", *args]
    try:
        proc = subprocess.run(command, env=podman_env(), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise ImagesUnavailable("podman is not installed (Debian: apt-get install podman runc)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImagesUnavailable(f"{' '.join(command)} did not finish in {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        raise ImagesUnavailable(f"{' '.join(command)} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def podman_usable() -> str | None:
    """None when podman can run a container here, else why not (for skip and failure messages)."""
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install podman runc)"
    if shutil.which("runc") is None:
        return "runc is not installed (Debian: apt-get install runc)"
    try:
        proc = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", timeout=60, check=False)
    except ImagesUnavailable as exc:
        return str(exc)
    if proc.returncode != 0:
        return f"`podman info` failed: {proc.stderr.strip()[-800:]}"
    return None


def image_exists(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


def image_digest(reference: str) -> str:
    """The ``sha256:...`` digest podman records for a local image."""
    digest = podman("image", "inspect", "--format", "{{.Digest}}", reference).stdout.strip()
    if not digest.startswith("sha256:"):
        raise ImagesUnavailable(f"{reference} has no sha256 digest (podman image inspect said {digest!r})")
    return digest


def image_label(reference: str, label: str) -> str:
    return podman("image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', reference).stdout.strip()


# -- tools -------------------------------------------------------------------------------------------


def missing_tools(which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Debian packages to install for the tools that are not on PATH."""
    return [package for tool, package in TOOLS.items() if which(tool) is None]


def apt_install_command(packages: Sequence[str], is_root: bool, have_sudo: bool) -> list[list[str]] | None:
    """The commands that install ``packages`` like scripts/_env.sh's apt_install, or None without root."""
    if not packages:
        return []
    if not is_root and not have_sudo:
        return None
    prefix = [] if is_root else ["sudo"]
    return [
        [*prefix, "apt-get", "update", "-qq"],
        [*prefix, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq",
         "--no-install-recommends", *packages],
    ]  # fmt: skip


def require_tools(log: Log = _stderr_log) -> None:
    """Install podman, runc and mmdebstrap with apt when missing (as root or with sudo), else explain."""
    packages = missing_tools()
    commands = apt_install_command(packages, os.geteuid() == 0, shutil.which("sudo") is not None)
    if commands is None:
        raise ImagesUnavailable(
            f"missing {', '.join(packages)}: install them as root (apt-get install {' '.join(packages)})"
        )
    for command in commands:
        log(" ".join(command))
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise ImagesUnavailable(f"{' '.join(command)} failed: {proc.stderr.strip()[-1500:]}")
    still = missing_tools()
    if still:
        raise ImagesUnavailable(f"still missing after apt-get install: {', '.join(still)}")


# -- what goes into an image -------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRecipe:
    name: str
    dockerfile: Path
    ignore_file: Path

    @property
    def repository(self) -> str:
        return f"{REGISTRY}/compilecache-{self.name}"


def recipe(name: str, root: Path = REPO_ROOT) -> ImageRecipe:
    directory = root / "images" / name
    return ImageRecipe(name, directory / "Dockerfile", directory / "Dockerfile.dockerignore")


def parse_ignore_file(text: str) -> tuple[list[str], list[str]]:
    """(included paths, excluded patterns) of a ``*``-first .dockerignore: ``!path`` lines let a path in,
    other lines (``**/__pycache__``) keep matching paths out. Anything else is refused, since the hash
    would no longer describe the build context."""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or lines[0] != "*":
        raise ValueError("the ignore file must start with `*` (everything out, then `!path` lines let paths in)")
    included = [line[1:].strip("/") for line in lines[1:] if line.startswith("!")]
    excluded = [line for line in lines[1:] if not line.startswith("!")]
    return included, excluded


def is_excluded(relative: PurePosixPath, patterns: Sequence[str]) -> bool:
    """Whether a context path matches one of the ignore file's exclusion patterns (``**/`` = any depth)."""
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in relative.parts):
                return True
        elif fnmatch.fnmatchcase(str(relative), pattern.strip("/")):
            return True
    return False


def context_files(root: Path, ignore_text: str) -> list[PurePosixPath]:
    """The files of the build context the ignore file lets in, sorted; a missing included path is an error."""
    included, excluded = parse_ignore_file(ignore_text)
    files: set[PurePosixPath] = set()
    for entry in included:
        path = root / entry
        if path.is_file():
            candidates = [path]
        elif path.is_dir():
            candidates = [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
        else:
            raise ValueError(f"the ignore file lets in {entry!r}, which does not exist under {root}")
        for candidate in candidates:
            relative = PurePosixPath(candidate.relative_to(root).as_posix())
            if not is_excluded(relative, excluded):
                files.add(relative)
    return sorted(files)


def inputs_hash(root: Path, image: ImageRecipe, base_digest: str) -> str:
    """sha256 over the Dockerfile, its ignore file, every context file (path, executable bit, bytes) and the
    base's digest."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("format", BUILD_FORMAT.encode())
    add("base", base_digest.encode())
    add("dockerfile", image.dockerfile.read_bytes())
    ignore_text = image.ignore_file.read_text()
    add("ignorefile", ignore_text.encode())
    for relative in context_files(root, ignore_text):
        path = root / relative
        executable = "x" if os.access(path, os.X_OK) else "-"
        add(f"file:{relative}:{executable}", path.read_bytes())
    return digest.hexdigest()


def tags_for(image: ImageRecipe, full_hash: str) -> tuple[str, str]:
    """(content tag, moving test tag)."""
    return f"{image.repository}:{full_hash[:HASH_LENGTH]}", f"{image.repository}:{TEST_TAG}"


# -- commands ----------------------------------------------------------------------------------------


def base_reference() -> str:
    return f"{BASE_REPOSITORY}:{BASE_TAG}"


def mmdebstrap_command(target: Path) -> list[str]:
    return ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", BASE_SUITE, str(target)]


def import_command(tarball: Path) -> list[str]:
    return ["import", "--change", 'CMD ["python3"]', "--change", f"LABEL {BASE_LABEL}={','.join(BASE_PACKAGES)}",
            str(tarball), base_reference()]  # fmt: skip


def build_command(image: ImageRecipe, base_digest: str, full_hash: str, ca_bundle: Path = HOST_CA_BUNDLE) -> list[str]:
    """``podman build`` arguments (without ``podman``) for one image, from the repository root."""
    content_tag, test_tag = tags_for(image, full_hash)
    return [
        "build",
        "--file", str(image.dockerfile),
        "--ignorefile", str(image.ignore_file),
        "--pull=never",
        "--network=host",
        "--layers=false",
        "--build-arg", f"PYTHON_IMAGE={BASE_REPOSITORY}",
        "--build-arg", f"PYTHON_DIGEST={base_digest}",
        "--volume", f"{ca_bundle}:{BUILD_CA_PATH}:ro",
        "--label", f"{INPUTS_LABEL}={full_hash}",
        "--tag", content_tag,
        "--tag", test_tag,
        str(image.dockerfile.parents[2]),
    ]  # fmt: skip


# -- building ----------------------------------------------------------------------------------------


def cache_root() -> Path:
    """The test cache directory shared by all test infrastructure (outside the checkout)."""
    default = Path.home() / ".cache" / "compilecache-test"
    return Path(os.environ.get("COMPILECACHE_TEST_CACHE") or default)


@contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time on this machine (two test runs share podman's storage)."""
    directory = cache_root() / "images"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_logged(command: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> None:
    with tempfile.TemporaryFile(mode="w+") as out:
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
        except FileNotFoundError as exc:
            raise ImagesUnavailable(f"{what}: {command[0]} is not installed") from exc
        except subprocess.TimeoutExpired as exc:
            raise ImagesUnavailable(f"{what} did not finish in {timeout:.0f} s") from exc
        if proc.returncode != 0:
            out.seek(0)
            raise ImagesUnavailable(f"{what} failed (exit {proc.returncode}):\n{out.read()[-4000:]}")


def ensure_base(log: Log = _stderr_log) -> str:
    """The base image's reference, made with mmdebstrap when missing or made from another package list."""
    reference = base_reference()
    if image_exists(reference) and image_label(reference, BASE_LABEL) == ",".join(BASE_PACKAGES):
        return reference
    started = time.monotonic()
    log(f"making {reference} with mmdebstrap ({', '.join(BASE_PACKAGES)})")
    work = cache_root() / "images"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work, prefix=".base-") as tmp:
        tarball = Path(tmp) / "base.tar"
        _run_logged(mmdebstrap_command(tarball), "mmdebstrap", timeout=1800)
        _run_logged(["podman", *import_command(tarball)], "podman import", timeout=600, env=podman_env())
    log(f"{reference} made in {time.monotonic() - started:.0f} s")
    return reference


def ensure_image(image: ImageRecipe, base_digest: str, root: Path = REPO_ROOT, log: Log = _stderr_log) -> str:
    """The image's content-tagged reference, built only when no image has that tag yet."""
    full_hash = inputs_hash(root, image, base_digest)
    content_tag, test_tag = tags_for(image, full_hash)
    if image_exists(content_tag):
        podman("tag", content_tag, test_tag)
    else:
        if not HOST_CA_BUNDLE.is_file():
            raise ImagesUnavailable(f"{HOST_CA_BUNDLE} is missing (Debian: apt-get install ca-certificates)")
        started = time.monotonic()
        log(f"building {content_tag} from {image.dockerfile.relative_to(root)}")
        command = ["podman", *build_command(image, base_digest, full_hash)]
        _run_logged(command, f"podman build of {image.name}", timeout=1800, env=podman_env())
        log(f"{content_tag} built in {time.monotonic() - started:.0f} s")
    return content_tag


def stale_images(listing: str, repositories: Sequence[str], keep_hashes: set[str]) -> tuple[list[str], list[str]]:
    """From ``podman images --all`` lines ``ID REPOSITORY:TAG INPUTS``: (tags to remove, untagged image IDs to
    remove). Stale are the tags of ``repositories`` other than a current hash or ``test``, and untagged images
    labelled with inputs that are not current (left over by interrupted or older builds)."""
    keep_tags = {h[:HASH_LENGTH] for h in keep_hashes} | {TEST_TAG}
    tags: list[str] = []
    ids: list[str] = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) != 3:  # no inputs label ("<no value>"): not ours
            continue
        image_id, reference, inputs = fields
        repository, _, tag = reference.rpartition(":")
        if repository in repositories and tag not in keep_tags:
            tags.append(reference)
        elif reference == "<none>:<none>" and inputs not in keep_hashes and image_id not in ids:
            ids.append(image_id)
    return tags, ids


def remove_stale_images(keep_hashes: set[str], repositories: Sequence[str]) -> None:
    """Free the storage of older builds: remove stale tags (an image goes with its last tag) and untagged
    leftovers. A machine shared by checkouts at different commits keeps the images of the latest build."""
    row = f'{{{{.ID}}}} {{{{.Repository}}}}:{{{{.Tag}}}} {{{{index .Labels "{INPUTS_LABEL}"}}}}'
    listing = podman("images", "--all", "--format", row).stdout
    tags, ids = stale_images(listing, repositories, keep_hashes)
    for reference in [*tags, *ids]:
        podman("rmi", reference, check=False)


def ensure_images(root: Path = REPO_ROOT, log: Log = _stderr_log) -> dict[str, str]:
    """Build (or reuse) both images; returns image name -> reference (``localhost/compilecache-NAME:HASH``)."""
    require_tools(log)
    reason = podman_usable()
    if reason:
        raise ImagesUnavailable(reason)
    with build_lock():
        base_digest = image_digest(ensure_base(log))
        images = {name: ensure_image(recipe(name, root), base_digest, root, log) for name in IMAGE_NAMES}
        current = {image_label(reference, INPUTS_LABEL) for reference in images.values()}
        remove_stale_images(current, [recipe(name, root).repository for name in IMAGE_NAMES])
        return images


def current_references(root: Path = REPO_ROOT) -> dict[str, str | None]:
    """name -> the reference for the current inputs if that image exists, else None (builds nothing)."""
    reference = base_reference()
    if not image_exists(reference):
        return dict.fromkeys(IMAGE_NAMES)
    digest = image_digest(reference)
    out: dict[str, str | None] = {}
    for name in IMAGE_NAMES:
        content_tag, _ = tags_for(recipe(name, root), inputs_hash(root, recipe(name, root), digest))
        out[name] = content_tag if image_exists(content_tag) else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.images", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report whether the images are built")
    args = parser.parse_args(argv)
    try:
        if args.check:
            found = current_references()
            for name, reference in found.items():
                print(f"{name}={reference or 'missing'}")
            return 0 if all(found.values()) else 1
        started = time.monotonic()
        images = ensure_images()
    except (ImagesUnavailable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, reference in images.items():
        print(f"{name}={reference}")
    _stderr_log(f"ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
