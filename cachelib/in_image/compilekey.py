"""What a compiled artifact is keyed by: the compile options, the model, the runtime fields, their digests.

The warm-up harness, the ``compilecache`` CLI, the key format (``keyformat``) and the operator all read these
definitions from here, so that the CRD, the CLI and the harness accept the same options and
compute the same digests. Like the harness, this module needs nothing but the standard library:
the warm-up Job copies it beside ``harness.py`` into the user's image (as it copies
``targets.py``), and the operator imports it without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

KEY_FORMAT = "cc1"
"""The key format version, the first segment of every key."""
NONE = "none"
"""The value of a version field that does not apply (no triton or CUDA on a CPU build)."""
CPU = "cpu"
"""The GPU and capability fields of a key compiled without a GPU."""

BUILTIN_MODULE = "cachelib.in_image.targets"
BUILTIN_TARGETS = ("tiny_mlp", "transformer_block", "small_convnet")

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile(mode=...)``; ``default`` passes no mode."""
DYNAMIC = ("auto", "true", "false")
"""``torch.compile(dynamic=...)`` as written: ``auto`` is None (torch decides)."""
DEFAULT_BACKEND = "inductor"
PRECOMPILE_CHOICES = ("auto", "off")
"""``--precompile``: auto saves Dynamo's precompiled entries and the warm-start manifest
(cachelib.in_image.warmstart)."""
KEY_FIELDS = ("namespace", "name", "model", "options", "gpu", "capability", "torch", "triton", "cuda", "py")
VERSIONED_FIELDS = ("torch", "triton", "cuda", "py")
"""The key fields written as ``<field>-<version>`` segments."""

EXIT_USAGE = 2

_SEGMENT_BAD = re.compile(r"[^A-Za-z0-9._+-]+")
CAPABILITY_PATTERN = re.compile(r"^(sm[0-9]+|cpu)$")
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_BACKEND = re.compile(r"^[A-Za-z0-9_.:-]+$")
_CONFIG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class InvalidKey(ValueError):
    """A cache key (or one of its fields) is malformed; the message names the field."""


class UsageError(ValueError):
    """An option, target or name that can never work; the message names it."""

    exit_code = EXIT_USAGE


# -- digests and key fields ------------------------------------------------------------------
def digest(payload: Any) -> str:
    """A 16-hex-digit digest of a JSON-serialisable value, independent of dict order."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gpu_slug(product: str) -> str:
    """Normalise a GPU product name to a key segment.

    ``NVIDIA-H100-80GB-HBM3``, ``NVIDIA H100 80GB HBM3`` and ``nvidia_h100_80gb_hbm3`` all
    become ``nvidia-h100-80gb-hbm3``; an empty product (no GPU) becomes ``cpu``.
    """
    slug = re.sub(r"[^a-z0-9.]+", "-", product.strip().lower()).strip("-.")
    return slug or CPU


def capability_slug(capability: tuple[int, int] | str | None) -> str:
    """``(9, 0)`` or ``"9.0"`` -> ``sm90``; ``None`` or ``""`` (no GPU) -> ``cpu``."""
    if capability is None or capability == "" or capability == CPU:
        return CPU
    if isinstance(capability, str):
        if CAPABILITY_PATTERN.match(capability):
            return capability
        parts = capability.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise InvalidKey(f"capability: expected 'MAJOR.MINOR' or 'smNN', got {capability!r}")
        return f"sm{parts[0]}{parts[1]}"
    major, minor = capability
    return f"sm{major}{minor}"


def version_segment(version: str) -> str:
    """A version string made safe for a key segment (``[A-Za-z0-9._+-]``)."""
    return _SEGMENT_BAD.sub("-", version.strip()).strip("-") or NONE


def key_string(fields: Mapping[str, str]) -> str:
    """``cc1/<ns>/<name>/<model>/<options>/<gpu>/<capability>/torch-V/triton-V/cuda-V/py-V``."""
    head = [KEY_FORMAT] + [fields[f] for f in KEY_FIELDS if f not in VERSIONED_FIELDS]
    return "/".join(head + [f"{f}-{fields[f]}" for f in VERSIONED_FIELDS])


def key_fields(
    namespace: str, name: str, model: str, options: str, device: Mapping[str, Any], versions: Mapping[str, str]
) -> dict[str, str]:
    """The fields of the cache key a warm-up produces, from the device and versions it detected."""
    py_major_minor = ".".join(versions["python"].split(".")[:2])
    return {
        "namespace": namespace,
        "name": name,
        "model": model,
        "options": options,
        "gpu": gpu_slug("" if device.get("type") == CPU else str(device.get("product", ""))),
        "capability": capability_slug(str(device.get("capability") or "")),
        "torch": version_segment(versions["torch"]),
        "triton": version_segment(versions["triton"]),
        "cuda": version_segment(versions["cuda"]),
        "py": version_segment(py_major_minor),
    }


# -- the model ---------------------------------------------------------------------------------
def is_target(target: str) -> bool:
    """Whether the harness can run ``target``: ``module:function`` or a built-in target's name."""
    return target in BUILTIN_TARGETS or bool(_MODULE_FUNCTION.match(target))


def canonical_target(target: str) -> str:
    """``tiny_mlp`` -> ``cachelib.in_image.targets:tiny_mlp``; other targets must read ``module:function``."""
    if not is_target(target):
        raise UsageError(f"--target {target!r}: expected 'module:function' or one of {', '.join(BUILTIN_TARGETS)}")
    return f"{BUILTIN_MODULE}:{target}" if target in BUILTIN_TARGETS else target


