"""The precompiled part of a warm-up's output (``--precompile auto``): the second pass run in a fresh
process and its files added to the first pass's, the Mega-Cache merged with its artifacts or stripped of
them once the check left the part out, the check recorded in the manifest, and the lines a person reads.

Standard library (and torch, imported where used) only: the warm-up Job copies this module beside the
harness into the user's image.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.precompileparts
    from cachelib.in_image import compilestep, podcontract
else:  # in the warm-up pod: copied beside the harness
    import compilestep
    import podcontract

LOG_FILE = "warmup.log"
"""In OUT: what the harness kept out of its own output (torch's dropped-guard warnings, in full)."""
DROPPED_GUARD = "is dropped with caching_precompile=True"
MEGACACHE_FILE = podcontract.MEGACACHE_FILE
PRECOMPILE_ENV = podcontract.PRECOMPILE_ENV
JOB_ID_ENV = podcontract.JOB_ID_ENV
PASS_FILE = "precompile-pass.json"
PASS_SCRATCH = (".precompile-pass", ".precompile-pass-cache")
"""The second pass's output and cache directory in the first's ``--out`` (removed once merged)."""




class Options(Protocol):
    def harness_args(self) -> Sequence[str]: ...


class PassRequest(Protocol):
    """What the second pass reads of the harness's request."""

    @property
    def out(self) -> Path: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def target(self) -> str | None: ...
    @property
    def options(self) -> Options: ...
    @property
    def cache_path(self) -> Path: ...


class DroppedGuards(logging.Filter):
    """Dynamo says, one warning per guard, each guard that caching precompile cannot save (118 for a
    Hugging Face Llama): counted here and written to OUT/warmup.log instead of the harness's output,
    where they buried the one line that matters."""

    def __init__(self, log_path: Path) -> None:
        super().__init__()
        self.count = 0
        self.log_path = log_path

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if DROPPED_GUARD not in message:
            return True
        self.count += 1
        with contextlib.suppress(OSError), self.log_path.open("a") as f:
            f.write(f"{record.name}: {message}\n")
        return False


def precompile_in_fresh_process(
    request: PassRequest, harness: Path, flag: str, job_id: str, compile_seconds: float
) -> dict[str, Any]:
    """``--precompile auto``'s second pass, in a fresh process of the same image: the target once more,
    with Dynamo's caching precompile on from the start (``TORCH_CACHING_PRECOMPILE=1`` before torch is
    imported), into a cache directory of its own, whose files are then added to the first pass's (Off's)
    where they are new: Dynamo's precompiled entries, AOTAutograd's in the bundled form caching precompile
    reads. Its own directory and process, because on a GPU (torch 2.11) a compile whose FX graph came
    from a cache hit cannot save its bundled AOTAutograd entry (Triton's launchers are made already), and
    the precompiled entry it saved then lacked its backend in every pod. What the pass did (seconds, cache
    counts, dropped guards, ``failure`` when compiling with caching precompile failed, ``megacache``: its
    Mega-Cache bytes). ``harness``: the harness file, run with ``flag`` as the pass."""
    assert request.target is not None
    scratch, own_cache = (request.out / name for name in PASS_SCRATCH)
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(own_cache, ignore_errors=True)
    argv = [sys.executable, str(harness), "--target", request.target, "--out", str(scratch),
            "--namespace", request.namespace, "--name", request.name, "--cache-dir", str(own_cache),
            *request.options.harness_args(), flag]  # fmt: skip
    env = {**os.environ, PRECOMPILE_ENV: "1", JOB_ID_ENV: job_id}
    started = time.perf_counter()
    timeout = max(600.0, 4 * compile_seconds)
    try:
        proc = subprocess.run(argv, env=env, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, timeout=timeout,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        proc = None
    try:
        record: dict[str, Any] = json.loads((scratch / PASS_FILE).read_text())
    except (OSError, ValueError):
        if proc is None:
            record = {"failure": f"the caching-precompile pass did not finish in {timeout:.0f} s"}
        else:
            sys.stderr.write(proc.stderr[-4000:])
            tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            record = {"failure": f"the caching-precompile pass failed (exit {proc.returncode}): {tail[:300]}"}
    if record.get("failure"):
        print(f"harness: {record['failure']}; the bundle ships the first pass's cache without a precompiled part",
              file=sys.stderr)  # fmt: skip
    else:
        record["added_files"] = add_missing_files(own_cache, request.cache_path)
    with contextlib.suppress(OSError):
        kept = (scratch / LOG_FILE).read_text()
        with (request.out / LOG_FILE).open("a") as log:
            log.write(kept)
    megacache = scratch / MEGACACHE_FILE
    record["megacache"] = megacache.read_bytes() if megacache.is_file() and not record.get("failure") else None
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(own_cache, ignore_errors=True)
    record["seconds"] = round(time.perf_counter() - started, 4)
    return record


def add_missing_files(source: Path, target: Path) -> int:
    """Copy every file of ``source`` into ``target`` under the same relative path where ``target`` has none
    (what both passes compiled is the same entry under the same key: the first pass's stays); how many."""
    added = 0
    for path in sorted(source.rglob("*")):
        if path.is_dir() or path.name.endswith((".lock", ".partial")) or path.parent.name == "locks":
            continue
        there = target / path.relative_to(source)
        if there.exists() or there.is_symlink():
            continue
        there.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, there, follow_symlinks=False)
        added += 1
    return added


def write_pass_record(out: Path, record: Mapping[str, Any]) -> None:
    compilestep.write_atomic(out / PASS_FILE, (json.dumps(dict(record), sort_keys=True) + "\n").encode())


def merge_megacache(out: Path, megacache: dict[str, Any], added: bytes | None) -> dict[str, Any]:
    """OUT/megacache.bin with the second pass's artifacts added (the precompiled ones among them); the
    first pass's alone when there are none, or when this torch's format cannot be merged (the cache
    directory carries everything either way)."""
    if not added:
        return megacache
    data = (out / MEGACACHE_FILE).read_bytes()
    merged = compilestep.load_companion("cachelib.in_image.precheck").merged_artifacts(data, added)
    if merged is None:
        return megacache
    compilestep.write_atomic(out / MEGACACHE_FILE, merged)
    from torch.compiler._cache import CacheArtifactManager

    kinds = CacheArtifactManager.deserialize(merged) or {}
    artifacts = {str(kind): len(items) for kind, items in kinds.items()}
    return {"bytes": len(merged), "sha256": hashlib.sha256(merged).hexdigest(), "artifacts": artifacts}


def megacache_after_check(out: Path, megacache: dict[str, Any], precompile: Mapping[str, Any]) -> dict[str, Any]:
    """The Mega-Cache less its precompiled entries when the check left them out (else unchanged)."""
    if precompile["check"]["verified"] or not megacache["artifacts"].get("precompile"):
        return megacache
    data = (out / MEGACACHE_FILE).read_bytes()
    kept = compilestep.load_companion("cachelib.in_image.precheck").without_precompiled_artifacts(data)
    kept = b"" if kept is None else kept
    compilestep.write_atomic(out / MEGACACHE_FILE, kept)
    artifacts = {k: v for k, v in megacache["artifacts"].items() if k != "precompile"} if kept else {}
    return {"bytes": len(kept), "sha256": hashlib.sha256(kept).hexdigest(), "artifacts": artifacts}


def record_check(cache_path: Path, check: Mapping[str, Any]) -> None:
    warmstart = compilestep.load_companion("cachelib.in_image.warmstart")
    manifest = warmstart.read_manifest(cache_path) or warmstart.build_manifest(cache_path)
    manifest["precompile_check"] = dict(check)
    warmstart.write_manifest(cache_path, manifest)


def release_compiled() -> None:
    """Free what the compile holds (models, device memory) before the check loads them again."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def precompile_summary(precompile: Mapping[str, Any], out: Path) -> list[str]:
    """The lines a person reads about the precompiled part (pure): one per entry of the target,
    verified or left out and why, and the dropped guards as one count."""
    check = precompile.get("check") or {}
    names = check.get("entry_names") or ["the target"]
    problems = [str(p) for p in check.get("problems") or []]
    lines = []
    for index, name in enumerate(names):
        if check.get("verified"):
            lines.append(f"precompile: entry {index} ({name}): verified, shipped")
            continue
        own = [p.split(": ", 1)[1] for p in problems if p.startswith(f"entry {index}: ")]
        lines.append(f"precompile: entry {index} ({name}): left out: {own[0] if own else check.get('reason')}")
    timed = check.get("first_call_seconds") or {}
    if timed.get("plain") and timed.get("precompiled"):
        with_part, without = (", ".join(f"{x:.2f}" for x in timed[role]) for role in ("precompiled", "plain"))
        lines.append(f"precompile: first call {with_part} s with the part, {without} s without")
    plain = check.get("plain") or {}
    if plain and not plain.get("verified"):
        lines.append(f"precompile: a pod without warm_start() would not start warm: {plain.get('reason')}")
    dropped = (precompile.get("pass") or {}).get("dropped_guards", 0)
    if dropped:
        lines.append(
            f"precompile: caching precompile dropped {dropped} guard(s) it cannot save (each in {out / LOG_FILE})"
        )
    return lines
