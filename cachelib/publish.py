"""From a harness output directory to a bundle in a store: pack, verify, put.

``pack`` turns ``OUT/{result.json,megacache.bin,cachedir/}`` into a v1 bundle file;
``publish`` packs (or takes a bundle file), reads the bundle back to verify every part,
then puts it into the store under its cache key (a store's put is atomic for readers).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachelib import __version__
from cachelib.bundle import (
    CACHEDIR_PART,
    CHUNK,
    DEFAULT_LEVEL,
    MEGACACHE_PART,
    HashingWriter,
    WrittenBundle,
    write_bundle_file,
)
from cachelib.bundlereader import bundle_digest_file, read_header_file, verify_bundle_file
from cachelib.in_image.podcontract import CACHEDIR, MEGACACHE_FILE, RESULT_FILE
from cachelib.keyformat import CacheKey, InvalidKey
from cachelib.progress import Watch, unwatched
from cachelib.stores import Store, open_store

EXCLUDED_TOP_LEVEL = frozenset({"locks"})
"""Inductor's lock files: transient, empty, never worth shipping."""


class PackError(ValueError):
    """The output directory cannot be packed; the message names the file or field."""


@dataclass(frozen=True)
class PublishResult:
    key: str
    sha256: str
    bytes: int
    store: str
    job_id: str
    created: str
    compile_seconds: float | None
    parts: dict[str, int]
    seconds: float
    versions: dict[str, str]
    digest: str = ""
    """The bundle digest (sha256 of preamble and header) that a signature covers."""
    precompile: dict[str, Any] | None = None
    """The warm-up's check of the precompiled part (:func:`precompile_verdict`), when it made one."""
    bytecode: dict[str, Any] | None = None
    """The bundle's byte-code part (:mod:`cachelib.in_image.bytecode`): files, bytes, or why none."""
    engine: dict[str, Any] | None = None
    """The engine a vLLM warm-up ran (:mod:`cachelib.in_image.vllmwarm`): its name, version and hash directories."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": "published",
            "key": self.key,
            "sha256": self.sha256,
            "bundle_digest": self.digest,
            "bytes": self.bytes,
            "store": self.store,
            "job_id": self.job_id,
            "created": self.created,
            "compile_seconds": self.compile_seconds,
            "parts": self.parts,
            "seconds": round(self.seconds, 3),
            "versions": self.versions,
        } | {k: v for k, v in (("precompile", self.precompile), ("bytecode", self.bytecode), ("engine", self.engine))
             if v is not None}


# -- the cache directory as a tar stream ---------------------------------------------------------
def cache_entries(root: Path) -> Iterator[Path]:
    """Every path under ``root`` to archive, sorted, without inductor's lock files."""
    for directory, dirnames, filenames in os.walk(root):
        rel = Path(directory).relative_to(root)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_TOP_LEVEL]
        dirnames.sort()
        for name in sorted(dirnames):
            yield Path(directory) / name
        for name in sorted(filenames):
            if not name.endswith(".lock"):
                yield Path(directory) / name