def model_digest(target: str | None = None, command: str | None = None) -> str:
    """The model identity digest of a key: the canonical target, or the command line."""
    if (target is None) == (command is None):
        raise UsageError("give exactly one of a target or a command")
    if target is not None:
        return digest({"target": canonical_target(target)})
    return digest({"command": command})


def default_job_id(namespace: str, name: str) -> str:
    """The stable ``torch.compiler.config.job_id`` of a cache, used when none is given."""
    return f"compilecache-{namespace}.{name}"


# -- compile options ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Everything passed to ``torch.compile`` or set around it; all of it enters the digest."""

    mode: str = "default"
    dynamic: bool | None = None
    fullgraph: bool = False
    backend: str = DEFAULT_BACKEND
    compiled_autograd: bool = False
    backward: bool = False
    inductor_config: tuple[tuple[str, Any], ...] = ()
    precompile: str = "off"

    def __post_init__(self) -> None:
        if self.compiled_autograd and not self.backward:
            object.__setattr__(self, "backward", True)  # compiled autograd captures the backward pass
        object.__setattr__(self, "inductor_config", tuple(sorted(self.inductor_config)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "dynamic": self.dynamic,
            "fullgraph": self.fullgraph,
            "backend": self.backend,
            "compiled_autograd": self.compiled_autograd,
            "backward": self.backward,
            "inductor_config": dict(self.inductor_config),
        } | ({"precompile": self.precompile} if self.precompile != "off" else {})  # off: the digest of before

    def digest(self) -> str:
        return digest(self.to_dict())

    def compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile``."""
        return {
            "mode": None if self.mode == "default" else self.mode,
            "dynamic": self.dynamic,
            "fullgraph": self.fullgraph,
            "backend": self.backend,
        }

    def harness_args(self) -> list[str]:
        """The harness (and ``compilecache warmup``) flags that give these options back."""
        args = ["--mode", self.mode, "--dynamic", dynamic_text(self.dynamic), "--backend", self.backend]
        if self.fullgraph:
            args.append("--fullgraph")
        if self.compiled_autograd:
            args.append("--compiled-autograd")  # implies the backward pass
        elif self.backward:
            args.append("--backward")
        for name, value in self.inductor_config:
            args += ["--inductor-config", f"{name}={json.dumps(value)}"]
        if self.precompile != "off":
            args += ["--precompile", self.precompile]
        return args


def options_from_args(args: argparse.Namespace) -> CompileOptions:
    """The options of a command line parsed with :func:`add_compile_arguments`."""
    return CompileOptions(
        mode=args.mode,
        dynamic=args.dynamic,
        fullgraph=args.fullgraph,
        backend=args.backend,
        compiled_autograd=args.compiled_autograd,
        backward=args.backward,
        inductor_config=tuple(args.inductor_config),
        precompile=args.precompile,
    )


def dynamic_text(dynamic: bool | None) -> str:
    """``torch.compile``'s ``dynamic`` as the CRD and the command lines write it."""
    return "auto" if dynamic is None else "true" if dynamic else "false"


def parse_dynamic(text: str) -> bool | None:
    """``true``/``1``/``yes``, ``false``/``0``/``no``, ``auto``/``none``/empty -> True, False, None."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    if lowered in ("auto", "none", ""):
        return None
    raise argparse.ArgumentTypeError(f"expected true, false or auto, got {text!r}")


def is_backend(name: str) -> bool:
    return bool(_BACKEND.match(name))


def is_config_name(name: str) -> bool:
    """``max_autotune`` or ``triton.cudagraphs``: an attribute path under ``torch._inductor.config``."""
    return bool(_CONFIG_NAME.match(name))


def parse_backend(text: str) -> str:
    if not is_backend(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a backend name")
    return text


def config_value(raw: str) -> Any:
    """An inductor config VALUE as written: read as JSON (``true``, ``4``, ``"x"``), else the text itself."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def parse_config_item(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` -> (NAME, :func:`config_value` of VALUE)."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not is_config_name(name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME an inductor config option, got {text!r}")
    return name, config_value(raw)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target`` or ``--command``: what a warm-up compiles."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--target", help=f"module:function, or {' | '.join(BUILTIN_TARGETS)}")
    what.add_argument("--command", help="run this command with TORCHINDUCTOR_CACHE_DIR set instead of a target")


def add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    """The compile options, as the harness and ``compilecache warmup`` both take them."""
    parser.add_argument("--mode", default="default", choices=MODES, help="torch.compile mode (default: %(default)s)")
    parser.add_argument(
        "--dynamic", default=None, type=parse_dynamic, metavar="|".join(DYNAMIC), help="dynamic shapes (default: auto)"
    )
    parser.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True)")
    parser.add_argument(
        "--backend", default=DEFAULT_BACKEND, type=parse_backend, help="torch.compile backend (default: %(default)s)"
    )
    parser.add_argument(
        "--compiled-autograd", action="store_true", help="compile forward+backward as one step with compiled autograd"
    )
    parser.add_argument("--backward", action="store_true", help="run forward and backward (training)")
    parser.add_argument(
        "--inductor-config",
        action="append",
        default=[],
        type=parse_config_item,
        metavar="NAME=VALUE",
        help="set torch._inductor.config.NAME (VALUE parsed as JSON); part of the options digest",
    )
    parser.add_argument(
        "--precompile",
        default="off",
        choices=PRECOMPILE_CHOICES,
        help="auto: save Dynamo's precompiled entries and the warm-start manifest (default: %(default)s)",
    )
