"""The guard around Dynamo's loader of precompiled entries: a failure is a counted fallback, never a crash.

:func:`cachelib.in_image.warmstart.prepare` turns Dynamo's caching precompile on only on the torch releases
this guard was checked against (:data:`PROVEN_TORCH`) and only once :func:`guard_precompile_loader`
is in place. Standard library only at import, like :mod:`cachelib.in_image.warmstart`, beside which it is
copied into warm-up containers.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)
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
said_to: list[str] | None = None
"""Where a fallback is said too: the ``declined`` list of the last :func:`cachelib.in_image.warmstart.prepare`."""


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
    if said_to is not None:
        said_to.append(f"caching_precompile: fell back ({reason}): {type(exc).__name__}: {first_line}")
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
