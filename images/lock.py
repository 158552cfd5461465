"""Write (or check) the hash-pinned requirements the images install: images/<image>/requirements.lock.

Each image installs one extra of the project (operator: ``compilecache[operator]``, preloader:
``compilecache[preloader]``). Its lock pins every package that extra pulls in, and the build
requirements of the project itself (setuptools), to one version with the sha256 of every file PyPI
holds for that version (wheels of every platform and the sdist): the Dockerfile installs it with
``pip install --require-hashes``, so a build gets exactly these files or fails.

The first line of a lock records a digest of the parts of pyproject.toml it was made from
(``build-system.requires``, ``project.dependencies``, ``project.optional-dependencies``): the tests
fail when pyproject.toml changed and the lock was not regenerated.

    python images/lock.py                    # regenerate both (needs pip-tools and PyPI: pip install pip-tools)
    python images/lock.py --check            # exit 1 naming the locks that are older than pyproject.toml
    python images/lock.py --check-platforms  # pip downloads each lock for linux x86_64 and aarch64, CPython 3.11
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
EXTRAS = {"operator": "operator", "preloader": "preloader"}
"""Image -> the extra its Dockerfile installs."""
PLATFORMS = ("manylinux2014_x86_64", "manylinux2014_aarch64")
PYTHON = "3.11"
DIGEST_PREFIX = "# pyproject-digest: "


def lock_path(image: str) -> Path:
    return ROOT / "images" / image / "requirements.lock"


def pyproject_digest(text: str) -> str:
    """sha256 of what a lock depends on in pyproject.toml, in a canonical form."""
    data = tomllib.loads(text)
    project = data.get("project", {})
    relevant = {
        "build-system.requires": data.get("build-system", {}).get("requires", []),
        "project.dependencies": project.get("dependencies", []),
        "project.optional-dependencies": project.get("optional-dependencies", {}),
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()


def recorded_digest(lock_text: str) -> str | None:
    first = lock_text.splitlines()[0] if lock_text else ""
    return first.removeprefix(DIGEST_PREFIX) if first.startswith(DIGEST_PREFIX) else None


def stale_locks() -> list[str]:
    """The locks that are missing or were made from another pyproject.toml."""
    want = pyproject_digest(PYPROJECT.read_text())
    return [
        str(lock_path(image).relative_to(ROOT))
        for image in EXTRAS
        if not lock_path(image).is_file() or recorded_digest(lock_path(image).read_text()) != want
    ]


def compile_lock(image: str) -> None:
    """Resolve the image's extra with pip-compile and write its lock."""
    pip_compile = shutil.which("pip-compile") or str(Path(sys.executable).parent / "pip-compile")
    if not Path(pip_compile).exists():
        raise SystemExit("pip-compile not found: pip install pip-tools")
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "requirements.lock"
        argv = [pip_compile, "--quiet", "--generate-hashes", "--allow-unsafe", "--strip-extras", "--no-header",
                "--no-emit-find-links", "--no-emit-index-url", "--extra", EXTRAS[image], "--all-build-deps",
                "--output-file", str(out), "pyproject.toml"]
        # From PyPI only: no local wheel directory of this machine's pip configuration.
        env = {**os.environ, "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}
        subprocess.run(argv, cwd=ROOT, env=env, check=True)
        body = without_the_project(out.read_text())
    header = (
        f"{DIGEST_PREFIX}{pyproject_digest(PYPROJECT.read_text())}\n"
        f"# compilecache[{EXTRAS[image]}] and the project's build requirements, every file hashed.\n"
        "# Written by images/lock.py (pip-compile --generate-hashes); do not edit: run `python images/lock.py`.\n"
    )
    lock_path(image).write_text(header + body)


def without_the_project(lock: str) -> str:
    """The lock without the stanza of compilecache itself (its extras name it; the Dockerfile
    installs it from the build context with --no-deps)."""
    out: list[str] = []
    skipping = False
    for line in lock.splitlines(keepends=True):
        if line.startswith("# WARNING: pip install will require the following package to be hashed."):
            continue
        if line.startswith("# Consider using a hashable URL"):
            continue
        if line.startswith("compilecache @ "):
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        out.append(line)
    return "".join(out)


def check_platforms() -> int:
    """pip downloads every locked file for each platform (binary wheels only, or pure Python): fails
    naming the platform a package has no file for."""
    failed = 0
    for image in EXTRAS:
        for platform in PLATFORMS:
            with tempfile.TemporaryDirectory() as scratch:
                argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "--only-binary=:all:", "--platform", platform, "--python-version", PYTHON,
                        "--implementation", "cp", "-r", str(lock_path(image)), "-d", scratch]
                proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            verdict = "ok" if proc.returncode == 0 else "FAILED"
            print(f"{image} {platform} cp{PYTHON.replace('.', '')}: {verdict}")
            if proc.returncode != 0:
                print(proc.stderr.strip()[-2000:], file=sys.stderr)
                failed += 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="only check that the locks match pyproject.toml")
    mode.add_argument("--check-platforms", action="store_true", help="download each lock for every platform")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_locks()
        for path in stale:
            print(f"{path}: older than pyproject.toml; run python images/lock.py", file=sys.stderr)
        return 1 if stale else 0
    if args.check_platforms:
        return check_platforms()
    for image in EXTRAS:
        compile_lock(image)
        print(f"wrote {lock_path(image).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
