"""The parse of ``spec.model.vllm``: a vLLM server as the workload of a CompileCache (pure).

The warm-up starts vLLM exactly as the pods do, so what the spec says here is the pods' start: the model string
(vLLM hashes it as written), the engine arguments, the ``VLLM_*`` variables and the command. Each is checked
here with the field named; what vLLM itself would refuse is left to vLLM (the warm-up reports it).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from cachelib.in_image import vllmargs
from cachelib.in_image.podcontract import VLLM_CACHE_ROOT_ENV
from compilecache_operator.model.spec import (
    DEFAULT_VLLM_COMMAND,
    MAX_VLLM_ARGS,
    MAX_VLLM_ENV,
    VllmSpec,
)
from compilecache_operator.model.spec_fields import FieldErrors, read_list, read_mapping, read_string, shown

_ENV_NAME = re.compile(r"^VLLM_[A-Za-z0-9_]*$")
MAX_ARG_LENGTH = 4096
UNSEEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
"""Unicode categories of characters a reader of the spec cannot see or that end a line: controls (NUL, escape, DEL),
format characters (zero-width space, right-to-left override), private-use, surrogates, unassigned, line and
paragraph separators. A vLLM string may hold none: vLLM hashes the string as written, so a hidden character is a
key nobody can type (the pods' manifests would have to carry it too), and a warm-up fails on it."""
LINE_WHITESPACE = frozenset("\t\n\r")
"""Controls a value may keep where it is JSON or free text (an engine argument, a variable's value): YAML's ``|``
ends a block with a newline."""


def unseen_character(text: str, allowed: frozenset[str] = frozenset()) -> str | None:
    """Why ``text`` is refused: the first character of :data:`UNSEEN_CATEGORIES` in it (not one of ``allowed``),
    named with its code point and position; None when it has none."""
    for i, char in enumerate(text):
        if char not in allowed and unicodedata.category(char) in UNSEEN_CATEGORIES:
            name = unicodedata.name(char, unicodedata.category(char))
            return f"holds U+{ord(char):04X} ({name}) at character {i + 1}: control and invisible characters are " \
                   "refused"
    return None


def parse_vllm(raw: Any, path: str, errors: FieldErrors) -> VllmSpec | None:
    """``spec.model.vllm`` -> :class:`VllmSpec`, every problem added to ``errors`` at its field's path."""
    section = read_mapping(raw, path, errors)
    model = read_string(section, "model", path, errors, required=True, max_length=1024)
    if model is not None and (problem := unseen_character(model)):
        errors.add(f"{path}.model", f"{shown(model)} {problem}")
        model = None
    before = len(errors.items)
    command = (_strings(section.get("command"), f"{path}.command", errors, 16, frozenset())
               or list(DEFAULT_VLLM_COMMAND))
    command_refused = len(errors.items) > before
    args = _strings(section.get("args"), f"{path}.args", errors, MAX_VLLM_ARGS, LINE_WHITESPACE)
    env = _env(section.get("env"), f"{path}.env", errors)
    if not command_refused and vllmargs.launcher_length(command) is None:
        errors.add(f"{path}.command", f"{shown(command)} does not start vLLM's server: vllm serve, or python -m "
                                      f"{vllmargs.LAUNCH_MODULES[0]}")  # fmt: skip
    if model is None:
        return None
    spec = VllmSpec(model=model, args=tuple(args), env=tuple(env), command=tuple(command))
    _check_args(spec, f"{path}.args", errors)
    return spec


def _strings(raw: Any, path: str, errors: FieldErrors, most: int, allowed: frozenset[str]) -> list[str]:
    items = read_list(raw, path, errors)
    if len(items) > most:
        errors.add(path, f"at most {most} items, got {len(items)}")
        return []
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or len(item) > MAX_ARG_LENGTH:
            errors.add(f"{path}[{i}]", f"must be a string of at most {MAX_ARG_LENGTH} characters")
            continue
        if problem := unseen_character(item, allowed):
            errors.add(f"{path}[{i}]", f"{shown(item)} {problem}")
            continue
        out.append(item)
    return out


def _env(raw: Any, path: str, errors: FieldErrors) -> list[tuple[str, str]]:
    items = read_list(raw, path, errors)
    if len(items) > MAX_VLLM_ENV:
        errors.add(path, f"at most {MAX_VLLM_ENV} variables, got {len(items)}")
        return []
    out: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        entry = read_mapping(item, where, errors)
        name, value = entry.get("name"), entry.get("value", "")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            errors.add(f"{where}.name", f"{shown(name)} is not a VLLM_* variable name" if name is not None
                       else "required")  # fmt: skip
            continue
        if name == VLLM_CACHE_ROOT_ENV:
            errors.add(f"{where}.name", f"{name} is where compilecache puts the bundle; it cannot be set here")
            continue
        if name in out:
            errors.add(f"{where}.name", f"{name} is set twice")
            continue
        if not isinstance(value, str):
            errors.add(f"{where}.value", "must be a string (the value is part of vLLM's key: no valueFrom)")
            continue
        if problem := unseen_character(value, LINE_WHITESPACE):
            errors.add(f"{where}.value", f"{shown(value)} {problem}")
            continue
        out[name] = value
    return sorted(out.items())


def _check_args(spec: VllmSpec, path: str, errors: FieldErrors) -> None:
    parsed = vllmargs.parse(spec.argv())
    if parsed is None:
        return  # the command was refused already
    if vllmargs.MODEL in _given(spec.args):
        errors.add(path, f"--model is spec.model.vllm.model ({spec.model!r}); leave it out of args")
    for name in parsed.unread:
        errors.add(path, f"{name!r} is a second positional argument: vLLM takes the model only")


def _given(args: tuple[str, ...]) -> set[str]:
    return {a.split("=", 1)[0].replace("_", "-") for a in args if a.startswith("--")}


def warmup_env_problems(env: tuple[Mapping[str, Any], ...], path: str, errors: FieldErrors) -> None:
    """A ``VLLM_*`` variable in ``spec.warmup.env`` of a vLLM cache: it belongs in ``spec.model.vllm.env`` (the
    pods' variables enter vLLM's key, and the admission check compares them)."""
    for i, entry in enumerate(env):
        name = str(entry.get("name", ""))
        if name.startswith("VLLM_"):
            errors.add(f"{path}[{i}].name", f"{name} belongs in spec.model.vllm.env: vLLM's variables are part of "
                                             "its compile key, which the pods must match")  # fmt: skip
