"""The preloader: resolve bundle keys, fetch, verify, unpack into the cache directory.

Runs in the pod's init container, which has no torch. A missing bundle or an unreachable
store is a counted ``miss``; a bundle that fails verification or cannot be unpacked, a
deadline that passes, and any failure nobody foresaw are an ``error``. None of them raises:
the caller gets a :class:`PreloadResult` and decides (the CLI exits non-zero for anything but
a hit only under ``--strict``). ``load`` is the variant for images that prefer Mega-Cache: it
feeds the ``megacache`` part to ``torch.compiler.load_cache_artifacts()`` (torch imported only
then).

What the preload leaves is for the workload, which may run as another user: the tree and the
directories torch writes at run time get the modes of ``share`` (group-writable and setgid by
default) and, with ``owner``, that uid/gid. In a directory shared by the pods of a node, a
bundle already installed completely (its marker names the same key and sha256 as the store)
is a hit without a download, and preloads of the same bundle wait for each other instead of
fetching it twice (see :mod:`cachelib.unpack`). With a ``deadline`` the whole preload
(connecting, listing, fetching, unpacking) runs in a worker thread; when the deadline passes
first, the preload is called off before it installs anything more, its staging directories
are removed and the result is an ``error`` whose reason names the deadline.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from cachelib.bundle import CACHEDIR_PART, MEGACACHE_PART, BundleError
from cachelib.bundlereader import BundleReader
from cachelib.deadline import within_deadline
from cachelib.in_image.podcontract import CACHE_DIR_ENV, GPU_ENV
from cachelib.keyformat import CacheKey, InvalidKey, cache_prefix, gpu_slug, parse_cache_ref, select_keys
from cachelib.progress import Watch, unwatched
from cachelib.signing import PublicKey, check_stored
from cachelib.stores import NotFound, Store, StoreError, StoreUnavailable, open_store
from cachelib.stores._stream import stream_size
from cachelib.unpack import (
    SHARE_GROUP,
    Cancelled,
    Gate,
    Limits,
    OwnershipError,
    Sharing,
    UnpackError,
    UnpackStats,
    bundle_lock,
    check_can_own,
    completed,
    prepare_cache_dir,
    unpack_tar_verified,
    write_problem,
)

HIT, MISS, ERROR = "hit", "miss", "error"
PRELOAD, LOAD = "preload", "load"
"""The two modes of :func:`run`."""
RESULTS = (HIT, MISS, ERROR)
"""What a preload (or load) reports as its ``result``."""
SOURCE_STORE, SOURCE_NODE_CACHE, SOURCE_MIXED = "store", "node-cache", "mixed"
DEFAULT_MAX_BYTES = 64 * 1024**3
DEFAULT_MAX_RATIO = 200.0
"""Largest uncompressed/stored ratio of a bundle part accepted by default. Real cache-directory
parts measured on the CPU (``python bench/bundle_ratio.py``, docs/bundle-format.md) inflate
4-11x; zstd can reach about 32000x on zeros. 200 leaves real bundles far inside and refuses
a bomb after its header."""
DEFAULT_DEADLINE = 30.0
"""The CLI's default for ``--deadline`` (seconds for the whole preload)."""
DEFAULT_SHARE = SHARE_GROUP
log = logging.getLogger(__name__)


class PreloadFailed(Exception):
    """Raised by :func:`preload` with ``strict=True`` when the result is not a hit."""

    def __init__(self, result: PreloadResult) -> None:
        super().__init__(f"preload {result.result}: {result.reason}")
        self.result = result


