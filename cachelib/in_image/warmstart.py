"""A warm first call: what the warm-up hands to the workload beyond torch's caches.

A cache directory full of hits still leaves a new process two jobs that do not depend on the
model's compiled code: Dynamo re-traces the model and rebuilds its guards, and torch and Triton
hash their own installed sources to make their cache keys (``torch_key``, ``triton_key``). With
``spec.model.precompile: Auto`` the warm-up removes the tracing and both hashes:

- it compiles with Dynamo's caching precompile (``torch._dynamo.config.caching_precompile``,
  env ``TORCH_CACHING_PRECOMPILE=1``), which saves Dynamo's traced code and guards with the
  compiled graph into the cache directory (``dynamo/<id>/entry``), so a new process with the
  same setting loads them instead of tracing;
- it writes the *warm-start manifest* (``compilecache-warm-start.json``) into the cache
  directory: the versions and a digest of the installed torch and Triton files, the source
  keys torch and Triton computed, and whether Dynamo entries were saved.

Both travel in the bundle's ``cachedir`` part; the preload lays them down with the rest. The
workload makes one call before its first compile::

    from cachelib import runtime
    runtime.warm_start()          # or cachelib.in_image.warmstart.prepare()
    compiled = torch.compile(model)

It reads the manifest from ``$TORCHINDUCTOR_CACHE_DIR`` and compares it with this process:
torch, Triton and Python versions and the digest of the installed files. Only when all of
them match does it hand the source keys over (torch's ``torch_key.set``; Triton's
``triton_key``, see :func:`hand_over_triton_key`) and turn caching precompile on; on any
difference, or a manifest it cannot read, it turns caching precompile off and leaves torch
and Triton to compute everything as they would without compilecache. Torch checks a Dynamo
entry again when it loads it (torch and Python versions, device, the hashes of the traced
source lines) and compiles afresh when that fails.

Standard library only at import; torch is imported by the functions that need it. This module
is copied beside ``harness.py`` into warm-up containers, so it imports nothing from cachelib but the
pod contract and the loader's guard (:mod:`cachelib.in_image.precompileguard`) copied with it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.warmstart
    from cachelib.in_image import podcontract, precompileguard
else:  # beside harness.py in a warm-up container: podcontract.py and precompileguard.py are copied there too
    import podcontract
    import precompileguard


MANIFEST_NAME = "compilecache-warm-start.json"
"""The manifest's name at the top of the cache directory (a plain name: the unpacker installs it)."""
MANIFEST_FORMAT = 1
CACHE_DIR_ENV = podcontract.CACHE_DIR_ENV
PRECOMPILE_ENV = podcontract.PRECOMPILE_ENV
AUTO = "auto"
OFF = "off"
PRECOMPILE_CHOICES = (AUTO, OFF)
NONE = "none"
PACKAGES = ("torch", "triton")
_SKIPPED_DIRS = frozenset({"__pycache__", "include"})
"""Left out of the installation digest: byte-code caches change at run time; headers are many and
enter no cache key of a compiled graph that is loaded (torch's own key hashes .py sources only)."""
log = logging.getLogger(__name__)


# -- the installation -------------------------------------------------------------------------
def package_dir(name: str) -> Path | None:
    """The directory of an installed package, without importing it; None when absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tree_digest(root: Path) -> str:
    """sha256 of every file's relative path, size and modification time under ``root``.

    Cheap (no file is read) and exact for an image: the warm-up and the pods run the same
    image, whose files keep their sizes and times. Any reinstall, upgrade or edit changes it."""
    h = hashlib.sha256(str(root).encode() + b"\0")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        rel = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            if name.endswith(".pyc"):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:  # a dangling link: its absence is part of the identity
                h.update(f"{rel}/{name}\0missing\n".encode())
                continue
            h.update(f"{rel}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def installation(packages: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Package -> digest of its installed files (``none`` when not installed)."""
    out = {}
    for name in packages:
        root = package_dir(name)
        out[name] = tree_digest(root) if root is not None else NONE
    return out


def versions() -> dict[str, str]:
    """torch, Triton (or ``none``) and Python versions of this process, and the platform."""
    import torch

    try:
        import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = NONE
    return {
        "torch": str(torch.__version__),
        "triton": triton_version,
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }


