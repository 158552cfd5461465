"""The warm-up's proof of its precompiled part: load it as a pod will, before it ships.

With ``--precompile auto`` the harness saves Dynamo's precompiled entries into the cache
directory. Torch loads them inside ``torch.compile`` of the pod's process, and an entry that
cannot be loaded there (seen: a Hugging Face BERT on torch 2.11 and 2.13) would crash the pod.
So before anything ships, the harness checks the part the way a pod uses it:

1. a copy of the cache directory (the bundle-to-be) in a new place;
2. a fresh process of the same image with the pod's environment (the warm-up's Inductor settings,
   ``TORCHINDUCTOR_CACHE_DIR`` on the copy, the job id) that calls the workload's ``warm_start()``
   (:func:`cachelib.in_image.warmstart.prepare`, which turns caching precompile on), builds each entry of
   the target, runs it eagerly and compiled, and compares the outputs (and gradients, for a
   training step) within a tolerance per dtype;
3. torch's counters: a Dynamo cache hit, no Dynamo miss, no frame compiled afresh, no fallback;
4. a second fresh process as a pod without ``warm_start()`` runs (:data:`PLAIN`): the same entries,
   with nothing but the environment, must hit the FX-graph and AOTAutograd caches (the entries
   Off would have shipped, which the harness's first pass wrote);
5. the first compiled call of both, timed in their own processes: a part that makes the pod's
   first call slower than the bundle without it is left out too (``slower``), after a second
   pair of samples confirms it.

Only a part that passes is published as precompiled. One that fails is removed from the cache
directory and the Mega-Cache (the FX-graph and AOTAutograd parts stay and still hit), and the
manifest records why (``precompile_check``); the harness's result says it too.

Standard library only at import (copied beside ``harness.py`` into warm-up containers, like
``warmstart.py``); torch is imported by the functions that need it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.precheck
    from cachelib.in_image import podcontract
else:  # beside harness.py in a warm-up container: podcontract.py is copied there too
    import podcontract

CHECK_FILE = "precompile-check.json"
"""What the checking process writes into its output directory."""
DYNAMO_DIR = "dynamo"
SEED = 0

TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-5, 1e-6),
    "float32": (1e-3, 1e-4),
    "complex64": (1e-3, 1e-4),
    "complex128": (1e-5, 1e-6),
    "float16": (1e-2, 1e-3),
    "bfloat16": (5e-2, 1e-2),
}
"""dtype -> (rtol, atol) between a compiled output and eager's, element by element. Inductor fuses
and reorders float arithmetic, so these are looser than ``torch.testing``'s defaults; integer and
bool outputs must be equal. A wrong graph or wrong guard is off by far more."""
FP8_TOLERANCE = (0.25, 0.1)
SCALED: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-4),
    "float32": (1e-4, 2e-2),
    "complex64": (1e-4, 2e-2),
    "complex128": (1e-6, 1e-4),
    "float16": (5e-4, 5e-2),
    "bfloat16": (2e-3, 1e-1),
}
"""dtype -> (1 - cosine similarity, largest difference ÷ largest eager value): the whole-tensor test
an output that fails the element test may still pass, as torch's own accuracy checks allow.
Inductor's numerics differ from eager's by an ulp or so where values are near zero (bf16 GPT-2:
0.031 at an element near 0; a float32 ResNet training step's logits: 0.0077; on an H100, the same
with or without a precompiled entry); a wrong result turns the direction of the tensor (cosine)
or its scale."""
FP8_SCALED = (2e-2, 0.5)
RAISED = "building or calling the entries raised "
"""How the checking process reports an exception (seen: a NameError from a loaded entry's first call)."""
PRECOMPILED = "precompiled"
"""The checking process as a pod that calls ``warm_start()``: the precompiled part loaded."""
PLAIN = "plain"
"""The checking process as a pod without ``warm_start()``: the environment only, no caching precompile."""
ROLES = (PRECOMPILED, PLAIN)
SLOWER_MARGIN = (1.10, 0.05)
"""(factor, seconds): the precompiled part is ``slower`` when its pod's first call takes longer than
factor × the plain pod's plus these seconds, in every sample of both (two each: a second pair is
taken only when the first says slower)."""


@dataclass(frozen=True)
class Verdict:
    """What the check decided: verified, or not with the first reason."""

    verified: bool
    reason: str | None
    seconds: float
    details: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "reason": self.reason, "seconds": round(self.seconds, 4), **self.details}