@dataclass
class PreloadResult:
    result: str
    keys: list[str] = field(default_factory=list)
    """Every key resolved for this preload."""
    hits: list[str] = field(default_factory=list)
    """The keys whose bundles were installed (or loaded)."""
    gpu: str | None = None
    bytes: int = 0
    """Bundle bytes fetched from the store."""
    unpacked_bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    reason: str | None = None
    target: str | None = None
    mode: str = "preload"
    node_cache: list[str] = field(default_factory=list)
    """The hits that were already complete in the target (a node cache): nothing fetched for them."""
    share: str | None = None
    owner: str | None = None
    """``UID:GID`` the tree was handed to, when asked for."""
    deadline: float | None = None
    signed_by: dict[str, str] = field(default_factory=dict)
    """Bundle key -> id of the trusted key whose signature it carried (when signatures are checked)."""

    @property
    def key(self) -> str | None:
        return self.keys[0] if self.keys else None

    @property
    def source(self) -> str | None:
        """Where the hits came from: ``store``, ``node-cache``, ``mixed``; None without hits."""
        if not self.hits:
            return None
        local = set(self.node_cache)
        if all(k in local for k in self.hits):
            return SOURCE_NODE_CACHE
        return SOURCE_MIXED if local else SOURCE_STORE

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "mode": self.mode,
            "key": self.key,
            "keys": list(self.keys),
            "hits": list(self.hits),
            "node_cache": list(self.node_cache),
            "source": self.source,
            "gpu": self.gpu,
            "bytes": self.bytes,
            "unpacked_bytes": self.unpacked_bytes,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "target": self.target,
            "share": self.share,
            "owner": self.owner,
            "deadline": self.deadline,
            "signed_by": dict(self.signed_by),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def exit_code(self, strict: bool) -> int:
        return 0 if self.result == HIT or not strict else 1


def keys_in_cache(store: Store, namespace: str, name: str) -> list[CacheKey]:
    """Every bundle key the store holds for one cache (objects under other names are ignored)."""
    found = []
    for info in store.list(cache_prefix(namespace, name)):
        try:
            found.append(CacheKey.parse(info.key))
        except InvalidKey:
            continue
    return found


def choose_gpu(gpu: str | None, env: Mapping[str, str]) -> str | None:
    """--gpu, else $COMPILECACHE_GPU, else None (every variant); normalised to a slug."""
    chosen = gpu or env.get(GPU_ENV) or None
    return gpu_slug(chosen) if chosen else None




# -- fetching -------------------------------------------------------------------------------------
class _CountingReader:
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        return data


@dataclass(frozen=True)
class PreloadRequest:
    """What one ``preload`` or ``load`` is asked to do.

    Keys come from ``keys`` (filtered by ``gpu`` and ``versions`` when given) or from listing
    ``cache`` (``"NS/NAME"``). ``gpu`` defaults to ``$COMPILECACHE_GPU``; without either, every
    matching variant is fetched. ``max_bytes`` caps the unpacked total, ``max_ratio`` the
    compression ratio of each part (None: no limit). ``share`` (``owner``, ``group``, ``all``) and
    ``owner`` (uid, gid) say who may write the tree (``preload`` only); ``deadline`` (seconds, None:
    none) bounds the whole run. With ``trusted_keys`` every bundle must carry a signature by one of
    them (:mod:`cachelib.signing`), checked right after its header and before any part is read:
    without one, the result is an ``error`` naming why. With ``strict`` a non-hit raises
    :class:`PreloadFailed` (carrying the result). ``env`` stands for the process environment.
    """

    store_url: str | Store
    keys: Sequence[str] = ()
    target: Path | None = None
    """The cache directory to fill (``preload``), or the one torch is pointed at (``load``, None: torch's)."""
    cache: str | None = None
    gpu: str | None = None
    versions: Mapping[str, str | None] | None = None
    strict: bool = False
    max_bytes: int = DEFAULT_MAX_BYTES
    max_ratio: float | None = DEFAULT_MAX_RATIO
    share: str = DEFAULT_SHARE
    owner: tuple[int, int] | None = None
    deadline: float | None = None
    watch: Watch = unwatched
    env: Mapping[str, str] | None = None
    trusted_keys: Sequence[PublicKey] = ()


