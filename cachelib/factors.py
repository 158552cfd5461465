"""Why a graph started cold: the factors of torch's cache keys, recorded per graph and compared.

torch looks a compiled graph up by keys made of many things (its own sources, Triton, Python,
the device, the Inductor, Dynamo and functorch configs, the inputs' dtypes and shapes, the
traced code). A bundle that restores fine is silently not used when any of them differs
between the warm-up and the pod. This module records them where torch computes them and, in
the pod, names the one that differed, with both values.

- **Recording** (:func:`install`): wraps Dynamo's ``OutputGraph._call_user_compiler`` (one call
  per graph handed to the backend: the frame's code, the graph's inputs and source lines, and
  whether torch's caches hit for it, from the counters around the call) and
  ``FxGraphHashDetails.__init__`` (torch's own key details: the Inductor config the FX-graph key
  saw, the settings beside it, the hash of torch's sources). Only on the torch releases these
  were checked against (:data:`PROVEN_TORCH`); elsewhere nothing is wrapped and the diagnosis says
  ``unknown``. A failure inside the recorder is logged and dropped, never raised into torch.
- **The warm-up** writes :data:`FACTORS_NAME` into the cache directory (it travels in the bundle's
  ``cachedir`` part): the process's factors and one record per graph.
- **The pod** (``cachelib.runtime.warm_start()`` installs the recorder) compares each graph it
  compiled with the warm-up's record of the same frame (:func:`compare`): a hit has no cause; a
  miss gets a bounded ``cause`` (:data:`CAUSES`) and the differing factors, each with both values
  (``inductor config max_autotune: False → True``). After each graph it writes :data:`WHY_NAME`
  into its cache directory and the verdict's one line into its termination-message file.

Factors are a flat ``{"<cause>:<name>": value}`` mapping; values are short strings. Environment
variables whose name says secret are recorded as a digest, never as their value.

Standard library only at import; torch is imported by the functions that need it. This module
is copied beside ``harness.py`` into warm-up containers, so it imports nothing from cachelib
at import time.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import platform
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

FACTORS_NAME = "compilecache-factors.json"
"""The warm-up's record at the top of the cache directory (a plain name: the unpacker installs it)."""
WHY_NAME = "compilecache-why.json"
"""The pod's verdict, written beside the cache it read."""
FORMAT = 1
WHY_KEY = "compilecache_why"
"""The verdict's key in the workload's termination message (read by the operator)."""
TERMINATION_LOG_ENV = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
PROVEN_TORCH = ((2, 11), (2, 15))
"""torch releases (major, minor), both ends included, whose Dynamo and Inductor internals used here
were checked (tests/cachelib/test_factors.py on 2.13 and 2.15)."""

CAUSES = (
    "none", "torch_version", "triton_version", "python_version", "device", "inductor_config",
    "dynamo_config", "functorch_config", "torch_setting", "env", "dtype", "shape", "graph_break",
    "source", "new_graph", "bypass", "unknown",
)  # fmt: skip
"""The bounded ``cause`` label, in the order of precedence when one graph differs in several."""
LABELS = {
    "torch_version": "torch", "triton_version": "Triton", "python_version": "Python", "device": "device",
    "inductor_config": "inductor config", "dynamo_config": "dynamo config",
    "functorch_config": "functorch config", "torch_setting": "torch setting", "env": "env",
    "dtype": "dtype of", "shape": "shape of", "graph_break": "graph breaks in", "source": "source",
}  # fmt: skip
DERIVED = frozenset({"source:graph code", "torch_version:source hash", "device:system info"})
"""Factors that follow from others (the traced code from the source and the inputs, torch's key
from its installed files, the system info from device and versions): reported only when no
other factor differs."""

SECONDARY = frozenset({"dynamo_config", "env"})
"""Said only when no factor of torch's keys differs: Dynamo's config enters no cache key (it shapes
the traced graph, which then differs), and an environment variable counts through the config it sets."""

