"""Builders shared by the cachelib tests: keys, harness-like output directories, bundles."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cachelib.keyformat import CacheKey

ROOT = Path(__file__).resolve().parents[2]

BASE_FIELDS = {
    "namespace": "team-a",
    "name": "llama",
    "model": "0123456789abcdef",
    "options": "fedcba9876543210",
    "gpu": "nvidia-h100-80gb-hbm3",
    "capability": "sm90",
    "torch": "2.13.0+cu128",
    "triton": "3.6.0",
    "cuda": "12.8",
    "py": "3.11",
}


def make_key(**overrides: str) -> CacheKey:
    return CacheKey(**{**BASE_FIELDS, **overrides})


def make_outdir(
    path: Path, key: CacheKey, *, files: dict[str, bytes] | None = None, megacache: bytes = b"mega"
) -> Path:
    """A directory shaped like the harness's output: result.json, megacache.bin, cachedir/."""
    files = (
        files
        if files is not None
        else {
            "fxgraph/ab/fabc/entry": b"graph" * 100,
            "aotautograd/aa/entry": b"aot" * 50,
            "xy/cxy.so": os.urandom(4096),
            "triton/0/KERNEL/kernel.json": b"{}",
            "locks/cxy.lock": b"",
        }
    )
    cachedir = path / "cachedir"
    for rel, data in files.items():
        (cachedir / rel).parent.mkdir(parents=True, exist_ok=True)
        (cachedir / rel).write_bytes(data)
    cachedir.mkdir(parents=True, exist_ok=True)
    (path / "megacache.bin").write_bytes(megacache)
    result = {
        "format": 1,
        "producer": "compilecache-harness/1",
        "created": "2026-01-01T00:00:00+00:00",
        "key": key.to_dict(),
        "key_string": str(key),
        "job_id": f"compilecache-{key.namespace}.{key.name}",
        "versions": {"torch": key.torch, "triton": key.triton, "cuda": key.cuda, "python": "3.11.7"},
        "options": {"mode": "default"},
        "targets": [{"index": 0, "name": "M", "seconds": 1.5}],
        "compile_seconds": 1.5,
        "counters": {"inductor": {"fxgraph_cache_miss": 1}},
    }
    (path / "result.json").write_text(json.dumps(result))
    return path


def tree(root: Path) -> dict[str, str]:
    """rel path -> sha256 (or 'dir' / 'link:<target>') of everything under root."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            found[rel] = "dir"
        else:
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def content(root: Path) -> dict[str, str]:
    """:func:`tree` of a cache directory as the workload sees it: without the preloader's
    bookkeeping (completed-bundle markers and lock files, top-level ``.compilecache*``)."""
    return {rel: kind for rel, kind in tree(root).items() if not rel.startswith(".compilecache")}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``compilecache ARGS`` in a fresh interpreter (as a container would run it)."""
    return subprocess.run(
        [sys.executable, "-m", "cachelib.cli", *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=ROOT, timeout=timeout, check=False,
    )  # fmt: skip


def last_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in {stdout!r}"
    data: dict[str, Any] = json.loads(lines[-1])
    return data