# -- comparing outputs (pure, given torch tensors) ---------------------------------------------------
def tolerance(dtype_name: str) -> tuple[float, float] | None:
    """(rtol, atol) for a floating dtype name (``float32``, ``bfloat16``...); None: must be equal."""
    if dtype_name.startswith("float8"):
        return FP8_TOLERANCE
    return TOLERANCES.get(dtype_name)


def leaves(value: Any, path: str = "out") -> Iterator[tuple[str, Any]]:
    """(path, tensor) of every tensor in an output: tensors, mappings (Hugging Face outputs),
    sequences and dataclass-like objects with ``to_tuple``; other leaves are skipped."""
    import torch

    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for key in value:
            yield from leaves(value[key], f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from leaves(item, f"{path}[{index}]")
    elif callable(getattr(value, "to_tuple", None)):
        yield from leaves(value.to_tuple(), path)


def difference(path: str, want: Any, got: Any, values: bool = True) -> str | None:
    """Why two tensors differ (shape and dtype; with ``values``, values beyond the tolerance of their
    dtype); None when they agree."""
    import torch

    if tuple(want.shape) != tuple(got.shape) or want.dtype != got.dtype:
        return f"{path}: eager {want.dtype}{list(want.shape)}, compiled {got.dtype}{list(got.shape)}"
    if not values:
        return None
    want, got = want.detach().cpu(), got.detach().cpu()
    dtype_name = str(want.dtype).removeprefix("torch.")
    limits = tolerance(dtype_name)
    if limits is None:
        return None if torch.equal(want, got) else f"{path}: {dtype_name} values differ from eager"
    if want.is_complex():
        want, got = torch.view_as_real(want), torch.view_as_real(got)
    want, got = want.double(), got.double()
    rtol, atol = limits
    if torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
        return None
    worst = float((got - want).abs().nan_to_num(nan=float("inf")).max())
    if _scaled_close(dtype_name, want, got, worst):
        return None
    return f"{path}: {dtype_name} max abs difference {worst:.3g} from eager (rtol {rtol}, atol {atol})"


def _scaled_close(dtype_name: str, want: Any, got: Any, worst: float) -> bool:
    """The whole-tensor test of :data:`SCALED`: nearly the same direction and a largest difference
    small against the largest value. Finite values only; a NaN where eager has none fails."""
    import torch

    cos_tol, scale_tol = FP8_SCALED if dtype_name.startswith("float8") else SCALED.get(dtype_name, (0.0, 0.0))
    if not (torch.isfinite(got) == torch.isfinite(want)).all() or want.numel() < 2:
        return False
    w, g = want.nan_to_num().flatten(), got.nan_to_num().flatten()
    largest = float(w.abs().max())
    if largest == 0.0:
        return False
    cosine = float(torch.nn.functional.cosine_similarity(w, g, dim=0))
    return 1.0 - cosine <= cos_tol and worst <= scale_tol * largest


def compare(want: Any, got: Any, values: bool = True) -> list[str]:
    """Every difference between an eager and a compiled output, structure included (values only with ``values``)."""
    wanted, gotten = list(leaves(want)), list(leaves(got))
    if [p for p, _ in wanted] != [p for p, _ in gotten]:
        return [f"output structure differs: eager {[p for p, _ in wanted]}, compiled {[p for p, _ in gotten]}"]
    return [d for (path, w), (_, g) in zip(wanted, gotten, strict=True) if (d := difference(path, w, g, values))]


def judge(counters: Mapping[str, Mapping[str, int]], fell_back: Sequence[str], problems: Sequence[str]) -> str | None:
    """The first reason a checked precompiled part cannot ship; None when it passed (pure).
    ``fell_back``: what the guarded loader said of each entry it refused."""
    if fell_back:
        return f"the precompiled entry failed to load: {fell_back[0]}"
    if problems and problems[0].startswith(RAISED):
        return problems[0]
    if problems:
        return "outputs differ from eager: " + problems[0]
    dynamo = counters.get("dynamo_cache", {})
    if not dynamo.get("dynamo_cache_hit"):
        return "Dynamo did not load the precompiled entry (no dynamo_cache_hit)"
    if dynamo.get("dynamo_cache_miss") or dynamo.get("dynamo_cache_error"):
        return f"Dynamo missed precompiled entries: {dict(dynamo)}"
    compiled = counters.get("frames", {}).get("ok", 0)
    if compiled:
        return f"Dynamo compiled {compiled} frame(s) afresh beside the precompiled entry"
    return None


def restarted_attempts(counters: Mapping[str, Mapping[str, int]]) -> int:
    """AOTAutograd compiles that Dynamo restarted before they ended (pure): ``total`` counts each start,
    ``ok`` and ``not_ok`` each end, and a restart (torch's ``TensorifyScalarRestartAnalysis``, when a
    Python float of a dynamic-shape graph cannot become a tensor) ends neither. Each such attempt looks
    its key up, misses, and is never saved, in the warm-up as in every pod: no cache can serve it."""
    aot = counters.get("aot_autograd", {})
    return max(0, aot.get("total", 0) - aot.get("ok", 0) - aot.get("not_ok", 0))


def avoidable_misses(counters: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The FX-graph and AOTAutograd misses a cache could have served (pure): every miss but those of
    restarted attempts (:func:`restarted_attempts`)."""
    inductor, aot = counters.get("inductor", {}), counters.get("aot_autograd", {})
    return {
        "FX-graph": inductor.get("fxgraph_cache_miss", 0),
        "AOTAutograd": max(0, aot.get("autograd_cache_miss", 0) - restarted_attempts(counters)),
    }


def judge_plain(counters: Mapping[str, Mapping[str, int]], problems: Sequence[str]) -> str | None:
    """Why a pod without ``warm_start()`` would not start warm on this bundle; None when every
    FX-graph and AOTAutograd lookup a cache can serve hit (pure)."""
    if problems:
        return problems[0] if problems[0].startswith(RAISED) else "outputs differ from eager: " + problems[0]
    inductor, aot = counters.get("inductor", {}), counters.get("aot_autograd", {})
    misses = {name: count for name, count in avoidable_misses(counters).items() if count}
    if misses:
        return "missed " + ", ".join(f"{count} {name} lookup(s)" for name, count in misses.items())
    if not inductor.get("fxgraph_cache_hit") and not aot.get("autograd_cache_hit"):
        return "no FX-graph or AOTAutograd lookup hit"
    return None


def slower(precompiled: Sequence[float], plain: Sequence[float]) -> str | None:
    """``slower: ...`` when every sample of the precompiled pod's first call is beyond the margin over
    every sample of the plain pod's (pure): an outlier on either side never decides alone. None when
    the part pays for itself, or a side has no sample."""
    factor, seconds = SLOWER_MARGIN
    if not precompiled or not plain or min(precompiled) <= max(plain) * factor + seconds:
        return None
    return (
        f"slower: the first call took {min(precompiled):.2f} s with the precompiled part "
        f"and {max(plain):.2f} s without it"
    )


# -- the checking process ----------------------------------------------------------------------------
Entry = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _grads(fn: Any) -> list[tuple[str, Any]]:
    params = getattr(fn, "named_parameters", None)
    if not callable(params):
        return []
    return [(f"grad.{name}", p.grad.detach().clone()) for name, p in params() if p.grad is not None]


def _zero_grads(fn: Any) -> None:
    params = getattr(fn, "parameters", None)
    if callable(params):
        for p in params():
            p.grad = None


def _one_call(call: Callable[[], Any], fn: Any, training: bool, seed: int = SEED) -> tuple[Any, list[tuple[str, Any]]]:
    """Run ``call`` from a given random state; its output and, for a training step, the gradients."""
    import torch

    torch.manual_seed(seed)
    _zero_grads(fn)
    output = call()
    return output, (_grads(fn) if training else [])


def check_entries(
    entries: Sequence[Entry],
    compile_entry: Callable[[Callable[..., Any]], Callable[..., Any]],
    eager_entry: Callable[[Callable[..., Any]], Callable[..., Any]],
    run_entry: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any],
    training: bool,
    first_calls: list[float] | None = None,
) -> tuple[list[str], list[str]]:
    """Each entry eager and compiled from the same random state; the differences, and notes on
    what could not be compared. Eager runs once more from another random state: a model whose
    output depends on it (dropout left on, sampling) cannot match a compiled run value for value
    (Inductor draws its random numbers its own way), so only its structure is compared.
    ``first_calls`` receives the seconds of each entry's first compiled call (load and compile
    included), in order."""
    problems: list[str] = []
    notes: list[str] = []
    for index, (fn, args, kwargs) in enumerate(entries):
        eager, compiled = eager_entry(fn), compile_entry(fn)  # compile_entry only wraps: nothing runs yet

        def call(runnable: Callable[..., Any], a: tuple[Any, ...] = args, k: dict[str, Any] = kwargs) -> Any:
            return run_entry(runnable, a, k)

        want, want_grads = _one_call(functools.partial(call, eager), fn, training)
        other, other_grads = _one_call(functools.partial(call, eager), fn, training, seed=SEED + 1)
        started = time.perf_counter()
        got, got_grads = _one_call(functools.partial(call, compiled), fn, training)
        if first_calls is not None:
            first_calls.append(time.perf_counter() - started)
        random = bool(compare((want, dict(want_grads)), (other, dict(other_grads))))
        if random:
            notes.append(f"entry {index}: the output depends on the random state; only its structure was compared")
        found = compare((want, dict(want_grads)), (got, dict(got_grads)), values=not random)
        problems.extend(f"entry {index}: {f}" for f in found)
    return problems, notes


def write_check(out: Path, record: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / CHECK_FILE).write_text(json.dumps(dict(record), sort_keys=True) + "\n")


# -- the warm-up side ---------------------------------------------------------------------------------
def warm_up_only(name: str) -> bool:
    """Whether variable ``name`` of the warm-up's environment is one a pod of the same image and settings lacks
    (pure): where the warm-up's caches go (``*_CACHE_DIR``, Triton's cache settings), a remote cache's switches
    and address (a check reads the copy alone), the byte-code cache, and ``TORCH_CACHING_PRECOMPILE``. Every
    other Inductor variable, an image's own or the spec's, is the pods' too and enters torch's cache keys: a
    check without it would look up other keys than the pods do."""
    return (name.endswith("_CACHE_DIR") or name.startswith(("TRITON_CACHE", "TORCHINDUCTOR_REDIS_"))
            or "REMOTE_CACHE" in name or name in ("PYTHONPYCACHEPREFIX", podcontract.PRECOMPILE_ENV))  # fmt: skip


def check_environment(
    base: Mapping[str, str], cache_copy: Path, job_id: str, pycache: Path | None = None
) -> dict[str, str]:
    """The pod's environment for the checking process (pure): the warm-up's, less what only the warm-up has
    (:func:`warm_up_only`), plus what the webhook gives a pod; never ``TORCH_CACHING_PRECOMPILE``
    (``warm_start()`` turns caching precompile on, behind its guard); ``pycache``: the copy's byte-code tree,
    when the bundle carries one (the webhook points ``PYTHONPYCACHEPREFIX`` at it)."""
    env = {k: v for k, v in base.items() if not warm_up_only(k)}
    env.update({podcontract.CACHE_DIR_ENV: str(cache_copy), podcontract.JOB_ID_ENV: job_id})
    if pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def check_in_fresh_process(
    argv: Sequence[str], cache_dir: Path, job_id: str, timeout: float, pycache_dir: str | None = None
) -> Verdict:
    """Copy ``cache_dir``, run ``argv`` (the harness in check mode) against the copy, read its verdict.
    ``pycache_dir``: the name of the byte-code tree in the cache directory (cachelib.in_image.bytecode), used
    as the pod will use it when the bundle carries one."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="compilecache-check-") as work:
        copy = Path(work) / "cache"
        shutil.copytree(cache_dir, copy, ignore=shutil.ignore_patterns("locks", "*.lock", ".*.partial"))
        out = Path(work) / "out"
        command = [*argv, "--out", str(out), "--cache-dir", str(copy)]
        pycache = copy / pycache_dir if pycache_dir else None
        env = check_environment(os.environ, copy, job_id, pycache if pycache is not None and pycache.is_dir() else None)
        try:
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return Verdict(False, f"the check did not finish in {timeout:.0f} s", time.perf_counter() - started, {})
        seconds = time.perf_counter() - started
        try:
            record = json.loads((out / CHECK_FILE).read_text())
        except (OSError, ValueError):
            tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            sys.stderr.write(proc.stderr[-4000:])
            return Verdict(False, f"the checking process failed (exit {proc.returncode}): {tail}", seconds, {})
    reason = record.pop("reason", None)
    return Verdict(bool(record.pop("verified", False)) and reason is None, reason, seconds, record)


