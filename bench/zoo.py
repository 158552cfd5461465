"""The model zoo through the product path with ``precompile: Auto``, timed on one device.

For each zoo model (testsupport/models.py, through bench/zoo_gpu.py: bfloat16 on CUDA for
inference, float32 for the training steps ``hf_bert_train`` and ``timm_resnet_train``, which run
with ``--backward``), every measured row is its own fresh Python process, one after another:

  eager          the first eager call; spawn -> first output
  auto           the warm-up harness with ``--precompile auto`` (it checks its precompiled part
                 in a fresh process and leaves it out when the check fails), ``compilecache
                 publish`` to a file store, ``compilecache preload --strict`` into an empty
                 directory; then a pod process on a copy of that directory that calls
                 ``cachelib.runtime.warm_start()`` before ``torch.compile``
  auto-env       the same bundle, no call: only the webhook's environment (which never turns
                 caching precompile on: this pod runs on the bundle's Off entries)
  off            the same model warmed with ``--precompile off``, published, preloaded; a pod
                 process with nothing else (the ordinary warm start, "without Auto")
  auto-1t        as ``auto``, with ``OMP_NUM_THREADS=1`` (torchrun's default): a global state other
                 than the warm-up's, which ``warm_start()`` must meet without crashing or losing
                 the Off entries
  auto-env-1t    as ``auto-env``, with ``OMP_NUM_THREADS=1``
  off-1t         as ``off``, with ``OMP_NUM_THREADS=1``: what the one-thread pods compare with

Every pod process gets the webhook's environment (``TORCHINDUCTOR_CACHE_DIR`` on its own copy of
the preloaded directory, ``TORCH_COMPILE_JOB_ID`` of the warm-up, and ``PYTHONPYCACHEPREFIX`` on the
bundle's byte-code part when it carries one, as for an init-container preload). It imports torch,
builds the model on the device, imports Dynamo
and Inductor (``import_s``, paid by every compiled process whatever its cache), then times *load*
(``warm_start()`` where called, and ``torch.compile`` returning: with caching precompile Dynamo
loads its entry there) and the first call (synchronised). "To first output" runs from the
process's spawn to the first call's result. After the timed calls the pod runs the model eagerly
from the same random state and compares outputs (and gradients, for a training step) within the
warm-up check's tolerances (cachelib.in_image.precheck); a model whose eager output depends on the random
state (dropout) is compared by structure only, as the check does.

Rounds: an unmeasured eager process first (the machine's first process reads the CUDA libraries
from disk), then every warm-up in parallel (``--jobs``; nothing is measured meanwhile, so their
compile seconds are under that load), then ``--repeat`` rounds of the pod rows, each round every
model's eager, auto, auto-env and off rows in turn; tables show medians. ``--budget`` stops
starting new processes once that many seconds have passed (the rows keep the samples they got).

    python bench/zoo.py --device cuda --repeat 2 --out OUT
    python bench/zoo.py --device cpu --models hf_gpt2 --repeat 1 --out /tmp/zoo   # a check without a GPU
    python bench/zoo.py render OUT/results.json [more.json ...] > table.md
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # `python bench/zoo.py` imports bench.* like `python -m` would

from bench.zoo_gpu import DEVICE_ENV, DYNAMIC, NAMES, TRAINING  # noqa: E402  (no torch at import)
from cachelib.in_image.bytecode import PYCACHE_DIR  # noqa: E402

CLI = ("-m", "cachelib.cli")
POD_ROWS = ("eager", "auto", "auto-env", "off", "auto-1t", "auto-env-1t", "off-1t")
ONE_THREAD = "-1t"
"""Rows whose pod runs with OMP_NUM_THREADS=1."""
OURS = ("TORCHINDUCTOR_", "TRITON_CACHE", "TORCH_CACHING", "TORCH_COMPILE", "PYTHONPYCACHEPREFIX")
CHILD_TIMEOUT = 600


# =======================================================================================
# Child: one measured process. torch is imported only here.


def child_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="zoo.py child")
    p.add_argument("kind", choices=["eager", "compiled"])
    p.add_argument("model", choices=NAMES)
    p.add_argument("--result", required=True, type=Path)
    p.add_argument("--warm-start", action="store_true", help="call cachelib.runtime.warm_start() first")
    p.add_argument("--versions", action="store_true", help="also report the versions of the stack")
    args = p.parse_args(argv)
    started = time.perf_counter()
    record: dict[str, Any] = {"kind": args.kind, "model": args.model, "pid": os.getpid()}
    try:
        import torch

        record["import_torch_s"] = time.perf_counter() - started
        record.update(_child_run(torch, args))
        record["ok"] = True  # it ran; outputs that differ from eager are in "problems"
    except Exception as exc:  # reported, never hidden: the row shows the error
        import traceback

        record["ok"] = False
        record["error"] = f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        record["traceback"] = traceback.format_exc()[-4000:]
    if args.versions:
        record["versions"] = _versions()
    args.result.write_text(json.dumps(record, indent=1, default=str))
    # Leave at once: everything measured is written, and an orderly exit waits on inductor's
    # compile-worker pool, which no row's figures include.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if record["ok"] else 1)


def _child_run(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    from bench import zoo_gpu
    from cachelib.in_image import compilekey, compilestep

    out: dict[str, Any] = {"device": zoo_gpu.device(), "dtype": str(zoo_gpu.dtype(args.model))}
    training = args.model in TRAINING
    options = compilekey.CompileOptions(backward=training, dynamic=True if args.model in DYNAMIC else None)
    t = time.perf_counter()
    entries = zoo_gpu.build(args.model)
    _sync(torch)
    out["build_s"] = time.perf_counter() - t
    if args.kind == "eager":
        fn, call_args = entries[0]
        out["first_call_s"] = _timed(torch, lambda: compilestep.run_entry(fn, call_args, {}, options), fn, training)[0]
        out["first_output_epoch"] = time.time()
        out["second_call_s"] = _timed(torch, lambda: compilestep.run_entry(fn, call_args, {}, options), fn, training)[0]
        return out
    t = time.perf_counter()  # the fixed imports of every compiled process, apart from the load
    import torch._dynamo
    import torch._inductor.compile_fx

    out["import_s"] = time.perf_counter() - t
    from cachelib.in_image import precheck, precompileguard

    t = time.perf_counter()
    if args.warm_start:
        from cachelib import runtime

        out["warm_start"] = runtime.warm_start(wait=False).to_dict()
    compiled = [compilestep.compile_entry(fn, options) for fn, _ in entries]  # caching precompile loads here
    out["load_s"] = time.perf_counter() - t
    problems: list[str] = []
    notes: list[str] = []
    first: list[float] = []
    second: list[float] = []
    for index, ((fn, call_args), runnable) in enumerate(zip(entries, compiled, strict=True)):
        run = lambda r=runnable, a=call_args: compilestep.run_entry(r, a, {}, options)  # noqa: E731
        seconds, got = _timed(torch, run, fn, training)
        first.append(seconds)
        if index == 0:
            out["first_output_epoch"] = time.time()
        second.append(_timed(torch, run, fn, training)[0])
        found, note = _against_eager(torch, precheck, fn, call_args, got, training, options, compilestep)
        problems += [f"entry {index}: {f}" for f in found]
        notes += [f"entry {index}: {n}" for n in note]
    out["first_call_s"], out["second_call_s"] = sum(first), sum(second)
    other = zoo_gpu.second_inputs(args.model)
    if other is not None:  # a dynamic-shape case: another input shape through the same compiled entry
        fn = entries[0][0]
        got = compilestep.run_entry(compiled[0], other, {}, options)
        want = compilestep.run_entry(fn, other, {}, options)
        problems += [f"second input: {d}" for d in precheck.compare(want, got)]
    from torch._dynamo.utils import counters

    out["problems"], out["notes"] = problems, notes
    out["fallbacks"] = dict(precompileguard.fallbacks)
    out["counters"] = {g: dict(counters[g]) for g in ("dynamo_cache", "frames", "inductor", "aot_autograd")}
    return out


def _sync(torch: Any) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _grads(fn: Any) -> dict[str, Any]:
    return {f"grad.{n}": p.grad.detach().clone() for n, p in fn.named_parameters() if p.grad is not None}


def _timed(torch: Any, call: Any, fn: Any, training: bool, seed: int = 0) -> tuple[float, Any]:
    """Seconds of one synchronised call from a given random state; its output (and gradients)."""
    torch.manual_seed(seed)
    if training:
        fn.zero_grad(set_to_none=True)
    t = time.perf_counter()
    output = call()
    _sync(torch)
    seconds = time.perf_counter() - t
    return seconds, (output, _grads(fn) if training else {})


def _against_eager(
    torch: Any, precheck: Any, fn: Any, call_args: Any, got: Any, training: bool, options: Any, compilestep: Any
) -> tuple[list[str], list[str]]:
    """The compiled first call's output against eager's from the same random state (the warm-up
    check's comparison); eager once more from another state tells whether only structure counts."""
    want = _timed(torch, lambda: compilestep.run_entry(fn, call_args, {}, options), fn, training)[1]
    other = _timed(torch, lambda: compilestep.run_entry(fn, call_args, {}, options), fn, training, seed=1)[1]
    found = precheck.compare(want, got)
    if precheck.compare(want, other):
        found = [f for f in found if f.startswith("output structure") or ": eager torch." in f]
        return found, ["the output depends on the random state; only its structure was compared"]
    return found, []


def _versions() -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    found["cuda"] = torch.version.cuda
    for name in ("triton", "transformers", "timm", "torchvision"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(0))
    return found


# =======================================================================================
# Parent: warm up, publish, preload, run the pod processes, collect, render.


@dataclass
class Warmed:
    """One warm-up (``auto`` or ``off``) of one model, published and preloaded."""

    model: str
    precompile: str
    records: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    preloaded: Path | None = None

    @property
    def verified(self) -> bool:
        check = ((self.result or {}).get("precompile") or {}).get("check") or {}
        return bool(check.get("verified"))


@dataclass
class Bench:
    device: str
    work: Path
    out: Path
    jobs: int
    budget: float
    repeat: int
    python: str = sys.executable
    started: float = field(default_factory=time.perf_counter)
    rows: list[dict[str, Any]] = field(default_factory=list)
    warmed: dict[tuple[str, str], Warmed] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def store_url(self) -> str:
        return f"file://{self.work / 'store'}"

    def over_budget(self) -> bool:
        return bool(self.budget) and time.perf_counter() - self.started > self.budget

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(OURS)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
        env["PYTHONUNBUFFERED"] = "1"
        env[DEVICE_ENV] = self.device
        env.update(extra or {})
        return env

    # -- processes ---------------------------------------------------------------------
    def child(self, model: str, row: str, sample: int, extra_env: dict[str, str], *flags: str) -> dict[str, Any]:
        kind = "eager" if row.startswith("eager") else "compiled"
        result = self.work / model / f"{row}-{sample}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        cmd = [self.python, str(Path(__file__).resolve()), "child", kind, model, "--result", str(result), *flags]
        load_avg = os.getloadavg()
        spawned = time.time()
        t = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, env=self.env(extra_env), capture_output=True, text=True, cwd=REPO, timeout=CHILD_TIMEOUT
            )
            returncode, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            returncode, stderr = -9, f"timed out after {CHILD_TIMEOUT} s\n{tail}"
        wall = time.perf_counter() - t
        record: dict[str, Any] = json.loads(result.read_text()) if result.exists() else {"ok": False}
        record.update(model=model, row=row, sample=sample, process_wall_s=wall, spawned_epoch=spawned)
        record["load_avg_at_spawn"] = load_avg
        if "first_output_epoch" in record:
            record["to_first_output_s"] = record["first_output_epoch"] - spawned
        if returncode != 0:
            record["ok"] = False
            record.setdefault("error", f"exit {returncode}")
            record["stderr_tail"] = str(stderr)[-3000:]
        _log(f"{model:20s} {row:22s} {_brief(record)}")
        self.rows.append(record)
        self.save()
        return record

    def tool(self, model: str, name: str, cmd: list[str]) -> dict[str, Any]:
        """A product command (harness, publish, preload) as its own process, timed."""
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t
        record: dict[str, Any] = {"model": model, "name": name, "ok": proc.returncode == 0, "wall_s": wall}
        record["command"] = " ".join(cmd)
        last = _last_json_line(proc.stdout)
        if last is not None:
            record["output"] = last
        if proc.returncode != 0:
            record["error"] = f"exit {proc.returncode}"
        if proc.returncode != 0 or "left out" in proc.stderr:
            record["stderr_tail"] = proc.stderr[-3000:]
        _log(f"{model:20s} {name:22s} {'ok' if record['ok'] else record['error']} wall {wall:.2f}s")
        return record

    # -- the flow -----------------------------------------------------------------------
    def warm(self, model: str, precompile: str) -> Warmed:
        """Harness, publish, preload into an empty directory: what the operator and the webhook do."""
        warmed = Warmed(model, precompile)
        base = self.work / model / precompile
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        out = base / "harness-out"
        cmd = [self.python, str(REPO / "cachelib" / "in_image" / "harness.py"), "--target", f"bench.zoo_gpu:{model}"]
        cmd += ["--out", str(out), "--namespace", "zoo", "--name", f"{model.replace('_', '-')}-{precompile}"]
        cmd += ["--precompile", precompile]
        cmd += ["--backward"] if model in TRAINING else []
        cmd += ["--dynamic", "true"] if model in DYNAMIC else []
        warmed.records.append(self.tool(model, f"harness {precompile}", cmd))
        if not warmed.records[-1]["ok"]:
            return warmed
        warmed.result = json.loads((out / "result.json").read_text())
        publish = [self.python, *CLI, "publish", str(out), "--store", self.store_url]
        warmed.records.append(self.tool(model, f"publish {precompile}", publish))
        if not warmed.records[-1]["ok"]:
            return warmed
        target = base / "preloaded"
        preload = [self.python, *CLI, "preload", "--store", self.store_url, "--key", warmed.result["key_string"]]
        warmed.records.append(
            self.tool(model, f"preload {precompile}", [*preload, "--target", str(target), "--strict"])
        )
        if warmed.records[-1]["ok"] and (warmed.records[-1].get("output") or {}).get("result") == "hit":
            warmed.preloaded = target
        elif warmed.records[-1]["ok"]:
            warmed.records[-1].update(ok=False, error="the preload did not report a hit")
        return warmed

    def warm_all(self, models: Sequence[str]) -> None:
        todo = [(m, p) for m in models for p in ("auto", "off")]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as pool:
            futures = {pool.submit(self.warm, m, p): (m, p) for m, p in todo}
            for future in concurrent.futures.as_completed(futures):
                self.warmed[futures[future]] = future.result()
        self.save()

    def pod(self, model: str, row: str, sample: int) -> None:
        if row == "eager":
            self.child(model, row, sample, {"TORCHINDUCTOR_CACHE_DIR": str(self.work / model / "eager-cache")})
            return
        kind = row.removesuffix(ONE_THREAD)
        warmed = self.warmed.get((model, "off" if kind == "off" else "auto"))
        if warmed is None or warmed.preloaded is None or warmed.result is None:
            return
        copy = self.work / model / f"pod-{row}-{sample}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(warmed.preloaded, copy, symlinks=True)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(copy), "TORCH_COMPILE_JOB_ID": str(warmed.result["job_id"])}
        if row.endswith(ONE_THREAD):
            env["OMP_NUM_THREADS"] = "1"
        if (copy / PYCACHE_DIR).is_dir():  # the bundle's byte-code part: the webhook points an init-preloaded pod at it
            env["PYTHONPYCACHEPREFIX"] = str(copy / PYCACHE_DIR)
        self.child(model, row, sample, env, *(["--warm-start"] if kind == "auto" else []))

    def run(self, models: Sequence[str]) -> None:
        self.meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        first = self.child(models[0], "eager-first-process", 0, {}, "--versions")
        self.meta["versions"] = first.get("versions")
        self.warm_all(models)
        for sample in range(self.repeat):
            for model in models:
                for row in POD_ROWS:
                    if self.over_budget():
                        self.meta["stopped_by_budget"] = f"round {sample}, {model} {row}"
                        _log(f"budget of {self.budget:.0f} s spent: stopped before round {sample} {model} {row}")
                        self.save()
                        return
                    self.pod(model, row, sample)
        self.save()

    def save(self) -> None:
        self.meta["elapsed_s"] = time.perf_counter() - self.started
        data = {
            "meta": self.meta,
            "warmups": [
                {"model": w.model, "precompile": w.precompile, "records": w.records, "result": _brief_result(w.result)}
                for w in self.warmed.values()
            ],
            "rows": self.rows,
        }
        self.out.mkdir(parents=True, exist_ok=True)
        partial = self.out / ".results.json.partial"
        partial.write_text(json.dumps(data, indent=1, default=str))
        os.replace(partial, self.out / "results.json")