ENV_PREFIXES = ("TORCH", "PYTORCH_", "TRITON_", "CUDA_", "NVIDIA_", "HIP_", "ROCM_", "OMP_NUM_THREADS")
ENV_PER_RUN = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_COMPILE_JOB_ID"})
"""Environment variables that differ between any two runs by design and enter no key."""
_SKIPPED_DETAILS = frozenset(
    {"gm", "example_inputs", "fx_kwargs", "inputs_to_check", "inductor_config", "aot_config", "autograd_config",
     "torch_version", "system_info"}
)  # fmt: skip
_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
_MAX_VALUE = 200
_MAX_LINES = 400
ABSENT = "absent"
UNSET = "unset"

log = logging.getLogger(__name__)


# -- values ---------------------------------------------------------------------------------------------
def value_text(value: Any) -> str | None:
    """A short comparable text of a config or setting value; None for values without a stable
    text (objects shown by address, long ones)."""
    if callable(value) and not isinstance(value, type):
        return None
    text = value.hex() if isinstance(value, bytes) else repr(value)
    if " at 0x" in text or len(text) > _MAX_VALUE:
        return None
    return text


def _is_path(value: Any) -> bool:
    """Dynamo's own directories (``debug_dir_root`` follows the working directory): no key."""
    return isinstance(value, str) and os.path.isabs(value)


def flat_config(cause: str, config: Mapping[str, Any]) -> dict[str, str]:
    """``{"<cause>:<option>": text}`` for the options of a saved torch config with a stable text."""
    out = {}
    for name, value in config.items():
        text = value_text(value)
        if text is not None:
            out[f"{cause}:{name}"] = text
    return out


def _sibling(name: str) -> Any:
    """``cachelib.<name>``, or ``<name>.py`` beside this file (a warm-up container, where the harness
    loaded it, or loads it here, as ``compilecache_<name>``); None when neither exists."""
    with contextlib.suppress(ImportError):
        return importlib.import_module(f"cachelib.{name}")
    loaded = sys.modules.get(f"compilecache_{name}")
    beside = Path(__file__).with_name(f"{name}.py")
    if loaded is not None or not beside.is_file():
        return loaded
    spec = importlib.util.spec_from_file_location(f"compilecache_{name}", beside)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _secret_name(name: str) -> bool:
    masking = _sibling("masking")
    return True if masking is None else bool(masking.is_secret_name(name))  # none: every value a digest


def env_factors(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that can reach torch's configs (secret-named ones as a digest)."""
    out = {}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIXES) or name in ENV_PER_RUN or name.endswith("_CACHE_DIR"):
            continue
        value = environ[name]
        if _secret_name(name):
            value = "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]
        out[f"env:{name}"] = value[:_MAX_VALUE]
    return out