def strip_precompiled(cache_dir: Path) -> int:
    """Remove Dynamo's precompiled entries (``dynamo/<id>/``) from ``cache_dir``; how many.
    Dynamo's profile of dynamic shapes (``dynamo/code_state_*``) is no precompiled code and stays."""
    removed = 0
    for entry in sorted((cache_dir / DYNAMO_DIR).glob("*/entry")):
        shutil.rmtree(entry.parent)
        removed += 1
    return removed


def without_precompiled_artifacts(data: bytes) -> bytes | None:
    """The Mega-Cache ``data`` less its precompiled entries (torch would write them back into
    the cache directory at ``load_cache_artifacts``); None when this torch's format cannot be
    rewritten (then ship no Mega-Cache: the cache-directory part still hits)."""
    if not data:
        return data
    try:
        from torch.compiler._cache import CacheArtifactManager, _serialize_single_cache
        from torch.utils._appending_byte_serializer import AppendingByteSerializer
    except ImportError:
        return None
    artifacts = CacheArtifactManager.deserialize(data)
    if artifacts is None:
        return None
    kept = [(kind, items) for kind, items in artifacts.items() if kind != "precompile"]
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(kept)
    return bytes(serializer.to_bytes()) if kept else b""


def merged_artifacts(first: bytes, second: bytes) -> bytes | None:
    """One Mega-Cache of two (the harness's passes): every artifact of both, each key once, the first's
    kept where both have it; None when this torch's format cannot be read or rewritten."""
    try:
        from torch.compiler._cache import CacheArtifactManager, _serialize_single_cache
        from torch.utils._appending_byte_serializer import AppendingByteSerializer
    except ImportError:
        return None
    parts = [CacheArtifactManager.deserialize(data) if data else {} for data in (first, second)]
    if any(part is None for part in parts):
        return None
    merged: dict[Any, list[Any]] = {}
    for part in parts:
        for kind, items in (part or {}).items():
            have = merged.setdefault(kind, [])
            seen = {getattr(item, "key", None) for item in have}
            have.extend(item for item in items if getattr(item, "key", None) not in seen)
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(list(merged.items()))
    return bytes(serializer.to_bytes())