def _brief_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the tables read of a harness result.json (the rest stays in the warm-up's work dir)."""
    if result is None:
        return None
    keep = ("key_string", "job_id", "versions", "device", "compile_seconds", "targets", "cache", "precompile")
    return {k: result.get(k) for k in keep} | {"megacache_bytes": (result.get("megacache") or {}).get("bytes")}


def _last_json_line(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
    return None


def _brief(record: dict[str, Any]) -> str:
    if not record.get("ok"):
        return f"FAILED {record.get('error') or record.get('problems')}"
    parts = [
        f"{k} {record[k]:.2f}s" for k in ("import_s", "load_s", "first_call_s", "to_first_output_s") if k in record
    ]
    dynamo = (record.get("counters") or {}).get("dynamo_cache") or {}
    if record.get("kind") == "compiled":
        frames = (record.get("counters") or {}).get("frames", {}).get("ok", 0)
        parts.append(f"dynamo hit {dynamo.get('dynamo_cache_hit', 0)} frames {frames}")
    return ", ".join(parts)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _driver() -> str | None:
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None


# =======================================================================================
# Tables


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def summarise(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model: medians of every pod row, the warm-ups' figures and the check's verdict."""
    models = list(dict.fromkeys([r["model"] for r in data["rows"] if r["row"] in POD_ROWS]))
    models += [m for m in dict.fromkeys(w["model"] for w in data["warmups"]) if m not in models]
    summary = []
    for model in models:
        item: dict[str, Any] = {"model": model, "rows": {}, "warmups": {}}
        for row in POD_ROWS:
            samples = [r for r in data["rows"] if r["model"] == model and r["row"] == row]
            good = [r for r in samples if _ran(r)]
            counters = [r.get("counters") or {} for r in good]
            item["rows"][row] = {
                "samples": len(samples),
                "ok": len(good),
                "errors": sorted({str(r.get("error")) for r in samples if not _ran(r)}),
                "differs": sorted({p for r in good for p in (r.get("problems") or [])[:1]}),
                "first_call_s": _median([r["first_call_s"] for r in good if "first_call_s" in r]),
                "load_s": _median([r["load_s"] for r in good if "load_s" in r]),
                "load_plus_first_s": _median([r.get("load_s", 0.0) + r["first_call_s"] for r in good]),
                "import_s": _median([r["import_s"] for r in good if "import_s" in r]),
                "to_first_output_s": _median([r["to_first_output_s"] for r in good if "to_first_output_s" in r]),
                "dynamo_hit": sorted({c.get("dynamo_cache", {}).get("dynamo_cache_hit", 0) for c in counters}),
                "frames_compiled": sorted({c.get("frames", {}).get("ok", 0) for c in counters}),
                "fxgraph_hit": sorted({c.get("inductor", {}).get("fxgraph_cache_hit", 0) for c in counters}),
                "fxgraph_miss": sorted({c.get("inductor", {}).get("fxgraph_cache_miss", 0) for c in counters}),
                "aot_hit": sorted({c.get("aot_autograd", {}).get("autograd_cache_hit", 0) for c in counters}),
                "aot_miss": sorted({c.get("aot_autograd", {}).get("autograd_cache_miss", 0) for c in counters}),
                "autotune": sorted({_autotune(c) for c in counters}),
                "declined": sorted({d for r in good for d in ((r.get("warm_start") or {}).get("declined") or [])
                                    if d.startswith("caching_precompile")}),
                "fallbacks": sorted({sum((r.get("fallbacks") or {}).values()) for r in good}),
                "notes": sorted({n for r in good for n in r.get("notes") or []}),
            }
        for warm in data["warmups"]:
            if warm["model"] != model:
                continue
            result = warm.get("result") or {}
            check = (result.get("precompile") or {}).get("check") or {}
            failed = [r for r in warm["records"] if not r.get("ok")]
            item["warmups"][warm["precompile"]] = {
                "compile_s": result.get("compile_seconds"),
                "verified": check.get("verified"),
                "reason": check.get("reason"),
                "check_s": check.get("seconds"),
                "dynamo_entries": (result.get("precompile") or {}).get("dynamo_entries"),
                "failed": [f"{r['name']}: {r.get('error')}" for r in failed],
                "preload_s": next((r["wall_s"] for r in warm["records"] if r["name"].startswith("preload")), None),
            }
        summary.append(item)
    return summary


def _autotune(counters: dict[str, Any]) -> str:
    """Inductor's autotuning lookups of one process as ``hits/misses`` (``0/0`` when nothing was autotuned)."""
    inductor = counters.get("inductor", {})
    tuned = {k: int(v) for k, v in inductor.items() if "autotune" in k}
    return f"{sum(v for k, v in tuned.items() if 'hit' in k)}/{sum(v for k, v in tuned.items() if 'miss' in k)}"


def _ran(record: dict[str, Any]) -> bool:
    """The process got through its timed calls (outputs that differ from eager still count as run)."""
    return (
        "first_call_s" in record
        and "traceback" not in record
        and not str(record.get("error", "")).startswith("timed out")
    )


def _cell(row: dict[str, Any], key: str) -> str:
    if row["samples"] == 0:
        return "not run"
    if row["ok"] == 0:
        return "crashed"
    text = _fmt(row[key]) + (" ≠" if row["differs"] else "")
    return text if row["ok"] == row["samples"] else f"{text} ({row['samples'] - row['ok']} of {row['samples']} failed)"


def _verdict(warm: dict[str, Any] | None) -> str:
    if warm is None:
        return "not run"
    if warm["failed"]:
        return "warm-up failed: " + "; ".join(warm["failed"])
    if warm["verified"]:
        return f"verified ({_fmt(warm['check_s'])} s)"
    if warm["verified"] is None:
        return "no precompiled entry to check"
    return f"left out ({_fmt(warm['check_s'])} s): {warm['reason']}"


def render(datas: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| model | eager 1st | Auto: load + 1st (`warm_start()`) | Auto, env only: load + 1st "
        "| without Auto: load + 1st | to first output: eager / Auto / env only / without Auto "
        "| one thread (OMP_NUM_THREADS=1): Auto / env only / without Auto "
        "| warm-up compile s (Auto / off) | the warm-up's check |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    counters_lines = [
        "| model | row | samples ok | import | load | 1st call | Dynamo hit | frames compiled | FX-graph hit / miss "
        "| AOTAutograd hit / miss | autotune hit/miss | fallbacks | vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for data in datas:
        for item in summarise(data):
            rows, warms = item["rows"], item["warmups"]

            def split(row: dict[str, Any]) -> str:
                if row["samples"] == 0 or row["ok"] == 0:
                    return _cell(row, "load_plus_first_s")
                return f"{_fmt(row['load_s'])} + {_fmt(row['first_call_s'])} = {_cell(row, 'load_plus_first_s')}"

            outputs = " / ".join(_cell(rows[r], "to_first_output_s") for r in POD_ROWS[:4])
            one_thread = " / ".join(_cell(rows[r], "load_plus_first_s") for r in POD_ROWS[4:])
            compile_s = " / ".join(_fmt((warms.get(p) or {}).get("compile_s")) for p in ("auto", "off"))
            lines.append(
                f"| {item['model']} | {_cell(rows['eager'], 'first_call_s')} | {split(rows['auto'])} "
                f"| {split(rows['auto-env'])} | {split(rows['off'])} | {outputs} | {one_thread} | {compile_s} "
                f"| {_verdict(warms.get('auto'))} |"
            )
            for name in POD_ROWS[1:]:
                row = rows[name]
                if row["samples"] == 0:
                    continue
                same = "equal (structure only: dropout)" if row["notes"] else "equal"
                vs_eager = "—" if row["ok"] == 0 else ("differs: " + row["differs"][0] if row["differs"] else same)
                counters_lines.append(
                    f"| {item['model']} | {name} | {row['ok']}/{row['samples']} | {_fmt(row['import_s'])} "
                    f"| {_fmt(row['load_s'])} | {_fmt(row['first_call_s'])} | {_set(row['dynamo_hit'])} "
                    f"| {_set(row['frames_compiled'])} | {_set(row['fxgraph_hit'])} / {_set(row['fxgraph_miss'])} "
                    f"| {_set(row['aot_hit'])} / {_set(row['aot_miss'])} | {'/'.join(row['autotune']) or '—'} "
                    f"| {_set(row['fallbacks'])} | {vs_eager} |"
                )
    failures = _failures(datas)
    text = "\n".join(lines) + "\n\n" + "\n".join(counters_lines) + "\n"
    return text + ("\nFailures:\n\n" + "\n".join(failures) + "\n" if failures else "")


def _set(values: Sequence[int]) -> str:
    return "—" if not values else "/".join(str(v) for v in values)


def _failures(datas: Sequence[dict[str, Any]]) -> list[str]:
    found = []
    for data in datas:
        for r in data["rows"]:
            if not _ran(r):
                tail = (r.get("traceback") or r.get("stderr_tail") or "").strip().splitlines()[-1:] or [""]
                found.append(f"- {r['model']} {r['row']} sample {r['sample']}: {r.get('error')} {tail[0][:300]}")
        for w in data["warmups"]:
            for rec in w["records"]:
                if not rec.get("ok"):
                    tail = (rec.get("stderr_tail") or "").strip().splitlines()[-1:] or [""]
                    found.append(f"- {w['model']} {rec['name']}: {rec.get('error')} {tail[0][:300]}")
    return found


# =======================================================================================


def parse_models(text: str) -> list[str]:
    if text in ("", "all"):
        return list(NAMES)
    chosen = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in NAMES]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(NAMES)}")
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["child"]:
        return child_main(argv[1:])
    if argv[:1] == ["render"]:
        print(render([json.loads(Path(p).read_text()) for p in argv[1:]]), end="")
        return 0
    p = argparse.ArgumentParser(prog="zoo.py", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--models", default="all", help=f"comma-separated, or all: {', '.join(NAMES)}")
    p.add_argument("--repeat", type=int, default=2, help="fresh processes per pod row (median)")
    p.add_argument("--jobs", type=int, default=4, help="warm-ups run in parallel")
    p.add_argument("--budget", type=float, default=0.0, help="start no new process after this many seconds")
    p.add_argument("--work", type=Path, help="work directory (default: OUT/work, removed at the end)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    models = parse_models(args.models)
    work = (args.work or args.out / "work").absolute()
    shutil.rmtree(work, ignore_errors=True)
    bench = Bench(args.device, work, args.out.absolute(), args.jobs, args.budget, args.repeat)
    bench.meta.update(
        command=" ".join(["python", "bench/zoo.py", *argv]),
        device=args.device,
        models=models,
        repeat=args.repeat,
        machine={"cpus": os.cpu_count(), "platform": platform.platform(), "gpu_driver": _driver()},
    )
    bench.run(models)
    table = render([json.loads((bench.out / "results.json").read_text())])
    (bench.out / "zoo.md").write_text(table)
    print(table, end="")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
