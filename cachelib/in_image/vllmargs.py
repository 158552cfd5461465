"""How a vLLM server is started, read from its command line and environment, and where two starts differ in
what vLLM's compile key reads (pure; standard library only).

vLLM keeps the model it compiled under ``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<sha256>/``,
the sha256 taken over every ``VLLM_*`` variable it hashes, its whole engine configuration
(``VllmConfig.compute_hash()``: its own version, the ``--model`` string, the model, cache, scheduler and
parallel settings) and Inductor's factors. A warm-up's artifacts therefore serve a pod only when the pod starts
vLLM with the same model string, the same value of every option that enters that configuration and the same
hashed variables; ``--load-format dummy``, ``--port``, ``--seed`` or ``--served-model-name`` change nothing.

:func:`parse` reads a command line as vLLM's parser does (``vllm serve MODEL``, ``--model``,
``python -m vllm.entrypoints.openai.api_server``, ``--opt=value``, ``--opt_name``, ``--no-opt``, ``-tp 2``,
``-O3``, dotted ``--compilation-config.mode 3``); :func:`differences` lists each key factor that differs between
two starts, with both values. Which options and variables are key factors is :mod:`cachelib.in_image.vllm_options`,
written from vLLM's own parser and hashing; an option it does not know counts as a key factor.

The warm-up harness (:mod:`cachelib.in_image.vllmwarm`) imports this module from beside itself in the user's image; the
operator imports it for the admission check.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # imported as cachelib.in_image.vllmargs
    from cachelib.in_image.vllm_options import HASHED_ENV, OPTIONS, VLLM_VERSION, Option
else:  # beside the warm-up harness in the user's image: the warm-up Job copies vllm_options.py there too
    from vllm_options import HASHED_ENV, OPTIONS, VLLM_VERSION, Option

__all__ = ["VLLM_VERSION", "Difference", "Invocation", "differences", "parse", "summary"]

LAUNCH_MODULES = (
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.cli.main",
)
"""``python -m MODULE``: the modules that start vLLM's OpenAI-compatible server (``cli.main`` with ``serve``)."""
SHELLS = ("sh", "bash", "dash", "ash", "zsh")
SEPARATORS = ("&&", ";", "||", "|")
UNSET = "unset"
MODEL = "--model"
CONFIG = "--config"
OPTIMIZATION_LEVEL = "--optimization-level"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def _spellings() -> dict[str, tuple[Option, bool]]:
    """Every spelling of every option -> (the option, whether the spelling negates a flag)."""
    found: dict[str, tuple[Option, bool]] = {}
    for option in OPTIONS:
        for name in option.names:
            found[name] = (option, name.startswith("--no-"))
    return found


SPELLINGS = _spellings()


def canonical(option: Option) -> str:
    """The name an option is reported by: its first long, non-negated spelling."""
    return next((n for n in option.names if n.startswith("--") and not n.startswith("--no-")), option.names[0])


@dataclass(frozen=True)
class Invocation:
    """One start of vLLM: how it is launched, the model string, the options as given and the hashed variables."""

    launcher: tuple[str, ...]
    """What starts vLLM (``vllm serve``, ``python -m vllm.entrypoints.openai.api_server``): no key factor."""
    model: str | None
    options: Mapping[str, str] = field(default_factory=dict)
    """Canonical option name -> its value as written (flags: ``true``/``false``; lists: joined by spaces)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The variables vLLM hashes, as set (:data:`cachelib.in_image.vllm_options.HASHED_ENV`)."""
    unread: tuple[str, ...] = ()
    """Tokens that are neither an option, its value nor the model (a second positional argument)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "launcher": list(self.launcher), "model": self.model, "options": dict(self.options),
            "env": dict(self.env), "unread": list(self.unread),
        }  # fmt: skip


@dataclass(frozen=True)
class Difference:
    """A key factor whose value differs between the warm-up's start and the pod's."""

    factor: str
    """``--max-model-len``, ``--model``, or the variable's name (``VLLM_USE_AOT_COMPILE``)."""
    before: str
    after: str
    kind: str = "argument"
    """``argument`` (an option or the model) or ``env``."""

    def text(self) -> str:
        if self.kind == "env":
            return f"env {self.factor}: {self.before} → {self.after}"
        return f"{self.factor} {self.before} → {self.after}"

    def to_dict(self) -> dict[str, str]:
        return {"factor": self.factor, "before": self.before, "after": self.after, "kind": self.kind}