@dataclass
class _Budget:
    remaining: int


@dataclass
class _Job:
    """What one preload (or load) was asked to do, and the state its worker shares with the watcher."""

    mode: str
    target: Path | None
    sharing: Sharing
    max_ratio: float | None
    watch: Watch
    gate: Gate
    trusted: tuple[PublicKey, ...] = ()
    """Public keys whose signature a bundle must carry; empty: signatures are not checked."""
    stage: str = "starting"
    """What the worker is doing now, for a deadline's reason."""


def _resolve(
    store: Store, keys: Sequence[str], cache: str | None, gpu: str | None, versions: Mapping[str, str | None]
) -> tuple[list[str], str | None]:
    """The keys to fetch, and the reason when there are none."""
    if keys and cache:
        raise InvalidKey("give --key or --cache, not both")
    if keys:
        parsed = [CacheKey.parse(k) for k in keys]
        chosen = select_keys(parsed, gpu=gpu, versions=versions)
        if not chosen:
            return [], f"none of the {len(parsed)} given key(s) is for gpu {gpu!r} with the wanted versions"
        return [str(k) for k in chosen], None
    if not cache:
        raise InvalidKey("give at least one --key, or --cache NAMESPACE/NAME")
    namespace, name = parse_cache_ref(cache)
    listed = keys_in_cache(store, namespace, name)
    chosen = select_keys(listed, gpu=gpu, versions=versions)
    if not chosen:
        return [], no_bundle_reason(f"{namespace}/{name}", listed, gpu, versions)
    return [str(k) for k in chosen], None


def no_bundle_reason(
    cache: str, listed: Sequence[CacheKey], gpu: str | None, versions: Mapping[str, str | None]
) -> str:
    """Why no bundle of ``cache`` was chosen, naming the GPU types (and versions) the store does hold
    for it when the filter left them all out (pure)."""
    what = f"gpu {gpu}" if gpu else "any gpu"
    wanted = ", ".join(f"{k}={v}" for k, v in versions.items() if v) or "any versions"
    reason = f"no bundle of cache {cache} for {what} and {wanted} ({len(listed)} in the store)"
    if not listed:
        return reason
    gpus = sorted({k.gpu for k in listed})
    if gpu and gpu not in gpus:
        return f"{reason}; the store has this cache for gpu {', '.join(gpus)}"
    there = sorted({f"torch {k.torch}, triton {k.triton}, cuda {k.cuda}, py {k.py}" for k in listed
                    if gpu is None or k.gpu == gpu})  # fmt: skip
    return f"{reason}; the store has it with {'; '.join(there[:4])}" + ("; …" if len(there) > 4 else "")


def missing_store(store: Store) -> str | None:
    """"no such store" when the store is a file store whose directory does not exist (a mistyped
    path would otherwise read as an empty store), else None."""
    from cachelib.stores.filestore import FileStore

    if isinstance(store, FileStore) and not os.path.isdir(store.root):
        return f"no such store: {store.url} (the directory {store.root} does not exist)"
    return None


def _preload_key(store: Store, key: str, job: _Job, budget: _Budget, result: PreloadResult) -> None:
    """One bundle into the target: at once when the target already holds it complete (a node cache),
    else fetched under the bundle's lock, which a concurrent preload of the same bundle waits for."""
    assert job.target is not None
    job.stage = f"asking the store for {key}"
    info = store.head(key)
    if info is None:
        raise NotFound(f"{store.url}: no object {key!r}")
    if completed(job.target, key, info.sha256, info.size):
        _node_cache_hit(key, result)
        return

    problem = write_problem(job.target)
    if problem is not None:  # before the lock file, whose failure would name neither the user nor the path
        raise PermissionError(problem)

    def waiting() -> None:
        job.stage = f"waiting for another preload of {key} into {job.target}"
        log.info("%s", job.stage)

    with bundle_lock(job.target, key, job.sharing, gate=job.gate, on_wait=waiting):
        if completed(job.target, key, info.sha256, info.size):
            _node_cache_hit(key, result)
            return
        job.stage = f"fetching and unpacking {key}"
        marker = {"key": key, "sha256": info.sha256, "size": info.size}
        _fetch_cachedir(store, key, job, budget, result, marker)


