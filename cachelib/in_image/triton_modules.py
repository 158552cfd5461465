"""Triton's compiled C modules as a bundle part: no C compiler needed, and none run, at a warm start.

Triton builds small C extension modules with the image's C compiler the first time a process
needs them: its driver utilities (``cuda_utils``, ``hip_utils``) and, where Inductor does not
launch kernels itself, kernel launchers (``__triton_launcher``). It keeps each one in its cache
directory (``$TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``, else ``~/.triton/cache``)
under ``<key>/<name><EXT_SUFFIX>``, where ``key`` hashes the module's C source and the platform
(``triton.runtime.build.compile_module_from_src``), and looks there before compiling. Every new
container starts without them: on an H100 host each warm pod compiled ``cuda_utils`` with gcc
again, and an image without a C compiler could not start warm at all.

The warm-up runs in the pod's image: :func:`collect` copies the modules it finds into the cache
directory (``compilecache-triton-modules/<key>/<file>``), which travels in the bundle; in the pod,
:func:`install` (called by ``cachelib.runtime.warm_start()``) puts each one where that process's
Triton looks, unless a file is there already. A module of another Triton or another platform has
another key, so Triton never looks at it; one that fails to load is rebuilt by Triton as without
the part (its own fallback).

Standard library only (copied beside ``harness.py`` into warm-up containers).
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PART_DIR = "compilecache-triton-modules"
"""The part's directory at the top of the cache directory."""
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
INDUCTOR_TRITON_DIR = "triton"
"""Inductor's own Triton cache below its cache directory (``<cache dir>/triton/<device>``), which it
sets as ``$TRITON_CACHE_DIR`` when none is set."""


def extension_suffix() -> str:
    """The file ending of this interpreter's C extension modules (``.cpython-312-x86_64-linux-gnu.so``)."""
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def triton_cache_dirs(environ: Mapping[str, str], cache_dir: Path | None, every: bool = False) -> list[Path]:
    """Where this process's Triton keeps compiled modules: ``$TRITON_CACHE_DIR`` when set; else its home
    cache, and Inductor's per-device directories below ``cache_dir`` (Inductor points Triton there once
    its first kernel is set up, so a module built later lands there). ``every``: all of them, for a
    process in which Inductor may have set ``$TRITON_CACHE_DIR`` itself after Triton built a module."""
    explicit = environ.get("TRITON_CACHE_DIR")
    if explicit and not every:
        return [Path(explicit)]
    home = environ.get("TRITON_HOME") or environ.get("HOME") or os.path.expanduser("~")
    found = ([Path(explicit)] if explicit else []) + [Path(home) / ".triton" / "cache"]
    inductor = cache_dir / INDUCTOR_TRITON_DIR if cache_dir is not None else None
    if inductor is not None and inductor.is_dir():
        found += sorted(p for p in inductor.iterdir() if p.is_dir())
    return found


def compiled_modules(root: Path, suffix: str) -> dict[str, Path]:
    """``{"<key>/<file>": path}`` of the C extension modules directly under ``root``'s key directories
    (kernels are ``.cubin``/``.json``/IR files, never extension modules)."""
    if not root.is_dir():
        return {}
    found: dict[str, Path] = {}
    for key_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for module in sorted(key_dir.glob(f"*{suffix}")):
            if module.is_file() and not module.is_symlink():
                found[f"{key_dir.name}/{module.name}"] = module
    return found


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` shipped."""

    files: int
    bytes: int
    names: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "modules": sorted({n.split("/")[-1] for n in self.names})}


def collect(cache_dir: Path, environ: Mapping[str, str] | None = None) -> Collected:
    """Copy the compiled modules of this process's Triton into ``cache_dir``'s part (after the warm-up
    compiled); an empty part is not written."""
    env = os.environ if environ is None else environ
    suffix = extension_suffix()
    modules: dict[str, Path] = {}
    for root in triton_cache_dirs(env, cache_dir, every=True):
        if root.resolve().is_relative_to((cache_dir / PART_DIR).resolve()):
            continue
        for name, path in compiled_modules(root, suffix).items():
            modules.setdefault(name, path)
    if not modules:
        return Collected(0, 0)
    part = cache_dir / PART_DIR
    size = 0
    for name, path in modules.items():
        target = part / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        size += target.stat().st_size
    manifest = {"format": MANIFEST_FORMAT, "suffix": suffix, "modules": sorted(modules)}
    (part / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return Collected(len(modules), size, sorted(modules))


def read_part(cache_dir: Path) -> list[str]:
    """The modules of the part in ``cache_dir`` that this interpreter can load (its extension suffix);
    empty when there is no part or its manifest is unreadable."""
    try:
        manifest = json.loads((cache_dir / PART_DIR / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return []
    if manifest.get("suffix") != extension_suffix():
        return []
    names = manifest.get("modules")
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and _safe_name(n)]


def _safe_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(p and p not in (".", "..") and not p.startswith(".") for p in parts)


@dataclass
class Installed:
    """What :func:`install` did: modules put in place, found there already, and why not where it failed."""

    placed: int = 0
    present: int = 0
    problems: list[str] = field(default_factory=list)


def install(cache_dir: Path, environ: Mapping[str, str] | None = None) -> Installed:
    """Put the part's modules where this process's Triton looks (each of :func:`triton_cache_dirs`),
    atomically, never over a file that is there. Never raises: what could not be done is listed."""
    env = os.environ if environ is None else environ
    done = Installed()
    names = read_part(cache_dir)
    for root in triton_cache_dirs(env, cache_dir) if names else []:
        for name in names:
            _install_one(cache_dir / PART_DIR / name, root / name, done)
    return done


def _install_one(source: Path, target: Path, done: Installed) -> None:
    if target.exists():
        done.present += 1
        return
    temporary = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(handle)
        shutil.copyfile(source, temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except OSError as exc:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
        done.problems.append(f"{target}: {exc.strerror or exc}")
        return
    done.placed += 1


def installed_everywhere(cache_dir: Path, roots: Iterable[Path]) -> bool:
    """Whether every module of the part is present under each of ``roots`` (a check for tests and tools)."""
    names = read_part(cache_dir)
    return bool(names) and all((root / name).is_file() for root in roots for name in names)
