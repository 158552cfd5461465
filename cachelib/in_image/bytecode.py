"""Byte code as a bundle part: the compiled Python of what a compiled workload imports.

Images built without ``.pyc`` files, or run with ``PYTHONDONTWRITEBYTECODE=1`` (uv's default,
and common in slim images), compile torch's, sympy's and the model libraries' Python from source
in every new process: seconds before the first output, compiled or not. The warm-up runs in the
pod's own image, so it can ship that byte code:

- after the warm-up, :func:`imported_sources` lists the source files of every module the process
  imported (torch, Triton, sympy, the model's libraries, the standard library);
- :func:`image_has_bytecode` tells whether the image already carries valid ``.pyc`` files beside
  them (then nothing ships: a ``PYTHONPYCACHEPREFIX`` would hide them);
- otherwise :func:`write_tree` compiles them into a ``PYTHONPYCACHEPREFIX`` tree
  (``<cache dir>/compilecache-pycache/<absolute source path>``) with a manifest, which travels in
  the bundle's ``cachedir`` part; the webhook points ``PYTHONPYCACHEPREFIX`` at it only for
  bundles that carry it.

Every ``.pyc`` is a *checked-hash* pyc (PEP 552): Python hashes the source at each import and
recompiles from the source when it differs, so a changed file is never run stale, whatever its
size and modification time. The tree only ever reaches pods of the same image (bundles are keyed
by image) and the manifest names the Python it was made for; another interpreter ignores it
(another cache tag in the file names).

Standard library only (copied beside ``harness.py`` into warm-up containers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PYCACHE_DIR = "compilecache-pycache"
"""The tree's directory at the top of the cache directory."""
PYCACHE_ENV = "PYTHONPYCACHEPREFIX"
MANIFEST_NAME = "compilecache-pycache.json"
MANIFEST_FORMAT = 1
IMAGE_HAS_BYTECODE = 0.9
"""Share of imported sources with a valid ``.pyc`` beside them above which the image counts as
carrying its own byte code (nothing ships)."""


@dataclass(frozen=True)
class Tree:
    """What :func:`write_tree` wrote, or why nothing."""

    files: int
    bytes: int
    sources: int
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "bytes": self.bytes, "sources": self.sources, "skipped": self.skipped}


def imported_sources(modules: Iterable[Any] | None = None) -> list[Path]:
    """The ``.py`` files of the loaded modules (``sys.modules`` by default), sorted, existing ones only."""
    found = set()
    for module in list(sys.modules.values()) if modules is None else modules:
        spec = getattr(module, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not isinstance(origin, str) or not origin.endswith(".py") or not getattr(spec, "has_location", False):
            continue
        path = Path(origin)
        if path.is_absolute() and path.is_file():
            found.add(path)
    return sorted(found)


def bytecode_path(source: Path, prefix: Path | None) -> Path:
    """Where Python looks for the ``.pyc`` of ``source``: beside it (``__pycache__``) without a
    prefix, under ``prefix`` (mirroring the source's absolute path) with one."""
    saved = sys.pycache_prefix
    sys.pycache_prefix = None if prefix is None else str(prefix)
    try:
        return Path(importlib.util.cache_from_source(str(source)))
    finally:
        sys.pycache_prefix = saved


def valid_bytecode(source: Path, pyc: Path) -> bool:
    """Whether ``pyc`` is a byte-code file of this interpreter that matches ``source`` now
    (by source size and time, or by the source's hash), as the import system would accept it."""
    try:
        header = pyc.read_bytes()[:16]
        data = source.read_bytes()
        st = source.stat()
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:  # hash-based
        return header[8:16] == importlib.util.source_hash(data)
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == (int(st.st_mtime) & 0xFFFFFFFF) and size == (st.st_size & 0xFFFFFFFF)


def image_has_bytecode(sources: Iterable[Path]) -> tuple[bool, int, int]:
    """Whether the image carries valid byte code where this process's imports look for it (beside the
    sources, or under the image's own ``PYTHONPYCACHEPREFIX``); (it does, how many have it, of how many)."""
    listed = list(sources)
    prefix = Path(sys.pycache_prefix) if sys.pycache_prefix else None
    have = sum(1 for s in listed if valid_bytecode(s, bytecode_path(s, prefix)))
    return bool(listed) and have >= IMAGE_HAS_BYTECODE * len(listed), have, len(listed)


def write_tree(sources: Iterable[Path], cache_dir: Path) -> Tree:
    """Compile ``sources`` into ``cache_dir/compilecache-pycache`` as checked-hash pycs, with the
    manifest; nothing when the image carries its own byte code. Sources that do not compile
    (a syntax this Python refuses, an unreadable file) are left to Python in the pod."""
    listed = list(sources)
    has, have, total = image_has_bytecode(listed)
    if has:
        return Tree(0, 0, total, skipped=f"the image carries byte code for {have} of {total} imported modules")
    root = cache_dir / PYCACHE_DIR
    files = size = 0
    for source in listed:
        target = bytecode_path(source, root)
        try:
            py_compile.compile(
                str(source), cfile=str(target), doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )  # fmt: skip
        except (py_compile.PyCompileError, OSError, ValueError):
            continue
        files += 1
        size += target.stat().st_size
    write_manifest(root, {"files": files, "bytes": size, "sources": total})
    return Tree(files, size, total)


def interpreter() -> dict[str, str]:
    """The interpreter a tree is made for: its cache tag (``cpython-311``) and version."""
    return {"cache_tag": str(sys.implementation.cache_tag), "python": sys.version.split()[0]}


def write_manifest(root: Path, counts: Mapping[str, int]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / MANIFEST_NAME
    partial = root / f".{MANIFEST_NAME}.partial"
    partial.write_text(json.dumps({"format": MANIFEST_FORMAT, **interpreter(), **counts}, sort_keys=True) + "\n")
    os.replace(partial, path)
    return path


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    """The tree's manifest in ``cache_dir``; None when there is no tree or it cannot be read."""
    try:
        value = json.loads((cache_dir / PYCACHE_DIR / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("format") == MANIFEST_FORMAT else None