def _node_cache_hit(key: str, result: PreloadResult) -> None:
    result.hits.append(key)
    result.node_cache.append(key)


def _open_bundle(store: Store, key: str, raw: IO[bytes], job: _Job, result: PreloadResult) -> BundleReader:
    """The bundle's reader once its header names ``key`` and, when keys are trusted, its signature
    verifies: before any part is read, let alone unpacked."""
    reader = BundleReader(raw)  # type: ignore[arg-type]
    if str(reader.header.key) != key:
        raise BundleError(f"bundle under {key} holds key {reader.header.key}")
    if job.trusted:
        job.stage = f"checking the signature of {key}"
        result.signed_by[key] = check_stored(store, key, reader.digest, job.trusted)
    return reader


def _fetch_cachedir(
    store: Store, key: str, job: _Job, budget: _Budget, result: PreloadResult, marker: Mapping[str, Any]
) -> None:
    assert job.target is not None
    with store.get(key) as fetched, job.watch(f"get {key}", fetched, stream_size(fetched)) as raw:
        counted = _CountingReader(raw)
        reader = _open_bundle(store, key, counted, job, result)  # type: ignore[arg-type]
        job.stage = f"fetching and unpacking {key}"
        part = reader.header.part(CACHEDIR_PART)
        if part.size > budget.remaining:
            raise UnpackError(
                f"bundle {key}: cache dir of {part.size} bytes exceeds the remaining budget "
                f"of {budget.remaining} bytes (--max-bytes)"
            )
        limits = Limits(max_member_bytes=budget.remaining, max_total_bytes=budget.remaining)

        def installed(stats: UnpackStats) -> None:  # runs while the install holds the gate
            result.bytes += counted.count
            budget.remaining -= stats.bytes
            result.unpacked_bytes += stats.bytes
            result.files += stats.files
            result.hits.append(key)

        with reader.open_part(CACHEDIR_PART, verify_content=False, prefetch=True, max_ratio=job.max_ratio) as stream:
            unpack_tar_verified(
                stream,
                stream.verify,
                job.target,
                limits,
                sharing=job.sharing,
                marker=marker,
                gate=job.gate,
                on_installed=installed,
            )


def _work(job: _Job, request: PreloadRequest, result: PreloadResult) -> None:
    """The fetch loop shared by ``preload`` and ``load``; every failure ends in ``result``."""
    store_url = request.store_url
    store: Store | None = None
    try:
        _check_owner(job)
        job.stage = "opening the store"
        store = open_store(store_url) if isinstance(store_url, str) else store_url
        _fetch_all(job, store, request, result)
    except Cancelled:
        pass  # the watcher reports the deadline
    except Exception as exc:  # fail open: whatever went wrong, the pod gets a result and starts
        result.result, result.reason = _failure(exc)
    finally:
        if isinstance(store_url, str) and store is not None:
            with contextlib.suppress(Exception):
                store.close()


def _check_owner(job: _Job) -> None:
    """With ``--owner``, that the tree can be handed to it (before anything is fetched)."""
    if job.mode == PRELOAD and job.sharing.owner is not None:
        assert job.target is not None
        job.stage = "checking that the tree can be handed to --owner"
        probe = job.target if job.target.is_dir() else job.target.parent
        probe.mkdir(parents=True, exist_ok=True)
        check_can_own(probe, job.sharing.owner)


