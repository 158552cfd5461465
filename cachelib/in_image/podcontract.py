"""What a pod and the operator agree on: file names, environment names and the termination message.

The warm-up harness writes ``OUT/{result.json,megacache.bin,cachedir/}`` and ``compilecache publish``
reads them; the webhook sets the environment the preload and the workload read; every container of
ours ends with one JSON object in its termination message, which the operator parses. Each of those
names is defined here once. Standard library only: the warm-up Job copies this file beside
``harness.py`` into the user's image (as it copies ``compilekey.py``), and the operator imports it
without torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# -- the harness's output directory ------------------------------------------------------------
RESULT_FILE = "result.json"
MEGACACHE_FILE = "megacache.bin"
CACHEDIR = "cachedir"

# -- environment ------------------------------------------------------------------------------
CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"
PRECOMPILE_ENV = "TORCH_CACHING_PRECOMPILE"
"""Set on app containers of a cache with spec.model.precompile Auto (torch reads it at import)."""
JOB_ID_ENV = "TORCH_COMPILE_JOB_ID"
GPU_ENV = "COMPILECACHE_GPU"
VLLM_CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
VLLM_ROOT_SUBDIR = "vllm"
"""vLLM's cache root inside the cache directory: a vLLM warm-up compiles there, a vLLM pod gets it."""
DONE_FILE_ENV = "COMPILECACHE_PRELOAD_DONE"
DONE_FILE_NAME = ".compilecache-preload.json"
TERMINATION_LOG_ENV = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"

# -- termination message ------------------------------------------------------------------------
TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most 4096 bytes of a termination message."""
COUNTED_LISTS = ("keys", "hits", "node_cache")
"""Lists a message may carry as their lengths alone (``<name>_count``) when the whole does not fit."""
SHRUNK_FIELD = "shrunk"
"""Set (to the number of fields left out) on a message that lost whole fields to fit."""
_CLIP_LENGTHS = (1024, 256, 64, 16)
_FIRST_FIELDS = ("result", "stage", "reason", "error")


def _compact(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def _fits(text: str) -> bool:
    return len(text.encode()) <= TERMINATION_MESSAGE_LIMIT


def _clip(value: Any, length: int) -> Any:
    """``value`` with every string cut to ``length`` characters and every list and object to its first
    ``length // 8`` entries (at least one), recursively."""
    if isinstance(value, str):
        return value if len(value) <= length else value[:length] + "..."
    keep = max(1, length // 8)
    if isinstance(value, Mapping):
        return {_clip(str(k), length): _clip(v, length) for k, v in list(value.items())[:keep]}
    if isinstance(value, (list, tuple)):
        return [_clip(v, length) for v in value[:keep]]
    return value


def _greedy(payload: Mapping[str, Any]) -> str:
    """As many of ``payload``'s fields as fit, the outcome's fields first, with the count of those left out."""
    order = [name for name in _FIRST_FIELDS if name in payload] + sorted(set(payload) - set(_FIRST_FIELDS))
    kept: dict[str, Any] = {}
    for name in order:
        trial = {**kept, name: payload[name], SHRUNK_FIELD: len(payload) - len(kept) - 1}
        if _fits(_compact(trial)):
            kept[name] = payload[name]
    return _compact({**kept, SHRUNK_FIELD: len(payload) - len(kept)})


def termination_message(payload: Mapping[str, Any]) -> str:
    """``payload`` as compact JSON within Kubernetes' limit, always whole JSON: when it does not fit, the
    long lists become their counts, then strings and lists are clipped ever shorter, then whole fields
    are left out (``shrunk`` counts them). Nothing is ever cut through the middle of the JSON."""
    text = _compact(payload)
    if _fits(text):
        return text
    counted = {str(k): v for k, v in payload.items()}
    for name in COUNTED_LISTS:
        if isinstance(counted.get(name), list):
            counted[f"{name}_count"] = len(counted.pop(name))
    text = _compact(counted)
    if _fits(text):
        return text
    for length in _CLIP_LENGTHS:
        clipped = {k[:length]: _clip(v, length) for k, v in counted.items()}
        text = _compact(clipped)
        if _fits(text):
            return text
    return _greedy(clipped)


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
