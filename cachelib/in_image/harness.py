"""The compilecache warm-up harness: compile models into a fresh inductor cache directory.

It runs inside the user's own image, so it needs nothing but the standard library, torch
(imported only once the cache directory is set) and ``compilecache``'s stdlib-only modules the
warm-up Job copies beside it: :mod:`cachelib.in_image.compilekey` (the compile options, key fields and digests
the operator and the CLI share), :mod:`cachelib.in_image.compilestep` (loading the target, compiling and
running its entries) and :mod:`cachelib.in_image.podcontract`::

    python harness.py --target mypkg.models:warmup --out /out --namespace team-a --name llama \\
        [--mode M] [--dynamic true|false|auto] [--fullgraph] [--backend inductor] \\
        [--compiled-autograd] [--backward] [--precompile auto|off] [--command "..."]

It writes the output directory that ``compilecache pack`` / ``publish`` turn into a bundle:

- ``OUT/cachedir/`` -- the ``TORCHINDUCTOR_CACHE_DIR`` the compile wrote (triton cache included);
- ``OUT/megacache.bin`` -- the bytes of ``torch.compiler.save_cache_artifacts()`` (empty when none);
- ``OUT/cachedir/compilecache-warm-start.json`` and ``OUT/cachedir/dynamo/`` -- with
  ``--precompile auto``: the warm-start manifest and Dynamo's precompiled entries (see
  ``warmstart.py``, copied beside this file like ``targets.py``);
- ``OUT/result.json`` -- the cache key fields, versions, device, job id, compile seconds per
  target, torch's cache counters and the Mega-Cache size.

A target ``module:function`` (or the short name of a built-in one: ``tiny_mlp``,
``transformer_block``, ``small_convnet``) returns a list of
``(callable_or_module, example_args[, example_kwargs])``; the harness compiles each with
the requested options and calls it once: under ``torch.no_grad()`` by default (inference),
forward and backward with ``--backward``, as one compiled training step (forward, a sum of
the floating outputs as loss, backward) with ``--compiled-autograd``. A target that takes
one parameter receives a ``compile(fn)`` function applying the requested options; a target
may also compile and run its own models and return ``None``.

Exit status: 0 done, 2 bad arguments, 3 target cannot be imported, 4 target (or command)
failed, 5 target returned the wrong shape, 6 output cannot be written, 7 (only with
``--require-precompile``) the output is complete but its precompiled part was left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.harness
    from cachelib.in_image import compilekey, compilestep, podcontract, precompileparts, stagelog
else:  # run as a script in the warm-up pod: the warm-up Job copies these modules beside this file
    import compilekey
    import compilestep
    import podcontract
    import precompileparts
    import stagelog


HARNESS_VERSION = "1"
RESULT_FORMAT = 1
RESULT_FILE = podcontract.RESULT_FILE
MEGACACHE_FILE = podcontract.MEGACACHE_FILE
CACHEDIR = podcontract.CACHEDIR
CACHE_DIR_ENV = podcontract.CACHE_DIR_ENV
PRECOMPILE_ENV = podcontract.PRECOMPILE_ENV
JOB_ID_ENV = podcontract.JOB_ID_ENV
CHECK_FLAG = "--check-precompile"
"""The harness in its checking role (cachelib.in_image.precheck): run by the harness itself, never by users."""
REQUIRE_FLAG = "--require-precompile"
EXIT_PRECOMPILE_LEFT_OUT = 7
"""With ``--require-precompile``: the output is complete, but its precompiled part was left out."""
LOG_FILE = precompileparts.LOG_FILE
_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def load_precheck() -> Any:
    """``cachelib.in_image.precheck``, or ``precheck.py`` beside this file (a warm-up container)."""
    return compilestep.load_companion("cachelib.in_image.precheck")


def load_warmstart() -> Any:
    """``cachelib.in_image.warmstart``, or ``warmstart.py`` beside this file (a warm-up container)."""
    return compilestep.load_companion("cachelib.in_image.warmstart")


stages = stagelog.Stages("harness")
"""The harness's own progress (stderr: the warm-up Job's log, or ``compilecache warmup``'s terminal)."""