def _fetch_all(job: _Job, store: Store, request: PreloadRequest, result: PreloadResult) -> None:
    """Resolve the keys and fetch each (install it, or load it into this process); a key the store lacks is
    named in the reason."""
    missing = missing_store(store)
    if missing is not None:
        result.result, result.reason = MISS, missing
        return
    cache = request.cache
    job.stage = f"listing {cache} in the store" if cache else "resolving the keys"
    result.keys, reason = _resolve(store, request.keys, cache, result.gpu, request.versions or {})
    if reason:
        result.reason = reason
    budget = _Budget(request.max_bytes)
    missing_keys = []
    for key in result.keys:
        job.gate.check()
        try:
            if job.mode == LOAD:
                job.stage = f"fetching and loading {key}"
                _load_megacache(store, key, job, budget, result)
            else:
                _preload_key(store, key, job, budget, result)
        except NotFound:
            missing_keys.append(key)
    if missing_keys:
        result.reason = f"not in the store: {', '.join(missing_keys)}"
    elif result.keys:
        result.result, result.reason = HIT, None


def _failure(exc: Exception) -> tuple[str, str]:
    """The result and reason of a preload that failed with ``exc``."""
    if isinstance(exc, StoreUnavailable):
        return MISS, f"store unavailable: {exc}"
    if isinstance(exc, PermissionError):
        said = str(exc)
        return ERROR, said if said.startswith("no permission") else f"no permission: {said}"
    if isinstance(exc, (StoreError, BundleError, UnpackError, InvalidKey, ValueError, OSError)):
        return ERROR, f"{type(exc).__name__}: {exc}"
    log.debug("unexpected failure", exc_info=exc)
    return ERROR, f"unexpected {type(exc).__name__}: {exc}"


class Interrupted(KeyboardInterrupt):
    """SIGINT ended a preload (or load): ``result`` holds what was installed before, each bundle
    complete with its marker; nothing partial is left (staging directories are removed)."""

    def __init__(self, result: PreloadResult) -> None:
        super().__init__(f"{result.mode} interrupted")
        self.result = result

    def left(self) -> str:
        """What the target holds now, in one sentence."""
        target, hits = self.result.target or "the cache directory", self.result.hits
        if not hits:
            return f"nothing was installed into {target}, and nothing partial was left there"
        return (f"{target} holds the {len(hits)} bundle(s) installed before the interrupt, each complete "
                f"({', '.join(hits[:3])}{', …' if len(hits) > 3 else ''}); nothing partial was left")  # fmt: skip


def run(mode: str, request: PreloadRequest) -> PreloadResult:
    """``preload`` or ``load`` (``mode``) as ``request`` asks: the fetch loop, within the request's
    ``deadline`` when given; with ``strict`` a non-hit raises."""
    if mode == LOAD and (request.share != DEFAULT_SHARE or request.owner is not None):
        raise TypeError("load takes no share or owner: torch writes the cache directory")
    target, deadline, owner = request.target, request.deadline, request.owner
    env = os.environ if request.env is None else request.env
    started = time.perf_counter()
    result = PreloadResult(MISS, target=str(target) if target else None, mode=mode, deadline=deadline)
    sharing: Sharing | None = None
    # A directory that already holds a cache (a node cache) may hold what earlier workloads wrote.
    reused = mode == PRELOAD and target is not None and _holds_anything(target)
    try:
        result.gpu = choose_gpu(request.gpu, env)
        sharing = Sharing(request.share, owner)
        if mode == PRELOAD:
            result.share, result.owner = request.share, f"{owner[0]}:{owner[1]}" if owner else None
        job = _Job(mode, target, sharing, request.max_ratio, request.watch, Gate(), tuple(request.trusted_keys))
        work = functools.partial(_work, job, request, result)
        if not within_deadline(f"compilecache-{job.mode}", job.gate, work, deadline):
            result = _deadline_result(result, job, deadline)
    except KeyboardInterrupt:
        raise Interrupted(replace(result, hits=list(result.hits), result=ERROR, reason="interrupted")) from None
    except Exception as exc:  # a bad argument (share, gpu): still a result, never a crash
        result.result, result.reason = ERROR, f"{type(exc).__name__}: {exc}"
    if mode == PRELOAD and target is not None and sharing is not None:
        _prepare(target, sharing, reused)
    result.seconds = time.perf_counter() - started
    if request.strict and result.result != HIT:
        raise PreloadFailed(result)
    return result