# -- the manifest (warm-up side) -------------------------------------------------------------------
def supports_caching_precompile() -> bool:
    """Whether this torch has Dynamo's caching precompile (2.11 and 2.13 have it)."""
    import torch._dynamo.config as dynamo_config

    return hasattr(dynamo_config, "caching_precompile")


def disable_caching_precompile() -> None:
    """Turn Dynamo's caching precompile off (the warm-up's fallback when compiling with it fails)."""
    _set_caching_precompile(False)


def enable_caching_precompile() -> bool:
    """Turn Dynamo's caching precompile on (before ``torch.compile``); whether this torch has it."""
    if not supports_caching_precompile():
        return False
    import torch._dynamo.config as dynamo_config

    dynamo_config.caching_precompile = True
    return True


def source_keys() -> dict[str, str | None]:
    """torch's ``torch_key`` (hex) and Triton's ``triton_key`` as this process computes them.

    ``triton_key`` is Triton's own hash of its installed sources and library
    (``triton.runtime.cache.triton_key``); torch 2.13's ``codecache.triton_key`` returns the same."""
    from torch._inductor import codecache

    torch_key = getattr(codecache, "torch_key", None)
    return {
        "torch_key": torch_key().hex() if torch_key is not None else None,
        "triton_key": _triton_source_key(),
    }


def _triton_source_key() -> str | None:
    try:
        from triton.runtime.cache import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            triton_key,
        )
    except ImportError:
        return None
    return str(triton_key())


def dynamo_entries(cache_dir: Path) -> int:
    """How many Dynamo precompile entries (``dynamo/<id>/entry``) the cache directory holds."""
    return sum(1 for _ in (cache_dir / "dynamo").glob("*/entry"))


PER_CALL_STATE = frozenset({"grad_mode", "autocast_state", "torch_function", "torch_function_all_disabled"})
"""Fields of Dynamo's global-state guard that a workload sets around each call (``no_grad``, autocast),
not for the process: they cannot be compared before the first call."""


def global_state() -> dict[str, Any] | None:
    """The process-wide state Dynamo guards every compiled frame on (its ``GlobalStateGuard``: thread
    count, default dtype, deterministic algorithms, reduced-precision matmuls), less what is set per
    call; None when this torch cannot say it."""
    import torch

    guard_type = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    guard_type = getattr(guard_type, "GlobalStateGuard", None)
    try:
        state = json.loads(guard_type().__getstate__()) if guard_type is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    out = {k: v for k, v in state.items() if k not in PER_CALL_STATE}
    if "default_dtype" in out:
        out["default_dtype"] = str(torch.get_default_dtype()).removeprefix("torch.")
    return out


def global_state_differences(warmup: Mapping[str, Any] | None, here: Mapping[str, Any] | None) -> list[str]:
    """Each process-wide setting that differs between the warm-up and this process, both values (pure);
    none when either side could not say."""
    if not isinstance(warmup, Mapping) or not isinstance(here, Mapping):
        return []
    return [
        f"{name} {here[name]!r} here, {warmup[name]!r} in the warm-up"
        for name in sorted(set(warmup) & set(here))
        if warmup[name] != here[name]
    ]


def build_manifest(cache_dir: Path) -> dict[str, Any]:
    """The manifest of this process's installation and of what it left in ``cache_dir``."""
    return {
        "format": MANIFEST_FORMAT,
        "versions": versions(),
        "installation": installation(),
        "source_keys": source_keys(),
        "dynamo_precompile": dynamo_entries(cache_dir) > 0,
        "global_state": global_state(),
    }


