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
    runtime.warm_start()          # or cachelib.warmstart.prepare()
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
pod contract copied with it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.warmstart
    from cachelib import podcontract
else:  # beside harness.py in a warm-up container: podcontract.py is copied there too
    import podcontract

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


def build_manifest(cache_dir: Path) -> dict[str, Any]:
    """The manifest of this process's installation and of what it left in ``cache_dir``."""
    return {
        "format": MANIFEST_FORMAT,
        "versions": versions(),
        "installation": installation(),
        "source_keys": source_keys(),
        "dynamo_precompile": dynamo_entries(cache_dir) > 0,
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


# -- the guarded loader (workload side) ----------------------------------------------------------------
PROVEN_TORCH = ((2, 11), (2, 15))
"""The torch releases (major, minor), both ends included, whose precompile loader the guard below
was checked against (tests/cachelib/test_zoo.py on the CPU, 2.11 on the GPU). Outside them,
caching precompile is declined: the entries are ignored and the workload compiles as with Off."""

FALLBACK_REASONS = ("unreadable", "source_changed", "load_failed", "install_failed")
"""Why a precompiled entry was not used (the bounded ``reason`` label of the fallback metric):
Dynamo could not read the entry, the traced source changed since the warm-up, checking the entry
failed, or building its guards and installing it failed."""

fallbacks: dict[str, int] = {}
"""reason -> how many precompiled entries this process refused and compiled afresh instead."""
refusing_entries = False
"""Set at the first fallback: every later precompiled entry reads as absent (compiled afresh)."""


class PrecompileFallback(RuntimeError):
    """A precompiled entry that cannot be used here. A RuntimeError: the one exception Dynamo's
    own loader (``_TorchDynamoContext.__call__``) catches before it compiles afresh."""


def torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as ``2.13.0+cu130``; None when unreadable."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def fallback_reason(stage: str, exc: BaseException) -> str:
    """The bounded reason for an exception raised by Dynamo's loader at ``stage`` (pure)."""
    if stage == "initialize" and "Source code changes detected" in str(exc):
        return "source_changed"
    return {"read": "unreadable", "initialize": "load_failed"}.get(stage, "install_failed")


def _fall_back(stage: str, exc: BaseException) -> PrecompileFallback:
    """Count the fallback, say it, and refuse every later precompiled entry of the process.

    Caching precompile itself stays on: torch's loader has created a package for the function
    and compiles it afresh through that package, which needs the setting it was made with
    (with it off, Dynamo keeps guards it cannot serialise and fails an assertion)."""
    global refusing_entries
    refusing_entries = True
    reason = fallback_reason(stage, exc)
    fallbacks[reason] = fallbacks.get(reason, 0) + 1
    first_line = (str(exc).strip().splitlines() or [""])[0][:300]
    log.warning(
        "compilecache: precompiled entry not used (%s: %s: %s); compiling as without precompile",
        reason, type(exc).__name__, first_line,
    )  # fmt: skip
    if last_prepared is not None:
        last_prepared.declined.append(f"caching_precompile: fell back ({reason}): {type(exc).__name__}: {first_line}")
    return PrecompileFallback(f"{reason}: {type(exc).__name__}: {first_line}")


def outside_proven_torch(what: str) -> str | None:
    """Why the installed torch is not one where ``what`` was checked (PROVEN_TORCH); None when it is."""
    import torch

    release = torch_release(str(torch.__version__))
    if release is None or not PROVEN_TORCH[0] <= release <= PROVEN_TORCH[1]:
        low, high = (".".join(map(str, end)) for end in PROVEN_TORCH)
        return f"torch {torch.__version__} is outside {low}-{high}, where {what} was checked"
    return None


def precompile_loader_problem() -> str | None:
    """Why Dynamo's precompile loader of this torch cannot be guarded; None when it can.

    The guard relies on what was checked in the proven releases: ``CompilePackage.initialize``,
    ``install`` and ``uninstall``, the ``_initialized`` flag, ``DiskDynamoCache.load``, and
    ``_TorchDynamoContext.__call__`` catching RuntimeError around ``initialize``/``install``."""
    import inspect

    outside = outside_proven_torch("its precompile loader")
    if outside is not None:
        return outside
    try:
        eval_frame: Any = importlib.import_module("torch._dynamo.eval_frame")
        package: Any = importlib.import_module("torch._dynamo.package")
    except ImportError as exc:
        return f"Dynamo's precompile loader cannot be imported: {exc}"
    compile_package = getattr(package, "CompilePackage", None)
    disk_cache = getattr(package, "DiskDynamoCache", None)
    context = getattr(eval_frame, "_TorchDynamoContext", None)
    needed = (
        (compile_package, ("initialize", "install", "uninstall")),
        (disk_cache, ("load",)),
        (context, ("__call__",)),
    )
    if any(owner is None or not all(callable(getattr(owner, n, None)) for n in names) for owner, names in needed):
        return "this torch's Dynamo has no CompilePackage/DiskDynamoCache loader of the checked shape"
    try:
        caller = inspect.getsource(vars(context)["__call__"])
    except (OSError, TypeError):
        return "the source of Dynamo's loader is not installed, so its fallback cannot be checked"
    if "except RuntimeError" not in caller or "self._package.install(" not in caller:
        return "Dynamo's loader does not fall back on RuntimeError around install()"
    return None


def guard_precompile_loader() -> str | None:
    """Make every failure of Dynamo's precompile loader a counted fallback, never a crash.

    Torch loads a precompiled entry inside ``torch.compile``; its loader catches only
    RuntimeError, and only after ``initialize`` (a failed ``install`` then trips over its own
    "already initialized" check). Seen in the field: ``TypeError`` from unpickling the guards
    (torch 2.11, a Hugging Face BERT) and ``AttributeError`` while building a guard (torch 2.13).
    Wrapped here: reading the entry (any error: no entry, as for a miss), ``initialize`` and
    ``install`` (any error: the partial install undone, the package reset, and a
    :class:`PrecompileFallback` raised, which torch's loader catches to compile afresh). After the
    first fallback caching precompile is off for the process. Idempotent; returns why it could not
    guard (then the caller must leave caching precompile off), None when guarded."""
    problem = precompile_loader_problem()
    if problem is not None:
        return problem
    package: Any = importlib.import_module("torch._dynamo.package")
    compile_package = package.CompilePackage
    disk_cache = package.DiskDynamoCache
    if getattr(compile_package.install, "_compilecache_guarded", False):
        return None
    original_initialize = compile_package.initialize
    original_install = compile_package.install
    original_load = disk_cache.load

    def reset(pkg: Any) -> None:
        with contextlib.suppress(Exception):
            pkg.uninstall()
        pkg._initialized = False  # torch's fallback initializes the same package afresh

    @functools.wraps(original_initialize)
    def initialize(self: Any, fn: Any, dynamo: Any = None, ignore_inlined_sources: bool = False) -> None:
        try:
            original_initialize(self, fn, dynamo, ignore_inlined_sources)
        except Exception as exc:
            if dynamo is None:  # a fresh package, nothing loaded: not a precompiled entry's failure
                raise
            self._initialized = False
            raise _fall_back("initialize", exc) from exc

    @functools.wraps(original_install)
    def install(self: Any, backends: Any) -> None:
        try:
            original_install(self, backends)
        except Exception as exc:
            reset(self)
            raise _fall_back("install", exc) from exc
        advance_unique_ids(installed_scopes(self))

    @functools.wraps(original_load)
    def load(self: Any, fn: Any) -> Any:
        from torch._dynamo.utils import counters

        if refusing_entries:
            return None
        errors = counters["dynamo_cache"]["dynamo_cache_error"]
        try:
            found = original_load(self, fn)
        except Exception as exc:
            _fall_back("read", exc)
            return None
        if counters["dynamo_cache"]["dynamo_cache_error"] > errors:  # torch logged it and returned None
            _fall_back("read", RuntimeError("Dynamo could not read the precompiled entry"))
        return found

    for owner, name, wrapper in (
        (compile_package, "initialize", initialize), (compile_package, "install", install), (disk_cache, "load", load)
    ):  # fmt: skip
        setattr(wrapper, "_compilecache_guarded", True)  # noqa: B010 (a flag on a function object)
        setattr(owner, name, wrapper)
    return None


UNIQUE_ID = re.compile(r"^__\w*?_(\d+)(?:_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})?$")
"""A name Dynamo minted with ``unique_id`` (``__builtins_dict___0``, ``__compiled_fn_1_<uuid>``)."""


def highest_unique_id(names: Iterable[str]) -> int:
    """The largest counter value among Dynamo-minted ``names``; -1 when there is none (pure)."""
    found = [int(m.group(1)) for m in map(UNIQUE_ID.match, names) if m is not None]
    return max(found, default=-1)


def installed_scopes(package: Any) -> list[dict[str, Any]]:
    """The module dictionaries a loaded precompiled package wrote its globals into."""
    scopes: list[dict[str, Any]] = []
    modules = list(getattr(package, "_installed_globals", {}) or {})
    for entry in getattr(package, "_codes", {}).values():
        module = sys.modules.get(getattr(entry, "python_module", ""))
        if module is not None:
            modules.append(module)
    for module in modules:
        scope = getattr(module, "__dict__", None)
        if isinstance(scope, dict) and all(scope is not s for s in scopes):
            scopes.append(scope)
    return scopes


def advance_unique_ids(scopes: Iterable[Mapping[str, Any]]) -> None:
    """Move Dynamo's name counter past the names a loaded package brought from the warm-up's process.

    Those names (``__builtins_dict___0`` …) were minted by another process's counter. When a guard of
    the loaded entry then fails in this process (another thread count, grad mode, default dtype …),
    Dynamo compiles the frame afresh and mints the same names from its own counter, which starts at 0:
    torch 2.11-2.14 then fail the first call with ``AssertionError: Name '__builtins_dict___0' already
    exists in scope`` (torch 2.15 mints names free in the scope). Only ever moves the counter forward."""
    highest = max((highest_unique_id(scope) for scope in scopes), default=-1)
    if highest < 0:
        return
    try:
        transformation: Any = importlib.import_module("torch._dynamo.bytecode_transformation")
    except ImportError:
        return
    counter = getattr(transformation, "_unique_id_counter", None)
    if not isinstance(counter, itertools.count):
        return
    transformation._unique_id_counter = itertools.count(max(next(counter), highest + 1))


def prepare(cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Prepared:
    """Apply the warm-start manifest of the cache directory; call before the first ``torch.compile``.

    ``cache_dir`` defaults to ``$TORCHINDUCTOR_CACHE_DIR``. Never raises for a missing,
    unreadable or foreign manifest: it falls back to torch's own path and says why."""
    global last_prepared
    environ = os.environ if env is None else env
    where = cache_dir if cache_dir is not None else environ.get(CACHE_DIR_ENV)
    done = Prepared(cache_dir=str(where) if where else None)
    last_prepared = done
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
    if manifest["dynamo_precompile"]:
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

    outside = outside_proven_torch("its compile-worker pool")
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
    problem = guard_precompile_loader()
    if problem is not None:
        _set_caching_precompile(False)
        done.declined.append(f"caching_precompile: {problem}")
        return
    enable_caching_precompile()
    done.applied.append("caching_precompile")