def _holds_anything(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _prepare(target: Path, sharing: Sharing, reused: bool) -> None:
    """Leave a cache directory the workload can write, whatever the result (best effort: a
    directory that cannot be made is the workload's to make; without CAP_CHOWN, no owner)."""
    try:
        prepare_cache_dir(target, sharing, reused=reused)
    except OwnershipError:
        _prepare(target, replace(sharing, owner=None), reused)
    except (OSError, UnpackError) as exc:
        log.warning("cannot prepare the cache directory %s for the workload: %s", target, exc)


def _deadline_result(result: PreloadResult, job: _Job, deadline: float | None) -> PreloadResult:
    """A snapshot of the worker's result (it may go on in the background), as a deadline ``error``."""
    return replace(
        result,
        result=ERROR,
        keys=list(result.keys),
        hits=list(result.hits),
        node_cache=list(result.node_cache),
        reason=(
            f"deadline of {deadline:g} s passed while {job.stage} (--deadline covers connecting, "
            "fetching and unpacking); nothing partial was left"
        ),
    )


def preload(
    store_url: str | Store, keys: Sequence[str] = (), target: str | Path = ".", **options: Any
) -> PreloadResult:
    """Fetch, verify and unpack the ``cachedir`` part of each resolved bundle into ``target``;
    ``options``: the other fields of :class:`PreloadRequest`."""
    return run(PRELOAD, PreloadRequest(store_url, keys, Path(target).absolute(), **options))


# -- load (Mega-Cache) -------------------------------------------------------------------------------
def _load_megacache(store: Store, key: str, job: _Job, budget: _Budget, result: PreloadResult) -> None:
    with store.get(key) as fetched, job.watch(f"get {key}", fetched, stream_size(fetched)) as raw:
        counted = _CountingReader(raw)
        reader = _open_bundle(store, key, counted, job, result)  # type: ignore[arg-type]
        job.stage = f"fetching and loading {key}"
        data = reader.read_part(MEGACACHE_PART, limit=budget.remaining, max_ratio=job.max_ratio)
        result.bytes += counted.count
    budget.remaining -= len(data)
    result.unpacked_bytes += len(data)
    if data:
        with job.gate.installing():
            try:
                load_cache_artifacts(data, job.target)
            except Exception as exc:  # torch's own failure, whatever its type
                raise BundleError(f"torch cannot load the Mega-Cache of {key}: {type(exc).__name__}: {exc}") from exc
            result.files += 1
            result.hits.append(key)
    else:
        result.hits.append(key)


def load_cache_artifacts(data: bytes, cache_dir: Path | None = None) -> None:
    """Hand Mega-Cache bytes to torch; ``cache_dir`` becomes ``TORCHINDUCTOR_CACHE_DIR`` when torch's
    inductor is not loaded yet."""
    if cache_dir is not None and "torch._inductor" not in sys.modules:
        os.environ[CACHE_DIR_ENV] = str(Path(cache_dir).absolute())
    import torch

    torch.compiler.load_cache_artifacts(data)


def load(
    store_url: str | Store, keys: Sequence[str] = (), cache_dir: str | Path | None = None, **options: Any
) -> PreloadResult:
    """Fetch each resolved bundle's ``megacache`` part, verify it, and load it into torch; ``options``:
    the other fields of :class:`PreloadRequest` but ``share`` and ``owner``."""
    return run(LOAD, PreloadRequest(store_url, keys, Path(cache_dir) if cache_dir is not None else None, **options))