# -- the run ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    out: Path
    namespace: str
    name: str
    options: compilekey.CompileOptions
    target: str | None = None
    command: str | None = None
    cache_dir: Path | None = None

    @property
    def cache_path(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.out / CACHEDIR


def prepare_environment(request: Request, job_id: str) -> dict[str, str]:
    """Point inductor (and triton under it) at the cache directory, set the job id; before torch loads."""
    if "torch._inductor" in sys.modules:
        raise compilestep.HarnessError("torch's inductor was imported before the harness could set its cache directory")
    request.cache_path.mkdir(parents=True, exist_ok=True)
    os.environ[CACHE_DIR_ENV] = str(request.cache_path)
    os.environ[JOB_ID_ENV] = job_id
    os.environ.pop("TRITON_CACHE_DIR", None)  # keep triton's cache inside the inductor cache dir
    # Never TORCH_CACHING_PRECOMPILE here: the first pass (and a --command, which ships no precompiled part)
    # compiles exactly as Off does, so the bundle's FX-graph and AOTAutograd entries are Off's (caching
    # precompile keys AOTAutograd's entries on its own backend id, which no other process reproduces).
    os.environ.pop(PRECOMPILE_ENV, None)
    return dict(os.environ)


def apply_options(options: compilekey.CompileOptions, job_id: str) -> None:
    """The compile options into torch's configs (caching precompile stays off: :func:`precompile_pass`)."""
    import torch

    torch.compiler.config.job_id = job_id
    torch._dynamo.config.compiled_autograd = options.compiled_autograd
    load_warmstart().disable_caching_precompile()
    import torch._inductor.config as inductor_config

    for name, value in options.inductor_config:
        if not hasattr(inductor_config, name.split(".")[0]):
            raise compilestep.HarnessError(
                f"--inductor-config {name}: torch._inductor.config has no such option", compilestep.EXIT_USAGE
            )
        target: Any = inductor_config
        *parents, leaf = name.split(".")
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)


def save_megacache(out: Path) -> dict[str, Any]:
    """``torch.compiler.save_cache_artifacts()`` into OUT/megacache.bin (empty when nothing was saved)."""
    import torch

    saved = torch.compiler.save_cache_artifacts()
    data, info = (saved[0], saved[1]) if saved else (b"", None)
    _write_atomic(out / MEGACACHE_FILE, data)
    artifacts = {str(k): len(v) for k, v in getattr(info, "artifacts", {}).items()} if info is not None else {}
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "artifacts": artifacts}


