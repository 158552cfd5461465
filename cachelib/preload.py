"""The preloader: resolve bundle keys, fetch, verify, unpack into the cache directory.

Runs in the pod's init container, which has no torch. A missing bundle or an unreachable
store is a counted ``miss``; a bundle that fails verification or cannot be unpacked is an
``error``. Neither raises: the caller gets a :class:`PreloadResult` and decides (the CLI
exits non-zero for anything but a hit only under ``--strict``). ``load`` is the variant
for images that prefer Mega-Cache: it feeds the ``megacache`` part to
``torch.compiler.load_cache_artifacts()`` (torch imported only then).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cachelib.bundle import CACHEDIR_PART, MEGACACHE_PART, BundleError, BundleReader
from cachelib.keys import CacheKey, InvalidKey, cache_prefix, gpu_slug
from cachelib.stores import NotFound, Store, StoreError, StoreUnavailable, open_store
from cachelib.unpack import Limits, UnpackError, unpack_tar_verified

HIT, MISS, ERROR = "hit", "miss", "error"
GPU_ENV = "COMPILECACHE_GPU"
TERMINATION_LOG_ENV = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""
DEFAULT_MAX_BYTES = 64 * 1024**3
VERSION_FIELDS = ("torch", "triton", "cuda", "py")


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

    @property
    def key(self) -> str | None:
        return self.keys[0] if self.keys else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result,
            "mode": self.mode,
            "key": self.key,
            "keys": list(self.keys),
            "hits": list(self.hits),
            "gpu": self.gpu,
            "bytes": self.bytes,
            "unpacked_bytes": self.unpacked_bytes,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "target": self.target,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def exit_code(self, strict: bool) -> int:
        return 0 if self.result == HIT or not strict else 1


# -- key resolution (pure) ---------------------------------------------------------------------------
def version_matches(have: str, wanted: str | None) -> bool:
    """``wanted`` None matches anything; ``2.13.0`` matches ``2.13.0`` and ``2.13.0+cu128``."""
    if wanted is None or have == wanted:
        return True
    return "+" not in wanted and have.split("+", 1)[0] == wanted


def select_keys(
    keys: Iterable[CacheKey], *, gpu: str | None = None, versions: Mapping[str, str | None] | None = None
) -> list[CacheKey]:
    """The keys of the given GPU (slug, or any when None) whose versions match, in key order."""
    wanted = {k: v for k, v in (versions or {}).items() if v is not None}
    unknown = set(wanted) - set(VERSION_FIELDS)
    if unknown:
        raise ValueError(f"unknown version field(s): {', '.join(sorted(unknown))}")
    slug = gpu_slug(gpu) if gpu else None
    return sorted(
        k
        for k in keys
        if (slug is None or k.gpu == slug) and all(version_matches(getattr(k, f), v) for f, v in wanted.items())
    )


def parse_cache_ref(text: str) -> tuple[str, str]:
    """``NS/NAME`` -> (namespace, name); :class:`InvalidKey` when malformed."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InvalidKey(f"--cache {text!r}: expected NAMESPACE/NAME")
    return namespace, name


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


# -- termination message --------------------------------------------------------------------------
def termination_log_path(env: Mapping[str, str] | None = None) -> Path | None:
    """Where to write the termination message: $COMPILECACHE_TERMINATION_LOG when its directory
    exists, else /dev/termination-log when that file exists (Kubernetes creates it)."""
    env = os.environ if env is None else env
    explicit = env.get(TERMINATION_LOG_ENV)
    if explicit:
        path = Path(explicit)
        return path if path.exists() or path.parent.is_dir() else None
    default = Path(DEFAULT_TERMINATION_LOG)
    return default if default.exists() else None