def write_manifest(cache_dir: Path, manifest: Mapping[str, Any]) -> Path:
    """Write the manifest at the top of ``cache_dir`` (atomically: a temporary name, renamed)."""
    path = cache_dir / MANIFEST_NAME
    partial = cache_dir / f".{MANIFEST_NAME}.partial"
    partial.write_text(json.dumps(dict(manifest), indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)
    return path


# -- the workload side ------------------------------------------------------------------------------
class ManifestError(ValueError):
    """A manifest that cannot be used: unreadable, not JSON, or missing a field."""


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    """The manifest in ``cache_dir``; None when there is none. Raises :class:`ManifestError`."""
    path = cache_dir / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from exc
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ManifestError(f"{path}: not a JSON object")
    if value.get("format") != MANIFEST_FORMAT:
        raise ManifestError(f"{path}: format {value.get('format')!r}, this reader knows {MANIFEST_FORMAT}")
    for name, kind in (("versions", dict), ("installation", dict), ("source_keys", dict), ("dynamo_precompile", bool)):
        if not isinstance(value.get(name), kind):
            raise ManifestError(f"{path}: field {name!r} missing or not a {kind.__name__}")
    return value


def mismatches(
    manifest: Mapping[str, Any], here_versions: Mapping[str, str], here_installation: Mapping[str, str]
) -> list[str]:
    """What differs between the warm-up that wrote ``manifest`` and this process (pure)."""
    found = []
    theirs = manifest.get("versions", {})
    for name in ("torch", "triton", "python", "platform"):
        if theirs.get(name) != here_versions.get(name):
            found.append(f"{name} {theirs.get(name)!r} in the warm-up, {here_versions.get(name)!r} here")
    installed = manifest.get("installation", {})
    for name in PACKAGES:
        if installed.get(name) != here_installation.get(name):
            found.append(f"the installed {name} files differ from the warm-up's")
    return found


@dataclass
class Prepared:
    """What :func:`prepare` did: the levers applied, and why it fell back when it did."""

    cache_dir: str | None = None
    manifest: bool = False
    applied: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_dir": self.cache_dir,
            "manifest": self.manifest,
            "applied": list(self.applied),
            "declined": list(self.declined),
        }


last_prepared: Prepared | None = None


def _set_source_key(name: str, value: Any, done: Prepared) -> None:
    from torch._inductor import codecache

    cached = getattr(codecache, name, None)
    setter = getattr(cached, "set", None)
    if setter is None:
        done.declined.append(f"{name}: this torch has no setter for it")
        return
    try:
        setter(value)
    except RuntimeError:  # computed already in this process: nothing to save
        done.declined.append(f"{name}: already computed in this process")
        return
    done.applied.append(name)


def hand_over_triton_key(value: str, done: Prepared) -> None:
    """Give Triton's own ``triton_key`` the warm-up's value instead of hashing its files again.

    Triton hashes its sources and its library (440 MiB in Triton 3.7.1) in every process (0.4 s
    on an H100 host) the first time a kernel is set up, through
    ``torch.utils._triton.triton_hash_with_backend`` and its own ``get_cache_key``. Both cache the
    result (``functools``) but take no value from outside, so the function itself is replaced,
    under its own name, in every module that holds it (``triton.runtime.cache``,
    ``triton.runtime.autotuner``, torch's ``triton_compat``): modules imported later take it from
    there. Only called once the installation digest matched; only with a value that starts with
    this Triton's version, and before Triton computed its own. A Triton whose ``triton_key`` is
    not the zero-argument ``lru_cache`` function this was checked against (Triton 3.x) keeps
    it; then only torch's settable wrapper (torch 2.13) gets the value. What was done, or why
    not, is in ``done``."""
    try:
        import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]
        import triton.runtime.cache as triton_cache  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        done.declined.append("triton_key: Triton is not installed here")
        return
    if not value.startswith(str(triton.__version__)):
        done.declined.append(f"triton_key: the warm-up's key is not for Triton {triton.__version__}")
        return
    original = vars(triton_cache).get("triton_key")
    cache_info = getattr(original, "cache_info", None)
    if original is None or cache_info is None:
        _set_source_key("triton_key", value, done)
        return
    if cache_info().currsize:
        done.declined.append("triton_key: already computed in this process")
        return

    @functools.cache
    def triton_key() -> str:
        return value

    triton_key.__doc__ = original.__doc__
    triton_key.__wrapped__ = original
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)  # not getattr(module, name): no lazy __getattr__ runs
        if isinstance(namespace, dict) and namespace.get("triton_key") is original:
            namespace["triton_key"] = triton_key
    done.applied.append("triton_key")


def _set_caching_precompile(value: bool) -> None:
    import torch._dynamo.config as dynamo_config

    if hasattr(dynamo_config, "caching_precompile"):
        dynamo_config.caching_precompile = value