# -- the process ----------------------------------------------------------------------------------------
def process_factors(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Versions, installation digests, device and environment of this process (needs torch)."""
    import torch

    out: dict[str, str] = {"python_version:version": platform.python_version(), "device:platform": sys.platform}
    out["torch_version:version"] = str(torch.__version__)
    try:
        import triton  # type: ignore[import-not-found,import-untyped,unused-ignore]

        out["triton_version:version"] = str(triton.__version__)
    except ImportError:
        out["triton_version:version"] = "none"
    warmstart = _sibling("warmstart")
    if warmstart is not None:
        for package, digest in warmstart.installation().items():
            cause = "torch_version" if package == "torch" else "triton_version"
            out[f"{cause}:installed files"] = digest[:16]
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        out["device:device"] = torch.cuda.get_device_name(index)
        out["device:capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
    else:
        out["device:device"] = "cpu"
    out.update(env_factors(os.environ if environ is None else environ))
    return out


# -- recording (torch internals, guarded) -----------------------------------------------------------------
@dataclass
class Recorder:
    """The graphs of this process, as :func:`install` records them."""

    graphs: list[dict[str, Any]] = field(default_factory=list)
    installed: bool = False
    problem: str | None = None
    on_graph: list[Any] = field(default_factory=list)
    """Called with the recorder after each graph (the pod writes its verdict there)."""
    _local: threading.local = field(default_factory=threading.local)

    def current(self) -> dict[str, Any] | None:
        return getattr(self._local, "graph", None)


recorder = Recorder()


def recording_problem() -> str | None:
    """Why this torch's internals cannot be recorded; None when they can."""
    try:
        import torch

        warmstart = _sibling("warmstart")
        if warmstart is None:
            return "cachelib.warmstart is not installed beside cachelib.factors"
        release = warmstart.torch_release(str(torch.__version__))
        if release is None or not PROVEN_TORCH[0] <= release <= PROVEN_TORCH[1]:
            low, high = (".".join(map(str, end)) for end in PROVEN_TORCH)
            return f"torch {torch.__version__} is outside {low}-{high}, where its cache key details were checked"
        output_graph = importlib.import_module("torch._dynamo.output_graph")
        codecache = importlib.import_module("torch._inductor.codecache")
    except ImportError as exc:
        return f"torch's compiler cannot be imported: {exc}"
    if not callable(getattr(getattr(output_graph, "OutputGraph", None), "_call_user_compiler", None)):
        return "this torch's Dynamo has no OutputGraph._call_user_compiler"
    if not callable(getattr(getattr(codecache, "FxGraphHashDetails", None), "__init__", None)):
        return "this torch's Inductor has no FxGraphHashDetails"
    return None


def install() -> str | None:
    """Record every graph this process compiles from now on; idempotent. Why not, or None."""
    if recorder.installed:
        return None
    recorder.problem = recording_problem()
    if recorder.problem is not None:
        return recorder.problem
    output_graph: Any = importlib.import_module("torch._dynamo.output_graph")
    codecache: Any = importlib.import_module("torch._inductor.codecache")
    original_compile = output_graph.OutputGraph._call_user_compiler
    original_init = codecache.FxGraphHashDetails.__init__

    @functools.wraps(original_compile)
    def _call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        graph = _guarded(graph_record, self, gm)
        before = _guarded(cache_counts)
        recorder._local.graph = graph
        try:
            return original_compile(self, gm, example_inputs)
        finally:
            recorder._local.graph = None
            if graph is not None:
                graph["result"] = _guarded(lookup_result, before, cache_counts()) or "unknown"
                recorder.graphs.append(graph)
                for callback in list(recorder.on_graph):
                    _guarded(callback, recorder)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        graph = recorder.current()
        if graph is not None:
            _guarded(add_key_details, graph, self)

    output_graph.OutputGraph._call_user_compiler = _call_user_compiler
    codecache.FxGraphHashDetails.__init__ = __init__
    recorder.installed = True
    return None


def _guarded(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # the recorder never breaks a compile
        log.debug("compilecache: recording compile factors failed", exc_info=True)
        return None


def cache_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "hit": int(inductor["fxgraph_cache_hit"]) + int(aot["autograd_cache_hit"]),
        "miss": int(inductor["fxgraph_cache_miss"]) + int(aot["autograd_cache_miss"]),
        "bypass": int(inductor["fxgraph_cache_bypass"]) + int(aot["autograd_cache_bypass"]),
    }


def lookup_result(before: Mapping[str, int] | None, after: Mapping[str, int]) -> str:
    """hit, miss or bypass of one graph, from the cache counters around its compile (pure)."""
    delta = {k: after[k] - (before or {}).get(k, 0) for k in after}
    if delta["miss"]:
        return "miss"
    if delta["hit"]:
        return "hit"
    return "bypass" if delta["bypass"] else "unknown"


def graph_record(output: Any, gm: Any) -> dict[str, Any]:
    """One graph as Dynamo hands it to the backend: its frame, inputs, source lines and configs."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config

    code = output.root_tx.f_code
    factors: dict[str, str] = {}
    lines: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = node.meta.get("example_value")
            if hasattr(value, "dtype") and hasattr(value, "shape"):
                factors[f"dtype:{node.name}"] = str(value.dtype).removeprefix("torch.")
                factors[f"shape:{node.name}"] = str([str(s) if not isinstance(s, int) else s for s in value.shape])
                factors[f"device:{node.name}"] = str(value.device)
        lines.update(stack_lines(node.meta.get("stack_trace")))
    for where, text in sorted(lines.items())[:_MAX_LINES]:
        factors[f"source:{where}"] = text
    factors["source:graph code"] = graph_digest(gm.graph)
    dynamo = {k: v for k, v in dynamo_config.save_config_portable().items() if not _is_path(v)}
    factors.update(flat_config("dynamo_config", dynamo))
    factors.update(flat_config("functorch_config", functorch_config.save_config_portable()))
    return {
        "file": code.co_filename,
        "function": getattr(code, "co_qualname", code.co_name),
        "line": code.co_firstlineno,
        "factors": factors,
    }


def graph_digest(graph: Any) -> str:
    """A digest of the traced graph's nodes. Not of ``gm.code``: reading it makes a lazily compiled
    GraphModule generate its code before AOTAutograd hashes it, and AOTAutograd's key then differs from
    that of a process that did not read it (seen on torch 2.13: a pod without the recorder missed)."""
    return hashlib.sha256(_ADDRESS.sub("0x", str(graph)).encode()).hexdigest()[:16]


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in .*$')


def stack_lines(stack_trace: str | None) -> dict[str, str]:
    """``{"file:line": source text}`` of a node's user stack trace (pure)."""
    out: dict[str, str] = {}
    if not stack_trace:
        return out
    rows = stack_trace.splitlines()
    for index, row in enumerate(rows):
        match = _FRAME_LINE.match(row)
        if match and index + 1 < len(rows) and not _FRAME_LINE.match(rows[index + 1]):
            out[f"{os.path.basename(match['file'])}:{match['line']}"] = rows[index + 1].strip()[:_MAX_VALUE]
    return out


def add_key_details(graph: dict[str, Any], details: Any) -> None:
    """torch's own FX-graph key details into a graph's factors (the last call wins: Inductor's)."""
    factors = graph["factors"]
    config = getattr(details, "inductor_config", None)
    if isinstance(config, Mapping):
        factors.update(flat_config("inductor_config", config))
    key = getattr(details, "torch_version", None)
    if isinstance(key, bytes):
        factors["torch_version:source hash"] = hashlib.sha256(key).hexdigest()[:16]
    system = getattr(details, "system_info", None)
    if system is not None:
        factors["device:system info"] = hashlib.sha256(repr(system).encode()).hexdigest()[:16]
    for name, value in vars(details).items():
        if name in _SKIPPED_DETAILS or name.startswith("__"):
            continue
        text = value_text(value)
        if text is not None:
            factors[f"torch_setting:{name}"] = text


def graph_break_reasons() -> list[str]:
    """The first line of every graph-break reason Dynamo counted in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return []
    return sorted({(str(r).strip().splitlines() or [""])[0][:_MAX_VALUE] for r in counters["graph_break"]})


def document(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this process saw: its factors and its graphs (the file the warm-up writes)."""
    return {
        "format": FORMAT,
        "created": time.time(),
        "recorded": recorder.installed,
        "problem": recorder.problem,
        "process": process_factors(environ),
        "graphs": list(recorder.graphs),
        "graph_breaks": graph_break_reasons(),
    }


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(partial, path)


class FactorsError(ValueError):
    """A factors file that cannot be read."""


def read_document(path: Path) -> dict[str, Any] | None:
    """The factors file at ``path`` (None when absent); FactorsError when it is not one."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FactorsError(f"{path}: not a compile factors file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("graphs"), list):
        raise FactorsError(f"{path}: not a compile factors file of format {FORMAT}")
    return data


# -- comparing (pure) -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    cause: str
    name: str
    before: str
    after: str

    def text(self) -> str:
        label = LABELS.get(self.cause, self.cause)
        return f"{label} {self.name}: {self.before} → {self.after}"


@dataclass(frozen=True)
class GraphVerdict:
    graph: str
    result: str
    cause: str
    differences: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"graph": self.graph, "result": self.result, "cause": self.cause, "differences": list(self.differences)}


@dataclass(frozen=True)
class Diagnosis:
    """A pod's verdict: one per graph, and the pod's cause and one-line reason."""

    graphs: tuple[GraphVerdict, ...]
    result: str
    cause: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result, "cause": self.cause, "reason": self.reason,
            "graphs": [g.to_dict() for g in self.graphs],
        }  # fmt: skip

    def causes(self) -> Counter[tuple[str, str]]:
        """(result, cause) -> graphs."""
        return Counter((g.result, g.cause) for g in self.graphs)


def differences(before: Mapping[str, str], after: Mapping[str, str]) -> list[Difference]:
    """The differing factors, primary ones only unless none differs (pure).

    Source lines count only where both sides traced the same file and line (a graph that covers
    more lines is no change of source); a configuration option that follows an environment
    variable which also differs is said once, under the variable; a variable that differs with
    nothing it explains is said only when nothing else differs."""
    found: list[Difference] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, ABSENT), after.get(key, ABSENT)
        if old == new:
            continue
        cause, _, name = key.partition(":")
        if cause == "source" and key not in DERIVED and ABSENT in (old, new):
            continue
        if cause == "env":
            old, new = before.get(key, UNSET), after.get(key, UNSET)
        found.append(Difference(cause, name, old, new))
    derived = [d for d in found if f"{d.cause}:{d.name}" in DERIVED]
    rest = [d for d in found if f"{d.cause}:{d.name}" not in DERIVED]
    envs = [d for d in rest if d.cause == "env"]
    keyed = [d for d in rest if d.cause not in SECONDARY]
    dynamo = [d for d in rest if d.cause == "dynamo_config"]
    return _fold_env(keyed, envs, False) or _fold_env(dynamo, envs, True) or derived


def _fold_env(found: list[Difference], envs: list[Difference], unlinked: bool) -> list[Difference]:
    """``found`` with each config difference that an also differing variable explains said under
    the variable; variables that explain none kept only when ``unlinked``."""
    explained: dict[str, list[Difference]] = {}
    kept = []
    for d in found:
        option = d.name.rsplit(".", 1)[-1].upper()
        owner = next((e for e in envs if d.cause.endswith("_config") and e.name.endswith("_" + option)), None)
        if owner is None:
            kept.append(d)
        else:
            explained.setdefault(owner.name, []).append(d)
    folded = []
    for e in envs:
        if e.name in explained:
            said = ", ".join(f"{LABELS[d.cause]} {d.name}: {d.before} → {d.after}" for d in explained[e.name])
            folded.append(Difference("env", e.name, e.before, f"{e.after} ({said})"))
        elif unlinked:
            folded.append(e)
    return folded + kept


def grouped(found: Sequence[Difference]) -> list[str]:
    """Texts of the differences, inputs that changed alike said once (``dtype float32 → float64 (x, w)``)."""
    texts: list[str] = []
    alike: dict[tuple[str, str, str], list[str]] = {}
    for d in found:
        if d.cause in ("dtype", "shape") or (d.cause == "device" and d.name.startswith("l_")):
            alike.setdefault((d.cause, d.before, d.after), []).append(d.name)
        else:
            texts.append(d.text())
    for (cause, old, new), names in alike.items():
        if len(names) == 1:
            texts.append(f"{LABELS.get(cause, cause)} {names[0]}: {old} → {new}")
        else:
            texts.append(f"{cause} {old} → {new} ({', '.join(names)})")
    return texts


def base_function(qualname: str) -> str:
    """The user's function a Dynamo resume function continues (``M.forward`` for its resumes)."""
    prefix, _, name = qualname.rpartition(".")
    while (match := _RESUME.fullmatch(name)) is not None:
        name = match["fn"]
    return f"{prefix}.{name}" if prefix else name


def graph_breaks(graphs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(file, function) -> the lines where its graphs broke, from the resume functions compiled."""
    lines: dict[tuple[str, str], set[int]] = {}
    for g in graphs:
        name = str(g["function"]).rpartition(".")[2]
        where = (os.path.basename(str(g["file"])), base_function(str(g["function"])))
        lines.setdefault(where, set())
        if (match := _RESUME.fullmatch(name)) is not None:
            lines[where].add(int(match["line"]))
    return {k: ", ".join(f"line {n}" for n in sorted(v)) or "none" for k, v in lines.items()}


def graph_identity(g: Mapping[str, Any]) -> tuple[str, str]:
    """A graph's frame as both sides name it: file name and function (not the directory, which an
    image may install elsewhere; not the line, which an edit above it moves)."""
    return os.path.basename(str(g["file"])), str(g["function"])


def graph_name(g: Mapping[str, Any]) -> str:
    return f"{g['function']} ({os.path.basename(str(g['file']))}:{g['line']})"


def compare(warmup: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> Diagnosis:
    """Each graph the pod compiled against the warm-up's record of the same frame (pure)."""
    if not pod.get("recorded", True):
        return _unrecorded(pod, f"the factors were not recorded here: {pod.get('problem')}")
    if warmup is None:
        return _unrecorded(pod, f"the cache carries no {FACTORS_NAME} (the warm-up recorded no factors)")
    if not warmup.get("recorded", True):
        return _unrecorded(pod, f"the warm-up recorded no factors: {warmup.get('problem')}")
    theirs_breaks, ours_breaks = graph_breaks(warmup["graphs"]), graph_breaks(pod["graphs"])
    verdicts = []
    for g in pod["graphs"]:
        name = graph_name(g)
        if g.get("result") == "hit":
            verdicts.append(GraphVerdict(name, "hit", "none"))
            continue
        where = (graph_identity(g)[0], base_function(str(g["function"])))
        breaks = Difference("graph_break", where[1], theirs_breaks.get(where, "none"), ours_breaks.get(where, "none"))
        found = [breaks] if breaks.before != breaks.after else []
        candidates = [w for w in warmup["graphs"] if graph_identity(w) == graph_identity(g)]
        if candidates and not found:
            found = min(
                (differences({**warmup["process"], **w["factors"]}, {**pod["process"], **g["factors"]})
                 for w in candidates), key=len,
            )  # fmt: skip
        if g.get("result") == "bypass" and not found:
            verdicts.append(GraphVerdict(name, "miss", "bypass", ("torch did not cache it (bypass)",)))
        elif not candidates and not found:
            verdicts.append(GraphVerdict(name, "miss", "new_graph", (f"a graph the warm-up did not compile: {name}",)))
        elif not found:
            verdicts.append(GraphVerdict(name, "miss", "unknown", ("no recorded factor differs",)))
        else:
            cause = min((d.cause for d in found), key=CAUSES.index)
            verdicts.append(GraphVerdict(name, "miss", cause, tuple(grouped(found))))
    new_breaks = sorted(set(pod.get("graph_breaks", [])) - set(warmup.get("graph_breaks", [])))
    return summarise(tuple(verdicts), new_breaks, int(pod.get("precompiled") or 0))


def _unrecorded(pod: Mapping[str, Any], why: str) -> Diagnosis:
    verdicts = tuple(
        GraphVerdict(graph_name(g), "hit", "none") if g.get("result") == "hit"
        else GraphVerdict(graph_name(g), "miss", "unknown", (why,))
        for g in pod.get("graphs", [])
    )  # fmt: skip
    precompiled = int(pod.get("precompiled") or 0)
    if not verdicts and not precompiled:
        return Diagnosis((), "unknown", "unknown", why)
    return summarise(verdicts, (), precompiled)


def summarise(verdicts: tuple[GraphVerdict, ...], new_breaks: Sequence[str] = (), precompiled: int = 0) -> Diagnosis:
    """The pod's result, cause and one-line reason out of its graphs' verdicts and the number of
    Dynamo's precompiled entries it loaded (frames neither traced nor compiled: hits) (pure)."""
    missed = [v for v in verdicts if v.result == "miss"]
    loaded = f"{precompiled} precompiled Dynamo entries loaded" if precompiled else ""
    if not verdicts:
        return (
            Diagnosis((), "hit", "none", loaded)
            if precompiled
            else Diagnosis((), "none", "none", "no graph compiled yet")
        )
    if not missed:
        hits = f"all {len(verdicts)} graphs hit the warm-up's cache"
        return Diagnosis(verdicts, "hit", "none", f"{hits}; {loaded}" if loaded else hits)
    counts = Counter(v.cause for v in missed)
    cause = min(counts, key=lambda c: (-counts[c], CAUSES.index(c)))
    first = next(v for v in missed if v.cause == cause)
    details = list(first.differences[:4])
    if cause == "graph_break" and new_breaks:
        details.append(f"reason: {new_breaks[0]}")
    more = len(first.differences) - 4
    reason = f"{len(missed)} of {len(verdicts)} graphs compiled afresh ({cause}): {first.graph}: " + "; ".join(details)
    if more > 0:
        reason += f"; and {more} more"
    return Diagnosis(verdicts, "miss", cause, reason)


def read_bundle_document(path: Path) -> dict[str, Any] | None:
    """The factors file inside a bundle file's ``cachedir`` part (None when it has none)."""
    import tarfile

    from cachelib.bundle import CACHEDIR_PART, BundleReader

    with open(path, "rb") as stream:
        reader = BundleReader(stream)
        with reader.open_part(CACHEDIR_PART) as part, tarfile.open(fileobj=cast(IO[bytes], part), mode="r|") as tar:
            for member in tar:
                if member.isfile() and os.path.normpath(member.name) == FACTORS_NAME:
                    extracted = tar.extractfile(member)
                    if extracted is None:
                        break
                    try:
                        data = json.loads(extracted.read(1 << 26))
                    except ValueError as exc:
                        raise FactorsError(f"{path}: {FACTORS_NAME} is not JSON: {exc}") from exc
                    if not isinstance(data, dict) or data.get("format") != FORMAT:
                        raise FactorsError(f"{path}: {FACTORS_NAME} is not of format {FORMAT}")
                    return data
    return None


def explain(
    warmup: Mapping[str, Any] | None, here: Mapping[str, str], verdict: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What ``compilecache why`` says: the warm-up's record against this process's factors, and
    the verdict a pod left beside the cache (pure)."""
    report: dict[str, Any] = {"warmup": None, "this_process": [], "pod": verdict}
    if warmup is not None:
        process = warmup.get("process", {})
        report["warmup"] = {
            "graphs": [graph_name(g) for g in warmup.get("graphs", [])],
            "torch": process.get("torch_version:version"),
            "device": process.get("device:device"),
            "recorded": warmup.get("recorded", True),
            "problem": warmup.get("problem"),
        }
        found = differences(process, here)
        report["this_process"] = grouped(found)
        report["cause"] = min((d.cause for d in found), key=CAUSES.index) if found else "none"
    return report


def explain_lines(report: Mapping[str, Any]) -> list[str]:
    """``compilecache why`` as text (pure)."""
    lines = []
    warmup = report.get("warmup")
    if warmup is None:
        lines.append(f"the warm-up recorded no factors here (no {FACTORS_NAME})")
    else:
        count = len(warmup["graphs"])
        graphs = f"{count} graph{'' if count == 1 else 's'}"
        lines.append(f"warm-up: {graphs}, torch {warmup['torch']}, device {warmup['device']}")
        if not warmup["recorded"]:
            lines.append(f"  its graphs were not recorded: {warmup['problem']}")
        for name in warmup["graphs"]:
            lines.append(f"  {name}")
        differing = report.get("this_process") or []
        lines.append(f"this process against the warm-up: {report.get('cause')}")
        lines.extend(f"  {text}" for text in differing or ["no factor of the process differs"])
    pod = report.get("pod")
    if pod is not None:
        lines.append(f"the pod's verdict ({WHY_NAME}): {pod.get('result')} ({pod.get('cause')}): {pod.get('reason')}")
        for graph in pod.get("graphs", []):
            said = "; ".join(graph.get("differences", []))
            lines.append(
                f"  {graph.get('graph')}: {graph.get('result')}, {graph.get('cause')}" + (f": {said}" if said else "")
            )
    return lines


# -- the pod ----------------------------------------------------------------------------------------
@dataclass
class Watch:
    """The pod side: the warm-up's record, and where the verdict goes."""

    cache_dir: Path | None = None
    warmup: dict[str, Any] | None = None
    error: str | None = None
    process: dict[str, str] | None = None


watch = Watch()


def pod_document() -> dict[str, Any]:
    """This process as :func:`compare` reads it (the process factors are taken once)."""
    if watch.process is None:
        watch.process = process_factors()
    return {
        "recorded": recorder.installed,
        "problem": recorder.problem,
        "process": watch.process,
        "graphs": list(recorder.graphs),
        "graph_breaks": graph_break_reasons(),
        "precompiled": precompiled_hits(),
    }


def precompiled_hits() -> int:
    """Dynamo's precompiled entries this process loaded (``caching_precompile``)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return 0 if counters is None else int(counters["dynamo_cache"]["dynamo_cache_hit"])


def diagnose() -> Diagnosis:
    """This process's verdict so far, against the warm-up's record found by :func:`start_watching`."""
    if watch.error is not None:
        return _unrecorded(pod_document(), watch.error)
    return compare(watch.warmup, pod_document())


def start_watching(cache_dir: str | Path | None) -> str | None:
    """In the workload, before its first compile: record its graphs and, after each one, write
    :data:`WHY_NAME` into ``cache_dir``. Returns why nothing is recorded, or None."""
    problem = install()
    watch.cache_dir = Path(cache_dir) if cache_dir else None
    if watch.cache_dir is not None:
        try:
            watch.warmup = read_document(watch.cache_dir / FACTORS_NAME)
        except FactorsError as exc:
            watch.error = str(exc)
    if write_verdict not in recorder.on_graph:
        recorder.on_graph.append(write_verdict)
        atexit.register(_guarded, write_verdict)  # a workload whose frames all loaded precompiled compiles none
    return problem


def write_verdict(_: Recorder | None = None, environ: Mapping[str, str] | None = None) -> None:
    """The verdict so far: as one JSON object in :data:`WHY_NAME` of the cache directory, and as one
    line ``{"compilecache_why": {result, cause, reason}}`` in the container's termination-message
    file (``$COMPILECACHE_TERMINATION_LOG``, else ``/dev/termination-log`` where the kubelet made
    it), which the operator reads from the pod's status once the container ends; never over a message
    the workload wrote there itself."""
    diagnosis = diagnose()
    with contextlib.suppress(OSError):
        if watch.cache_dir is not None:
            write_json(watch.cache_dir / WHY_NAME, {**diagnosis.to_dict(), "at": round(time.time(), 3)})
        named = (os.environ if environ is None else environ).get(TERMINATION_LOG_ENV)
        path = Path(named or DEFAULT_TERMINATION_LOG)
        if (path.is_file() or (named and path.parent.is_dir())) and not foreign_message(path):
            line = {WHY_KEY: {"result": diagnosis.result, "cause": diagnosis.cause, "reason": diagnosis.reason[:1000]}}
            path.write_text(json.dumps(line, sort_keys=True) + "\n")


def foreign_message(path: Path) -> bool:
    """Whether the termination-message file holds what the workload wrote itself: it is the workload's
    to say, so the verdict never replaces it (the cache directory's copy and the metric still have it)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return False
    return bool(text) and not text.startswith('{"' + WHY_KEY + '"')