def termination_message(payload: Mapping[str, Any]) -> str:
    """Compact JSON that fits Kubernetes' limit: long key lists are replaced by their counts."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
        return text
    shrunk = dict(payload)
    for name in ("keys", "hits"):
        if isinstance(shrunk.get(name), list):
            shrunk[f"{name}_count"] = len(shrunk.pop(name))
    text = json.dumps(shrunk, sort_keys=True, separators=(",", ":"))
    return text.encode()[:TERMINATION_MESSAGE_LIMIT].decode(errors="ignore")


def write_termination_message(payload: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Path | None:
    """Write ``payload`` to the termination log when there is one; the path written, if any."""
    path = termination_log_path(env)
    if path is None:
        return None
    try:
        path.write_text(termination_message(payload))
    except OSError:
        return None
    return path


# -- fetching -------------------------------------------------------------------------------------
class _CountingReader:
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        return data


@dataclass
class _Budget:
    remaining: int


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
        what = f"gpu {gpu}" if gpu else "any gpu"
        wanted = ", ".join(f"{k}={v}" for k, v in versions.items() if v) or "any versions"
        return [], f"no bundle of cache {namespace}/{name} for {what} and {wanted} ({len(listed)} in the store)"
    return [str(k) for k in chosen], None


def _fetch_cachedir(
    store: Store, key: str, target: Path, budget: _Budget, result: PreloadResult, progress: bool
) -> None:
    with store.get(key, progress=progress) as raw:
        counted = _CountingReader(raw)
        reader = BundleReader(counted)  # type: ignore[arg-type]
        if str(reader.header.key) != key:
            raise BundleError(f"bundle under {key} holds key {reader.header.key}")
        part = reader.header.part(CACHEDIR_PART)
        if part.size > budget.remaining:
            raise UnpackError(
                f"bundle {key}: cache dir of {part.size} bytes exceeds the remaining budget "
                f"of {budget.remaining} bytes (--max-bytes)"
            )
        limits = Limits(max_member_bytes=budget.remaining, max_total_bytes=budget.remaining)
        with reader.open_part(CACHEDIR_PART, verify_content=False, prefetch=True) as stream:
            stats = unpack_tar_verified(stream, stream.verify, target, limits)
        result.bytes += counted.count
    budget.remaining -= stats.bytes
    result.unpacked_bytes += stats.bytes
    result.files += stats.files
    result.hits.append(key)


def _run(
    mode: str,
    store_url: str | Store,
    keys: Sequence[str],
    target: Path | None,
    *,
    cache: str | None,
    gpu: str | None,
    versions: Mapping[str, str | None] | None,
    max_bytes: int,
    progress: bool,
    env: Mapping[str, str] | None,
    strict: bool,
) -> PreloadResult:
    """The fetch loop shared by ``preload`` and ``load``; with ``strict`` a non-hit raises."""
    env = os.environ if env is None else env
    started = time.perf_counter()
    result = PreloadResult(MISS, gpu=choose_gpu(gpu, env), target=str(target) if target else None, mode=mode)
    store: Store | None = None
    try:
        store = open_store(store_url) if isinstance(store_url, str) else store_url
        result.keys, reason = _resolve(store, keys, cache, result.gpu, versions or {})
        if reason:
            result.reason = reason
        budget = _Budget(max_bytes)
        missing = []
        for key in result.keys:
            try:
                if mode == "load":
                    _load_megacache(store, key, target, budget, result, progress)
                else:
                    assert target is not None
                    _fetch_cachedir(store, key, target, budget, result, progress)
            except NotFound:
                missing.append(key)
        if missing:
            result.reason = f"not in the store: {', '.join(missing)}"
        elif result.keys:
            result.result, result.reason = HIT, None
    except StoreUnavailable as exc:
        result.result, result.reason = MISS, f"store unavailable: {exc}"
    except (StoreError, BundleError, UnpackError, InvalidKey, ValueError, OSError) as exc:
        result.result, result.reason = ERROR, f"{type(exc).__name__}: {exc}"
    finally:
        if isinstance(store_url, str) and store is not None:
            store.close()
    result.seconds = time.perf_counter() - started
    if strict and result.result != HIT:
        raise PreloadFailed(result)
    return result


def preload(
    store_url: str | Store,
    keys: Sequence[str] = (),
    target: str | Path = ".",
    *,
    cache: str | None = None,
    gpu: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    strict: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: bool = False,
    env: Mapping[str, str] | None = None,
) -> PreloadResult:
    """Fetch, verify and unpack the ``cachedir`` part of each resolved bundle into ``target``.

    Keys come from ``keys`` (filtered by ``gpu`` and ``versions`` when given) or from
    listing ``cache`` (``"NS/NAME"``). ``gpu`` defaults to ``$COMPILECACHE_GPU``; without
    either, every matching variant is unpacked. ``max_bytes`` caps the unpacked total.
    With ``strict`` a non-hit raises :class:`PreloadFailed` (carrying the result).
    """
    return _run(
        "preload",
        store_url,
        keys,
        Path(target),
        cache=cache,
        gpu=gpu,
        versions=versions,
        max_bytes=max_bytes,
        progress=progress,
        env=env,
        strict=strict,
    )


# -- load (Mega-Cache) -------------------------------------------------------------------------------
def _load_megacache(
    store: Store, key: str, cache_dir: Path | None, budget: _Budget, result: PreloadResult, progress: bool
) -> None:
    with store.get(key, progress=progress) as raw:
        counted = _CountingReader(raw)
        reader = BundleReader(counted)  # type: ignore[arg-type]
        if str(reader.header.key) != key:
            raise BundleError(f"bundle under {key} holds key {reader.header.key}")
        data = reader.read_part(MEGACACHE_PART, limit=budget.remaining)
        result.bytes += counted.count
    budget.remaining -= len(data)
    result.unpacked_bytes += len(data)
    if data:
        try:
            load_cache_artifacts(data, cache_dir)
        except Exception as exc:  # torch's own failure, whatever its type
            raise BundleError(f"torch cannot load the Mega-Cache of {key}: {type(exc).__name__}: {exc}") from exc
        result.files += 1
    result.hits.append(key)


def load_cache_artifacts(data: bytes, cache_dir: Path | None = None) -> None:
    """Hand Mega-Cache bytes to torch; ``cache_dir`` becomes ``TORCHINDUCTOR_CACHE_DIR`` when torch's
    inductor is not loaded yet."""
    if cache_dir is not None and "torch._inductor" not in sys.modules:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_dir).absolute())
    import torch

    torch.compiler.load_cache_artifacts(data)


def load(
    store_url: str | Store,
    keys: Sequence[str] = (),
    cache_dir: str | Path | None = None,
    *,
    cache: str | None = None,
    gpu: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    strict: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: bool = False,
    env: Mapping[str, str] | None = None,
) -> PreloadResult:
    """Fetch each resolved bundle's ``megacache`` part, verify it, and load it into torch."""
    return _run(
        "load",
        store_url,
        keys,
        Path(cache_dir) if cache_dir is not None else None,
        cache=cache,
        gpu=gpu,
        versions=versions,
        max_bytes=max_bytes,
        progress=progress,
        env=env,
        strict=strict,
    )