def command_line(command: Sequence[str], model: str, args: Sequence[str]) -> list[str]:
    """A start written out: ``vllm serve MODEL ARGS`` (the model positional after ``serve``, as vLLM asks), else
    ``COMMAND --model MODEL ARGS``."""
    named = [model] if list(command[-1:]) == ["serve"] else [MODEL, model]
    return [*command, *named, *args]


# -- reading a command line ---------------------------------------------------------------------------------
def launcher_length(argv: Sequence[str]) -> int | None:
    """How many leading tokens of ``argv`` start vLLM's server (``vllm serve`` 2, ``python -m MODULE`` 3, with
    ``cli.main serve`` 4); None when ``argv`` does not start it."""
    if not argv:
        return None
    program = os.path.basename(argv[0])
    if program == "vllm":
        return 2 if len(argv) > 1 and argv[1] == "serve" else None
    if _PYTHON.match(program) and len(argv) > 2 and argv[1] == "-m" and argv[2] in LAUNCH_MODULES:
        if argv[2] == "vllm.entrypoints.cli.main":
            return 4 if len(argv) > 3 and argv[3] == "serve" else None
        return 3
    return None


def vllm_argv(argv: Sequence[str]) -> list[str] | None:
    """The part of ``argv`` that starts vLLM: ``argv`` itself, or the command a shell runs (``sh -c "... vllm
    serve ..."``, through ``exec`` and ``env``); None when no vLLM server is started."""
    argv = list(argv)
    while argv and os.path.basename(argv[0]) in ("env", "exec"):
        argv = [a for a in argv[1:] if "=" not in a or a.startswith("-")] if argv[0] == "env" else argv[1:]
    if launcher_length(argv) is not None:
        return argv
    if len(argv) >= 3 and os.path.basename(argv[0]) in SHELLS and argv[1] in ("-c", "-lc", "-ec"):
        try:
            lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            return None
        starts = [0] + [i + 1 for i, w in enumerate(words) if w in SEPARATORS]
        for start in starts:
            command = words[start:]
            candidate = vllm_argv(command[: _end(command)])
            if candidate is not None:
                return candidate
    return None


def _end(words: Sequence[str]) -> int:
    """Where a command in a shell line ends (at ``&&``, ``;``, ``||`` or ``|``)."""
    return next((i for i, w in enumerate(words) if w in SEPARATORS), len(words))