def warm_up(request: Request) -> dict[str, Any]:
    """Compile the target (or run the command) and write the output directory; the result."""
    model = compilekey.model_digest(request.target, request.command)
    options_digest = request.options.digest()
    job_id = os.environ.get(JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    env = prepare_environment(request, job_id)
    stages.stage(f"importing torch and the target {request.target}" if request.target else "importing torch")
    function = compilestep.load_target(request.target) if request.target is not None else None
    apply_options(request.options, job_id)
    versions = compilestep.detect_versions()
    device = compilestep.detect_device()
    fields = compilekey.key_fields(request.namespace, request.name, model, options_digest, device, versions)
    factors = compilestep.load_companion("cachelib.in_image.factors")
    factors.install()  # what decides torch's cache keys, per graph (cachelib.in_image.factors)

    started = time.perf_counter()
    if request.command is not None:
        stages.stage(f"running the command ({command_name(request.command)}) with the cache environment")
        timings = compilestep.run_command(request.command, command_environment(env))
        counters: dict[str, dict[str, int]] | None = None
    else:
        assert request.target is not None
        timings = compilestep.run_target(request.target, request.options, function, on_entry=entry_stage(""))
        counters = compilestep.counters_snapshot()
    total = time.perf_counter() - started
    stages.stage("recording the compile factors")
    recorded = write_factors(request.cache_path, factors, request.command, job_id)  # pods compare with Off's graphs
    stages.stage("saving the Mega-Cache")
    megacache = save_megacache(request.out)
    precompile_pass_result = None
    if request.options.precompile == "auto" and request.target is not None:
        stages.stage("compiling once more with Dynamo's caching precompile, in a fresh process")
        harness = Path(__file__).absolute()
        precompile_pass_result = precompileparts.precompile_in_fresh_process(request, harness, PASS_FLAG, job_id, total)
        added = precompile_pass_result.pop("megacache", None)
        megacache = precompileparts.merge_megacache(request.out, megacache, added)
    stages.stage("writing the byte code of the imported modules")
    bytecode = write_bytecode(request)
    companion = compilestep.load_companion("cachelib.in_image.triton_modules")
    triton_modules = companion.collect(request.cache_path).to_dict()
    precompile = write_warm_start(request) if request.options.precompile == "auto" else None
    if precompile is not None:
        precompile["pass"] = precompile_pass_result
        failure = (precompile_pass_result or {}).get("failure") or (
            None if request.target is not None else "a --command warm-up cannot be checked; precompile needs --target"
        )
        if failure is not None:
            precompileparts.record_check(request.cache_path, {"verified": False, "reason": failure})
            precompile["check"] = {"verified": False, "reason": failure, "seconds": 0.0}
        elif precompile["dynamo_entries"]:
            stages.stage("checking the precompiled part in fresh processes, as pods will load it")
            precompile.update(prove_precompiled(request, job_id, total))
            megacache = precompileparts.megacache_after_check(request.out, megacache, precompile)
        else:
            reason = "caching precompile saved no Dynamo entry for this target"
            precompileparts.record_check(request.cache_path, {"verified": False, "reason": reason})
            precompile["check"] = {"verified": False, "reason": reason, "seconds": 0.0}
    result = {
        "format": RESULT_FORMAT,
        "producer": f"compilecache-harness/{HARNESS_VERSION}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "key": fields,
        "key_string": compilekey.key_string(fields),
        "job_id": job_id,
        "target": compilekey.canonical_target(request.target) if request.target else None,
        "command": request.command,
        "options": request.options.to_dict(),
        "versions": versions,
        "device": device,
        "cache_dir": str(request.cache_path),
        "targets": timings,
        "compile_seconds": round(total, 4),
        "counters": counters,
        "cache": compilestep.cache_summary(counters) if counters is not None else None,
        "megacache": megacache,
        "precompile": precompile,
        "bytecode": bytecode,
        "triton_modules": triton_modules,
        "factors": recorded,
    }
    _write_atomic(request.out / RESULT_FILE, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    return result


COMMAND_FACTORS = (
    "a --command warm-up compiles in the command's own process, which the harness leaves as it is: only the "
    "process's factors (versions, installation, device, environment) were recorded, not its graphs"
)


def write_factors(
    cache_path: Path, factors: Any, command: str | None = None, job_id: str | None = None
) -> dict[str, Any]:
    """The factors of torch's cache keys this warm-up saw (:mod:`cachelib.in_image.factors`), into the cache
    directory; how many graphs it holds, or why none were recorded. A ``--command`` runs in a process
    of its own: its graphs are not seen here, but the process factors (the same interpreter, found
    first on PATH, the same environment) are the command's."""
    document = factors.document()
    document["job_id"] = job_id
    if command is not None:
        document["recorded"], document["problem"] = False, COMMAND_FACTORS
    try:
        factors.write_json(cache_path / factors.FACTORS_NAME, document)
    except OSError as exc:
        message = f"cannot write {factors.FACTORS_NAME}: {exc.strerror or exc}"
        raise compilestep.HarnessError(message, compilestep.EXIT_OUTPUT) from exc
    return {"file": factors.FACTORS_NAME, "graphs": len(document["graphs"]), "problem": document["problem"]}


def entry_stage(prefix: str) -> Callable[[int, int, str], None]:
    """The progress line of each entry as it starts compiling."""

    def said(index: int, count: int, name: str) -> None:
        stages.stage(f"{prefix}compiling and running entry {index + 1} of {count} ({name})")

    return said


def command_name(command: str) -> str:
    """The program a ``--command`` runs (its first word), for the progress line: the rest may carry
    values that are nobody's business in a log."""
    words = command.split()
    return os.path.basename(words[0]) if words else "?"


def command_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The command's environment: the cache environment, with this interpreter's directory first on
    PATH, so that ``python`` in a ``--command`` is the Python (and torch) the harness runs with and
    records, not whichever comes first on PATH."""
    here = os.path.dirname(sys.executable)
    rest = [d for d in env.get("PATH", os.defpath).split(os.pathsep) if d and d != here]
    return {**env, "PATH": os.pathsep.join([here, *rest])}


PASS_FLAG = "--precompile-pass"
"""The harness as ``--precompile auto``'s second pass (:func:`precompile_pass`): run by the harness itself."""
def precompile_pass(request: Request) -> int:
    """The second pass's own process (``--precompile-pass``): compile the target with caching precompile,
    save the Mega-Cache (which writes Dynamo's entries into the cache directory), and say what it did in
    OUT/precompile-pass.json; a compile that fails is reported there, not by the exit status."""
    assert request.target is not None
    job_id = os.environ.get(JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    os.environ[CACHE_DIR_ENV] = str(request.cache_path)
    os.environ.pop("TRITON_CACHE_DIR", None)
    os.environ[PRECOMPILE_ENV] = "1"  # read by torch at import
    function = compilestep.load_target(request.target)
    apply_options(request.options, job_id)
    warmstart = load_warmstart()
    record: dict[str, Any] = {"failure": None, "dropped_guards": 0}
    if not warmstart.enable_caching_precompile():
        record["failure"] = "this torch has no Dynamo caching precompile"
        precompileparts.write_pass_record(request.out, record)
        return compilestep.EXIT_OK
    dropped = precompileparts.DroppedGuards(request.out / LOG_FILE)
    logging.getLogger("torch._dynamo.guards").addFilter(dropped)
    before = compilestep.cache_summary(compilestep.counters_snapshot())
    try:
        compilestep.run_target(request.target, request.options, function, on_entry=entry_stage("caching precompile: "))
        save_megacache(request.out)
    except compilestep.HarnessError as exc:
        if exc.exit_code != compilestep.EXIT_FAILED:
            raise
        record["failure"] = (
            f"compiling with Dynamo's caching precompile failed: {(str(exc).splitlines() or [''])[0][:300]}"
        )
    finally:
        logging.getLogger("torch._dynamo.guards").removeFilter(dropped)
    after = compilestep.cache_summary(compilestep.counters_snapshot())
    record.update(cache={k: after[k] - before.get(k, 0) for k in after}, dropped_guards=dropped.count)
    precompileparts.write_pass_record(request.out, record)
    return compilestep.EXIT_OK


def write_bytecode(request: Request) -> dict[str, Any]:
    """The byte code of every module the warm-up imported, into the cache directory (the bundle's
    byte-code part, :mod:`cachelib.in_image.bytecode`), unless the image carries its own; what was written."""
    if request.target is None:
        return {"files": 0, "bytes": 0, "sources": 0, "skipped": "a --command warm-up imports in its own process"}
    started = time.perf_counter()
    module = compilestep.load_companion("cachelib.in_image.bytecode")
    tree = module.write_tree(module.imported_sources(), request.cache_path).to_dict()
    tree["seconds"] = round(time.perf_counter() - started, 3)
    return dict(tree)


def prove_precompiled(request: Request, job_id: str, compile_seconds: float) -> dict[str, Any]:
    """Check the precompiled part as pods will use it (:mod:`cachelib.in_image.precheck`): a fresh process that
    calls ``warm_start()`` must load it and match eager, and a fresh process without the call must hit
    every FX-graph and AOTAutograd entry (Off's). When the part fails, or makes the first call slower
    than the bundle without it, take it out of the cache directory and record why in the manifest.
    What the check decided, with the plain pod's own result beside it."""
    precheck = load_precheck()
    assert request.target is not None
    precompileparts.release_compiled()
    argv = [sys.executable, str(Path(__file__).absolute()), "--target", request.target,
            "--namespace", request.namespace, "--name", request.name, *request.options.harness_args()]  # fmt: skip
    timeout = max(600.0, 4 * compile_seconds)
    pycache = compilestep.load_companion("cachelib.in_image.bytecode").PYCACHE_DIR

    def run(role: str) -> Any:
        return precheck.check_in_fresh_process(
            [*argv, CHECK_FLAG, role], request.cache_path, job_id, timeout, pycache
        )

    def first_call(verdict: Any) -> list[float]:
        return [float(verdict.details["first_call_seconds"])] if verdict.verified else []

    verdict = run(precheck.PRECOMPILED)
    plain = run(precheck.PLAIN)
    timed, untimed = first_call(verdict), first_call(plain)
    spent = verdict.seconds + plain.seconds
    if precheck.slower(timed, untimed) is not None:  # one pair may be noise: another pair decides with it
        again, plain_again = run(precheck.PRECOMPILED), run(precheck.PLAIN)
        timed, untimed, spent = timed + first_call(again), untimed + first_call(plain_again), spent + again.seconds
        spent += plain_again.seconds
    reason = verdict.reason if not verdict.verified else precheck.slower(timed, untimed)
    check = {**verdict.to_dict(), "verified": reason is None, "reason": reason, "seconds": round(spent, 4),
             "first_call_seconds": {"precompiled": [round(x, 4) for x in timed],
                                    "plain": [round(x, 4) for x in untimed]},
             "plain": {"verified": plain.verified, "reason": plain.reason, "seconds": round(plain.seconds, 4),
                       "counters": plain.details.get("counters", {})}}  # fmt: skip
    if reason is not None:
        check["removed_entries"] = precheck.strip_precompiled(request.cache_path)
        warmstart = load_warmstart()
        manifest = warmstart.build_manifest(request.cache_path)
        manifest["precompile_check"] = {"verified": False, "reason": reason}
        warmstart.write_manifest(request.cache_path, manifest)
    else:
        precompileparts.record_check(request.cache_path, {"verified": True, "reason": None})
    return {"check": check, "dynamo_entries": load_warmstart().dynamo_entries(request.cache_path)}


def check_precompiled(request: Request, role: str) -> int:
    """A checking process (``--check-precompile ROLE``): as a pod that calls ``warm_start()``
    (``precompiled``) or as one with the environment only (``plain``), each entry eager and compiled;
    writes :data:`cachelib.in_image.precheck.CHECK_FILE` into ``--out``, with the first compiled call's seconds
    (``warm_start()`` included; Dynamo and Inductor imported before either, as both roles pay that)."""
    precheck = load_precheck()
    warmstart = load_warmstart()
    options = request.options
    job_id = os.environ.get(JOB_ID_ENV) or compilekey.default_job_id(request.namespace, request.name)
    import torch._dynamo
    import torch._inductor.compile_fx  # every compiled process pays these imports, whatever its cache

    started = time.perf_counter()
    prepared = warmstart.prepare(request.cache_path) if role == precheck.PRECOMPILED else None
    prepare_seconds = time.perf_counter() - started
    function = compilestep.load_target(request.target or "")
    apply_options(dataclasses.replace(options, precompile="off"), job_id)
    if prepared is not None and "caching_precompile" in prepared.applied:
        warmstart.enable_caching_precompile()  # apply_options turned it off; prepare() decided it
    torch.manual_seed(precheck.SEED)
    first_calls: list[float] = []
    try:
        takes_compile = compilestep.required_params(function) >= 1
        returned = function(compilestep.make_compile(options)) if takes_compile else function()
        entries = compilestep.normalise_entries(request.target or "", returned) or []
        problems, notes = precheck.check_entries(
            entries,
            lambda fn: compilestep.compile_entry(fn, options),
            lambda fn: compilestep.eager_entry(fn, options),
            lambda fn, args, kwargs: compilestep.run_entry(fn, args, kwargs, options),
            training=options.backward or options.compiled_autograd,
            first_calls=first_calls,
        )
    except Exception as exc:
        traceback.print_exc()
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        problems, notes = [f"{precheck.RAISED}{type(exc).__name__}: {first_line}"], []
        entries = []
    counters = compilestep.counters_snapshot()
    if prepared is not None:
        fell_back = [d.split(": fell back ", 1)[1] for d in prepared.declined if ": fell back " in d]
        reason = precheck.judge(counters, fell_back, problems)
    else:
        reason = precheck.judge_plain(counters, problems)
    if not entries and reason is None:
        reason = "the target compiled its own models (returned None): nothing to check"
    groups = ("dynamo_cache", "frames", "inductor", "aot_autograd")
    precheck.write_check(request.out, {
        "role": role, "verified": reason is None, "reason": reason, "notes": notes, "entries": len(entries),
        "prepared": prepared.to_dict() if prepared is not None else None,
        "counters": {g: counters.get(g, {}) for g in groups},
        "first_call_seconds": round(prepare_seconds + sum(first_calls), 4),
        "entry_names": [compilestep.describe(fn) for fn, _, _ in entries], "problems": problems[:20],
    })  # fmt: skip
    return compilestep.EXIT_OK


def write_warm_start(request: Request) -> dict[str, Any]:
    """The warm-start manifest into the cache directory; what it says (without the long keys)."""
    warmstart = load_warmstart()
    manifest = warmstart.build_manifest(request.cache_path)
    try:
        warmstart.write_manifest(request.cache_path, manifest)
    except OSError as exc:
        message = f"cannot write the warm-start manifest: {exc.strerror or exc}"
        raise compilestep.HarnessError(message, compilestep.EXIT_OUTPUT) from exc
    return {
        "manifest": warmstart.MANIFEST_NAME,
        "dynamo_entries": warmstart.dynamo_entries(request.cache_path),
        "source_keys": sorted(k for k, v in manifest["source_keys"].items() if v is not None),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    compilestep.write_atomic(path, data)


def write_termination_log(message: Mapping[str, Any]) -> None:
    """Write the outcome where Kubernetes reads a container's termination message, when it exists."""
    podcontract.write_termination_message(message)


# -- command line ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness.py",
        description="Compile models with torch.compile into a fresh cache directory and write "
        "OUT/{result.json,megacache.bin,cachedir/} for `compilecache publish`.",
        epilog="examples:\n"
        "  python harness.py --target tiny_mlp --out /tmp/out --namespace default --name demo\n"
        "  python harness.py --target mypkg.models:warmup --out /out --namespace ml --name llama "
        "--mode max-autotune --backward\n"
        '  python harness.py --command "python serve.py --warmup-only" --out /out --namespace ml --name serve',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compilekey.add_model_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="output directory (created; must be empty)")
    parser.add_argument("--namespace", required=True, help="namespace of the CompileCache")
    parser.add_argument("--name", required=True, help="name of the CompileCache")
    compilekey.add_compile_arguments(parser)
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="compile into this cache directory instead of OUT/cachedir (to measure a preloaded cache)",
    )
    parser.add_argument(
        REQUIRE_FLAG,
        action="store_true",
        help=f"with --precompile auto: exit {EXIT_PRECOMPILE_LEFT_OUT} when the check leaves the precompiled part out "
        "(the output is complete and can still be published)",
    )
    parser.add_argument(CHECK_FLAG, choices=("precompiled", "plain"), default=None, help=argparse.SUPPRESS)
    parser.add_argument(PASS_FLAG, action="store_true", help=argparse.SUPPRESS)
    return parser


def request_from_args(args: argparse.Namespace) -> Request:
    options = compilekey.options_from_args(args)
    if args.target is not None:
        compilekey.canonical_target(args.target)
    for label, value in (("namespace", args.namespace), ("name", args.name)):
        if not _K8S_NAME.fullmatch(value) or (label == "namespace" and "." in value):
            raise compilestep.HarnessError(f"--{label} {value!r} is not a Kubernetes name", compilestep.EXIT_USAGE)
    out = args.out.absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise compilestep.HarnessError(f"--out {out}: exists and is not an empty directory", compilestep.EXIT_USAGE)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise compilestep.HarnessError(f"--out {out}: {exc.strerror or exc}", compilestep.EXIT_OUTPUT) from exc
    return Request(
        out=out,
        namespace=args.namespace,
        name=args.name,
        options=options,
        target=args.target,
        command=args.command,
        cache_dir=args.cache_dir.absolute() if args.cache_dir else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # targets import like `python -m` would find them
    args = build_parser().parse_args(argv)
    try:
        if args.check_precompile:
            return check_precompiled(request_from_args(args), args.check_precompile)
        if args.precompile_pass:
            return precompile_pass(request_from_args(args))
        result = warm_up(request_from_args(args))
    except (compilestep.HarnessError, compilekey.UsageError) as exc:
        stages.done()
        print(f"harness: error: {exc}", file=sys.stderr)
        write_termination_log({"result": "error", "stage": "compile", "reason": str(exc)})
        return exc.exit_code
    finally:
        stages.done()
    precompile = result.get("precompile")
    if precompile is not None:
        for line in precompileparts.precompile_summary(precompile, result_out(args)):
            print(f"harness: {line}", file=sys.stderr)
    summary = {
        "result": "compiled",
        "key": result["key_string"],
        "job_id": result["job_id"],
        "compile_seconds": result["compile_seconds"],
        "cache": result["cache"],
        "megacache_bytes": result["megacache"]["bytes"],
    }
    print(json.dumps(summary, sort_keys=True))
    if args.require_precompile and precompile is not None and not (precompile.get("check") or {}).get("verified"):
        reason = (precompile.get("check") or {}).get("reason")
        print(f"harness: {REQUIRE_FLAG}: the precompiled part was left out: {reason}", file=sys.stderr)
        return EXIT_PRECOMPILE_LEFT_OUT
    return compilestep.EXIT_OK


def result_out(args: argparse.Namespace) -> Path:
    return Path(args.out).absolute()


if __name__ == "__main__":
    sys.exit(main())
