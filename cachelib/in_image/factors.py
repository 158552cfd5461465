"""What decides torch's cache keys, recorded per graph where torch computes them.

torch looks a compiled graph up by keys made of many things (its own sources, Triton, Python,
the device, the Inductor, Dynamo and functorch configs, the inputs' dtypes and shapes, the
traced code). A bundle that restores fine is silently not used when any of them differs
between the warm-up and the pod. This module records them; :mod:`cachelib.verdict` compares the
pod's with the warm-up's and names the one that differed.

- **Recording** (:func:`install`): wraps Dynamo's ``OutputGraph._call_user_compiler`` (one call
  per graph handed to the backend: the frame's code, the graph's inputs and source lines, and
  whether torch's caches hit for it, from the counters around the call) and
  ``FxGraphHashDetails.__init__`` (torch's own key details: the Inductor config the FX-graph key
  saw, the settings beside it, the hash of torch's sources). Only on the torch releases these
  were checked against (:data:`PROVEN_TORCH`); elsewhere nothing is wrapped and the diagnosis says
  ``unknown``. A failure inside the recorder is logged and dropped, never raised into torch.
- **The warm-up** writes :data:`FACTORS_NAME` into the cache directory (it travels in the bundle's
  ``cachedir`` part): the process's factors and one record per graph.

Factors are a flat ``{"<cause>:<name>": value}`` mapping; values are short strings. Environment
variables whose name says secret are recorded as a digest, never as their value.

Standard library only at import; torch is imported by the functions that need it. This module
is copied beside ``harness.py`` into warm-up containers, so it imports nothing from cachelib
at import time.
"""

from __future__ import annotations

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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FACTORS_NAME = "compilecache-factors.json"
"""The warm-up's record at the top of the cache directory (a plain name: the unpacker installs it)."""
FORMAT = 1
PROVEN_TORCH = ((2, 11), (2, 15))
"""torch releases (major, minor), both ends included, whose Dynamo and Inductor internals used here
were checked (tests/cachelib/test_factors.py on 2.13 and 2.15)."""

ENV_PREFIXES = ("TORCH", "PYTORCH_", "TRITON_", "CUDA_", "NVIDIA_", "HIP_", "ROCM_", "OMP_NUM_THREADS")
ENV_PER_RUN = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_COMPILE_JOB_ID", "TRITON_HOME"})
"""Environment variables that differ between any two runs by design and enter no key (``TRITON_HOME``: where
Triton writes its dumps and overrides, ``/tmp`` in a warm-up with a read-only root)."""
_SKIPPED_DETAILS = frozenset(
    {"gm", "example_inputs", "fx_kwargs", "inputs_to_check", "inductor_config", "aot_config", "autograd_config",
     "torch_version", "system_info"}
)  # fmt: skip
_MAX_VALUE = 200
_MAX_LINES = 400
log = logging.getLogger(__name__)


# -- values ---------------------------------------------------------------------------------------------
def value_text(value: Any) -> str | None:
    """A short comparable text of a config or setting value; None for values without a stable
    text (objects shown by address, long ones)."""
    if callable(value) and not isinstance(value, type):
        return None
    text = value.hex() if isinstance(value, bytes) else canonical_repr(value)
    if " at 0x" in text or len(text) > _MAX_VALUE:
        return None
    return text


def canonical_repr(value: Any) -> str:
    """``repr``, but with the members of every set in sorted order, at any depth (pure): a set of
    strings iterates in an order that string hashing picks anew in every process, so two equal sets
    would otherwise read as a difference between the warm-up and a pod."""
    if isinstance(value, set | frozenset):
        if not value:
            return repr(value)
        body = "{" + ", ".join(sorted(canonical_repr(v) for v in value)) + "}"
        return body if isinstance(value, set) else f"frozenset({body})"
    if type(value) is list:
        return "[" + ", ".join(canonical_repr(v) for v in value) + "]"
    if type(value) is tuple:
        return "(" + ", ".join(canonical_repr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if type(value) is dict:
        return "{" + ", ".join(f"{canonical_repr(k)}: {canonical_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


def canonical_text(text: str) -> str:
    """A recorded value's text with its sets in sorted order (pure): for records written before values
    were recorded that way. Texts that are not Python literals come back as they are."""
    if "{" not in text:
        return text
    import ast

    try:
        node = ast.parse(text, mode="eval").body
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "frozenset" and len(node.args) == 1:
            value: Any = frozenset(ast.literal_eval(node.args[0]))
        else:
            value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    return canonical_repr(value)


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
    """``cachelib.in_image.<name>``, or ``<name>.py`` beside this file (a warm-up container, where the harness
    loaded it, or loads it here, as ``compilecache_<name>``); None when neither exists."""
    with contextlib.suppress(ImportError):
        return importlib.import_module(f"cachelib.in_image.{name}")
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

        guard = _sibling("precompileguard")
        if guard is None:
            return "cachelib.in_image.precompileguard is not installed beside cachelib.in_image.factors"
        release = guard.torch_release(str(torch.__version__))
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
        graph = guarded(graph_record, self, gm)
        before = guarded(cache_counts)
        recorder._local.graph = graph
        try:
            return original_compile(self, gm, example_inputs)
        finally:
            recorder._local.graph = None
            if graph is not None:
                graph["result"] = guarded(lookup_result, before, cache_counts()) or "unknown"
                recorder.graphs.append(graph)
                for callback in list(recorder.on_graph):
                    guarded(callback, recorder)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        graph = recorder.current()
        if graph is not None:
            guarded(add_key_details, graph, self)

    output_graph.OutputGraph._call_user_compiler = _call_user_compiler
    codecache.FxGraphHashDetails.__init__ = __init__
    recorder.installed = True
    return None


def guarded(fn: Any, *args: Any) -> Any:
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