def prepare(cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Prepared:
    """Apply the warm-start manifest of the cache directory; call before the first ``torch.compile``.

    ``cache_dir`` defaults to ``$TORCHINDUCTOR_CACHE_DIR``. Never raises for a missing,
    unreadable or foreign manifest: it falls back to torch's own path and says why."""
    global last_prepared
    environ = os.environ if env is None else env
    where = cache_dir if cache_dir is not None else environ.get(CACHE_DIR_ENV)
    done = Prepared(cache_dir=str(where) if where else None)
    last_prepared = done
    precompileguard.said_to = done.declined
    if not where:
        done.declined.append(f"no cache directory (${CACHE_DIR_ENV} unset)")
        return done
    try:
        manifest = read_manifest(Path(where))
    except ManifestError as exc:
        manifest = None
        done.declined.append(str(exc))
        _set_caching_precompile(False)
    if manifest is None:
        if not done.declined:
            done.declined.append(f"no {MANIFEST_NAME} in {where}: the bundle was made without precompile")
        return done
    done.manifest = True
    different = mismatches(manifest, versions(), installation())
    if different:
        done.declined.extend(different)
        _set_caching_precompile(False)
        log.info("compilecache: warm-start manifest not used: %s", "; ".join(different))
        return done
    keys = manifest["source_keys"]
    if isinstance(keys.get("torch_key"), str):
        _set_source_key("torch_key", bytes.fromhex(keys["torch_key"]), done)
    if isinstance(keys.get("triton_key"), str):
        hand_over_triton_key(keys["triton_key"], done)
    state_differs = global_state_differences(manifest.get("global_state"), global_state())
    if manifest["dynamo_precompile"] and state_differs:
        # The entry's guards would fail at the first call; Dynamo would then compile afresh under caching
        # precompile, whose AOTAutograd keys are new: without it, the bundle's FX-graph and AOTAutograd
        # entries still serve where the setting enters no key of theirs.
        _set_caching_precompile(False)
        done.declined.append(
            "caching_precompile: the precompiled entry was made with another global state: " + "; ".join(state_differs)
        )
    elif manifest["dynamo_precompile"]:
        _apply_caching_precompile(done)
        if "caching_precompile" in done.applied:
            defer_compile_pool(done, environ)
    else:
        _set_caching_precompile(False)
        check = manifest.get("precompile_check")
        if isinstance(check, dict) and check.get("verified") is False:
            done.declined.append(f"caching_precompile: left out by the warm-up's check: {check.get('reason')}")
    return done


WARM_POOL_ENV = "TORCH_WARM_POOL"
"""Read by Inductor's ``maybe_warm_pool()`` at the first compile: ``0`` skips starting the pool."""


def warm_pool_problem() -> str | None:
    """Why this torch's compile-worker pool cannot be left unstarted through ``TORCH_WARM_POOL``; None
    when it can (checked in the proven releases: ``maybe_warm_pool`` reads it when the first compile
    starts, and the pool is still made on demand by the first kernel that must compile)."""
    import inspect

    outside = precompileguard.outside_proven_torch("its compile-worker pool")
    if outside is not None:
        return outside
    try:
        async_compile: Any = importlib.import_module("torch._inductor.async_compile")
        source = inspect.getsource(async_compile.maybe_warm_pool)
    except (ImportError, AttributeError, OSError, TypeError) as exc:
        return f"Inductor's maybe_warm_pool cannot be read: {exc}"
    if WARM_POOL_ENV not in source:
        return f"Inductor's maybe_warm_pool does not read ${WARM_POOL_ENV}"
    return None


def defer_compile_pool(done: Prepared, environ: Mapping[str, str]) -> None:
    """A bundle whose precompiled part loads needs no compile: leave Inductor's compile-worker pool
    unstarted at the first compile (it spawns a process that imports torch again, competing with the
    workload's own start). A graph that must compile after all still gets the pool, started on
    demand. A workload that sets ``TORCH_WARM_POOL`` itself keeps its choice."""
    if WARM_POOL_ENV in environ:
        done.declined.append(f"lazy_compile_pool: ${WARM_POOL_ENV} is set by the workload")
        return
    problem = warm_pool_problem()
    if problem is not None:
        done.declined.append(f"lazy_compile_pool: {problem}")
        return
    os.environ[WARM_POOL_ENV] = "0"
    done.applied.append("lazy_compile_pool")


def _apply_caching_precompile(done: Prepared) -> None:
    if not supports_caching_precompile():
        done.declined.append("caching_precompile: this torch does not have it")
        return
    problem = precompileguard.guard_precompile_loader()
    if problem is not None:
        _set_caching_precompile(False)
        done.declined.append(f"caching_precompile: {problem}")
        return
    enable_caching_precompile()
    done.applied.append("caching_precompile")