def _normal_name(token: str) -> str:
    """An option's name as vLLM's parser reads it: underscores before the first dot become dashes."""
    if not token.startswith("--"):
        return token
    head, dot, rest = token[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Invocation | None:
    """The vLLM start ``argv`` makes (None when it starts none), with the hashed variables of ``env``."""
    found = vllm_argv(argv)
    if found is None:
        return None
    length = launcher_length(found)
    assert length is not None
    model, options, unread = _read_options(found[length:])
    return Invocation(tuple(found[:length]), model, options, hashed_env(env or {}), tuple(unread))


def _read_options(tokens: Sequence[str]) -> tuple[str | None, dict[str, str], list[str]]:
    model: str | None = None
    options: dict[str, str] = {}
    unread: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.startswith("-O") and token != "-O":  # -O3, -O=3: the optimization level, as vLLM reads them
            options[OPTIMIZATION_LEVEL] = token[3:] if token[2:3] == "=" else token[2:]
            i += 1
            continue
        if token == "-O" and following in ("0", "1", "2", "3"):
            options[OPTIMIZATION_LEVEL] = following
            i += 2
            continue
        if not token.startswith("-") or token == "-":
            if model is None:
                model = token
            else:
                unread.append(token)
            i += 1
            continue
        name, has_value, value = token.partition("=")
        shown, text, taken = _option_value(_normal_name(name), value if has_value else None, tokens[i + 1 :])
        i += 1 + taken
        if shown == MODEL:
            model = text
        else:
            options[shown] = text
    return model, options, unread


def _option_value(name: str, given: str | None, rest: Sequence[str]) -> tuple[str, str, int]:
    """(canonical name, value, tokens taken after the option) for the option spelt ``name``."""
    shown, takes, negated = _option_named(name)
    if given is not None:
        return shown, given, 0
    if takes == "flag" or (takes == "unknown" and (not rest or rest[0].startswith("--"))):
        return shown, "false" if negated else "true", 0
    if takes == "many":
        values = list(itertools.takewhile(lambda item: not item.startswith("-") or _number(item), rest))
        return shown, " ".join(values), len(values)
    if takes == "optional" and (not rest or (rest[0].startswith("-") and not _number(rest[0]))):
        return shown, "", 0
    return (shown, rest[0], 1) if rest else (shown, "", 0)


def _option_named(name: str) -> tuple[str, str, bool]:
    """(canonical name, what it takes, whether the spelling negates it) of the option spelt ``name``: a
    sub-option (``--compilation-config.mode``) takes one value, an option vLLM does not know is ``unknown``."""
    base = name.split(".", 1)[0]
    known = SPELLINGS.get(base)
    if known is None:
        return name, "unknown", False
    option, negated = known
    if base != name:
        return canonical(option) + name[len(base):], "one", False
    return canonical(option), option.takes, negated


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def hashed_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that vLLM hashes into its compile key."""
    return {k: str(v) for k, v in sorted(env.items()) if k in HASHED_ENV}


# -- comparing ----------------------------------------------------------------------------------------------
def is_key_option(name: str) -> bool:
    """Whether the option reported as ``name`` enters vLLM's compile key (an unknown one is assumed to)."""
    known = SPELLINGS.get(name.split(".", 1)[0])
    return True if known is None else known[0].key


def _value_or_default(options: Mapping[str, str], name: str) -> str:
    if name in options:
        return options[name]
    known = SPELLINGS.get(name)
    default = known[0].default if known is not None and name == name.split(".", 1)[0] else None
    return default if default is not None else UNSET


def differences(warmup: Invocation, pod: Invocation) -> list[Difference]:
    """Every key factor of ``pod`` that differs from ``warmup``, the model first, then the options, then the
    variables, each with both values (an option or a variable left out counts as its default)."""
    found = []
    if (warmup.model or UNSET) != (pod.model or UNSET):
        found.append(Difference(MODEL, warmup.model or UNSET, pod.model or UNSET))
    for name in sorted(set(warmup.options) | set(pod.options)):
        if not is_key_option(name):
            continue
        before, after = _value_or_default(warmup.options, name), _value_or_default(pod.options, name)
        if _same(before, after):
            continue
        found.append(Difference(name, before, after))
    for name in sorted(set(warmup.env) | set(pod.env)):
        if not _same(_env_value(warmup.env, name), _env_value(pod.env, name)):
            found.append(Difference(name, warmup.env.get(name, UNSET), pod.env.get(name, UNSET), "env"))
    return found


def _env_value(env: Mapping[str, str], name: str) -> str:
    """A variable as vLLM hashes it: its value, else the value vLLM hashes when it is not set."""
    return env[name] if name in env else HASHED_ENV.get(name) or UNSET


def _same(a: str, b: str) -> bool:
    """Two values as vLLM reads them: the same text, the same number (``0.9``, ``.90``) or truth value."""
    if a == b:
        return True
    truth = {"true": "1", "false": "0", "1": "1", "0": "0"}
    if a.lower() in truth and b.lower() in truth and truth[a.lower()] == truth[b.lower()]:
        return True
    return _number(a) and _number(b) and float(a) == float(b)


def summary(found: Sequence[Difference], limit: int = 4) -> str:
    """The differences in one line (``--max-model-len 8192 → 4096; env VLLM_X: unset → 1``), the first
    ``limit`` of them and a count of the rest."""
    texts = [d.text() for d in found[:limit]]
    if len(found) > limit:
        texts.append(f"and {len(found) - limit} more")
    return "; ".join(texts)