def write_cache_tar(root: Path, sink: HashingWriter) -> None:
    """Stream a tar of ``root`` into ``sink``: regular files, directories and inner symlinks only."""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for path in cache_entries(root):
            if not (path.is_symlink() or path.is_file() or path.is_dir()):
                continue  # sockets, FIFOs: never part of a cache
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.issym() and (info.linkname.startswith("/") or ".." in info.linkname.split("/")):
                continue  # a link out of the cache means nothing elsewhere
            if info.isfile():
                with open(path, "rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)


def _copy_file(path: Path) -> Any:
    def produce(sink: HashingWriter) -> None:
        if path.exists():
            with open(path, "rb") as data:
                shutil.copyfileobj(data, sink, CHUNK)

    return produce


# -- pack ------------------------------------------------------------------------------------------
def read_result(outdir: Path) -> dict[str, Any]:
    path = outdir / RESULT_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackError(f"{path}: missing (is {outdir} a harness output directory?)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PackError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PackError(f"{path}: expected a JSON object")
    return data


def key_from_result(result: dict[str, Any], where: str = RESULT_FILE) -> CacheKey:
    try:
        key = CacheKey.from_dict(result.get("key") or {})
    except InvalidKey as exc:
        raise PackError(f"{where} field 'key': {exc}") from None
    if result.get("key_string") not in (None, str(key)):
        raise PackError(f"{where}: 'key_string' {result.get('key_string')!r} does not match the key fields {key}")
    return key


def header_result(result: dict[str, Any]) -> dict[str, Any]:
    """The free-form ``result`` metadata a bundle header carries."""
    keep = ("target", "command", "options", "device", "targets", "compile_seconds", "counters", "cache", "megacache",
            "engine")
    header = {name: result.get(name) for name in keep if name in result}
    verdict = precompile_verdict(result)
    if verdict is not None:
        header["precompile"] = verdict
    tree = result.get("bytecode")
    if isinstance(tree, dict):
        header["bytecode"] = {k: tree.get(k) for k in ("files", "bytes", "skipped")}
    return header


def precompile_verdict(result: dict[str, Any]) -> dict[str, Any] | None:
    """What the warm-up's check of the precompiled part decided (``--precompile auto`` only):
    ``verified``, ``reason``, ``seconds`` and the Dynamo entries shipped; None without a check."""
    precompile = result.get("precompile")
    check = precompile.get("check") if isinstance(precompile, dict) else None
    if not isinstance(check, dict):
        return None
    return {
        "verified": check.get("verified") is True,
        "reason": check.get("reason"),
        "seconds": check.get("seconds"),
        "dynamo_entries": precompile.get("dynamo_entries") if isinstance(precompile, dict) else None,
    }


PROBE_KEY = "cc1/compilecache-store-check"
"""A key no bundle is ever published under (cache keys have ten segments): what the store check asks for."""


def check_publishable(url: str) -> None:
    """Before a warm-up compiles (minutes on a GPU): the store it will publish to can take the bundle.
    A Redis or S3 store must answer a lookup; a file store's directory must be a directory this user
    may write, or one it may create. :class:`StoreError` naming what is wrong, else None."""
    from cachelib.stores import StoreError
    from cachelib.stores.filestore import FileStore
    from cachelib.unpack import write_problem

    with open_store(url) as store:
        if isinstance(store, FileStore):
            problem = write_problem(Path(store.root))
            if problem is not None:
                raise StoreError(f"{store.url}: {problem}")
            return
        store.head(PROBE_KEY)  # StoreUnavailable when it does not answer


def pack(outdir: Path, bundle: Path, *, level: int = DEFAULT_LEVEL) -> WrittenBundle:
    """Write the bundle for a harness output directory (atomically: complete or absent)."""
    outdir = Path(outdir)
    result = read_result(outdir)
    key = key_from_result(result, str(outdir / RESULT_FILE))
    cachedir = outdir / CACHEDIR
    if not cachedir.is_dir():
        raise PackError(f"{cachedir}: missing; the harness compiles into OUT/{CACHEDIR}")
    versions = result.get("versions")
    if not isinstance(versions, dict):
        raise PackError(f"{outdir / RESULT_FILE} field 'versions': expected an object")
    return write_bundle_file(
        Path(bundle),
        key=key,
        parts=[
            (CACHEDIR_PART, lambda sink: write_cache_tar(cachedir, sink)),
            (MEGACACHE_PART, _copy_file(outdir / MEGACACHE_FILE)),
        ],
        versions={str(k): str(v) for k, v in versions.items()},
        created=str(result.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())),
        producer=f"compilecache/{__version__} ({result.get('producer', 'unknown')})",
        job_id=str(result.get("job_id") or ""),
        result=header_result(result),
        level=level,
    )


# -- publish ----------------------------------------------------------------------------------------
def publish(
    source: Path,
    store: str | Store,
    *,
    level: int = DEFAULT_LEVEL,
    watch: Watch = unwatched,
    tmpdir: Path | None = None,
) -> PublishResult:
    """Pack ``source`` (a harness output directory, or an existing bundle file), verify, put; ``watch``
    wraps the bundle's stream while it is put (e.g. :func:`cachelib.progress.stderr_bar`)."""
    started = time.perf_counter()
    source = Path(source)
    with tempfile.TemporaryDirectory(prefix="compilecache-publish-", dir=tmpdir) as scratch:
        if source.is_dir():
            bundle = Path(scratch) / "bundle.ccb"
            pack(source, bundle, level=level)
        elif source.is_file():
            bundle = source
        else:
            raise PackError(f"{source}: no such output directory or bundle file")
        header = verify_bundle_file(bundle)
        digest = _file_sha256(bundle)
        bundle_digest = bundle_digest_file(bundle)
        size = bundle.stat().st_size
        opened = open_store(store) if isinstance(store, str) else store
        try:
            with open(bundle, "rb") as stream, watch(f"put {header.key}", stream, size) as watched:
                opened.put(str(header.key), watched, size=size)
            shown = opened.url
        finally:
            if isinstance(store, str):
                opened.close()
    seconds = header.result.get("compile_seconds")
    return PublishResult(
        key=str(header.key),
        sha256=digest,
        bytes=size,
        store=shown,
        job_id=header.job_id,
        created=header.created,
        compile_seconds=float(seconds) if isinstance(seconds, int | float) else None,
        parts={p.name: p.size for p in header.parts},
        seconds=time.perf_counter() - started,
        versions=dict(header.versions),
        digest=bundle_digest,
        precompile=header.result.get("precompile") if isinstance(header.result.get("precompile"), dict) else None,
        bytecode=header.result.get("bytecode") if isinstance(header.result.get("bytecode"), dict) else None,
        engine=engine_summary(header.result.get("engine")),
    )


def engine_summary(engine: Any) -> dict[str, Any] | None:
    """What the publish result says of a vLLM warm-up's engine: name, version, hash directories."""
    if not isinstance(engine, dict):
        return None
    return {k: engine.get(k) for k in ("name", "version", "aot_hashes")}


def _file_sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def inspect_bundle(path: Path, *, verify: bool = False) -> dict[str, Any]:
    """A bundle's header as a dict (every part read and verified when ``verify``)."""
    header = verify_bundle_file(path) if verify else read_header_file(path)
    return header.to_dict()
