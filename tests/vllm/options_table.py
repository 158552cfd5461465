"""vLLM's command-line options and environment variables, each classed by whether it enters vLLM's compile key:
the table :mod:`cachelib.in_image.vllm_options` is written from here, and the tests check that it still says what the
installed vLLM does.

Run with vLLM's own interpreter (the suite's vLLM venv, ``$COMPILECACHE_TEST_VLLM``)::

    $COMPILECACHE_TEST_VLLM/bin/python -m tests.vllm.options_table > cachelib/in_image/vllm_options.py

For each option of vLLM's OpenAI server parser it builds the engine configuration twice, from a base command line
and from the same line with the option set to another value, and computes the hash vLLM names its compile cache
directory after (``aot_compile_hash_factors``: the hashed environment and ``VllmConfig.compute_hash()``). An option
that is no field of vLLM's engine arguments never reaches that configuration (the server's own: ``--port``,
``--api-key``); an option whose other value the configuration refuses, or that has no value to try, is classed
as a key factor, which is what the comparison must assume of it. Environment variables: those vLLM's
``envs.compile_factors()`` hashes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

TINY_MODEL = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 512,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
}  # fmt: skip
HASHES_MARK = "HASHES"
SKIPPED = frozenset({"help", "version", "config", "model", "model_tag", "headless"})
"""Not probed: the model (compared as the model string), a config file (read at run time), help and the like."""


@dataclasses.dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    takes: str
    """``flag`` (no value), ``one``, ``many`` (``nargs='+'``/``'*'``) or ``optional`` (``nargs='?'``)."""
    default: str | None
    key: bool
    how: str
    """Why it is classed so: ``probed``, ``frontend`` (no engine argument), ``configuration`` (a whole configuration
    object, or the optimization level: a key factor), ``ignored`` (no other value worked, and the field is in its
    configuration's ``ignored_factors``) or ``unprobed`` (no other value worked: a key factor)."""


def parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-any-return]


def engine_fields() -> set[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def compile_hash(argv: Sequence[str]) -> str:
    """The hash vLLM names its compile cache directory after, for a server started with ``argv``."""
    from vllm.compilation.caching import aot_compile_hash_factors
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = parser().parse_args(list(argv))
    with contextlib.redirect_stdout(io.StringIO()):
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        with set_current_vllm_config(config):
            return hashlib.sha256(str(aot_compile_hash_factors(config)).encode()).hexdigest()


def ignored_fields() -> frozenset[str]:
    """The fields vLLM's configurations name as ignored in their ``compute_hash`` (the ``ignored_factors`` set each
    one spells out): what an option that cannot be probed here (it needs a tokenizer, a GPU) is classed by."""
    import ast
    import inspect

    import vllm.config as config

    found: set[str] = set()
    for name in dir(config):
        method = getattr(getattr(config, name), "compute_hash", None)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        except (TypeError, OSError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Set):
                continue
            if any(getattr(t, "id", "") == "ignored_factors" for t in node.targets):
                found |= {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return frozenset(found)


def takes(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "flag"
    if action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1):
        return "many"
    return "optional" if action.nargs == "?" else "one"


def default_text(value: Any) -> str | None:
    """A default as a command line would write it; None where it cannot be written (no default, an object)."""
    if value is None or dataclasses.is_dataclass(value):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return None


def alternatives(action: argparse.Action) -> Iterator[list[str]]:
    """Other values to set an option to, most likely to be accepted first."""
    name = next(n for n in action.option_strings if n.startswith("--") and not n.startswith("--no-"))
    negated = next((n for n in action.option_strings if n.startswith("--no-")), None)
    if action.nargs == 0:
        if negated is not None and action.default is True:
            yield [negated]
        else:
            yield [name]
        return
    default = action.default
    for choice in action.choices or ():
        if choice != default:
            yield [name, str(choice)]
    if isinstance(default, bool):
        yield [name, "false" if default else "true"]
    elif isinstance(default, int):
        yield from ([name, str(v)] for v in (default + 1, default * 2, max(default - 1, 0)))
    elif isinstance(default, float):
        yield from ([name, str(v)] for v in (round(default * 0.5, 3), default + 1.0))
    for text in ("1", "2", "512", "1024", "4096", "0.5", "x", "{}", "[]", "true", "uni", "mp", "auto", "none"):
        yield [name, text]


PROBES = 3
"""Other values tried per option: one that changes the key is enough, and some do only for some values
(``-O0`` turns compilation off, ``-O3`` changes nothing on the CPU)."""


def probe(action: argparse.Action, base: Sequence[str], base_hash: str) -> tuple[bool, str]:
    accepted = 0
    for extra in alternatives(action):
        try:
            changed = compile_hash([*base, *extra])
        except BaseException:  # SystemExit from argparse, a config the engine refuses
            continue
        if changed != base_hash:
            return True, "probed"
        accepted += 1
        if accepted == PROBES:
            break
    return (False, "probed") if accepted else (True, "unprobed")


def options(model_dir: Path) -> list[Option]:
    base = ["--model", str(model_dir), "--max-model-len", "256", "--max-num-seqs", "4"]
    base_hash = compile_hash(base)
    fields = engine_fields()
    ignored = ignored_fields()
    found = []
    for action in parser()._actions:
        if not action.option_strings or action.dest in SKIPPED:
            continue
        if action.dest not in fields:
            key, how = False, "frontend"
        elif action.dest.endswith("_config") or action.dest == "optimization_level":
            key, how = True, "configuration"  # an object of many fields, or the level that sets them
        else:
            key, how = probe(action, base, base_hash)
            if how == "unprobed" and action.dest in ignored:
                key, how = False, "ignored"  # vLLM's compute_hash leaves the field out
        names = tuple(action.option_strings)
        found.append(Option(names, takes(action), default_text(action.default), key, how))
    return found


def hashed_environment() -> dict[str, str | None]:
    """The variables vLLM hashes, each with the value it hashes when the variable is not set."""
    import vllm.envs as envs

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k in envs.environment_variables}
    try:
        factors = envs.compile_factors()
    finally:
        os.environ.update(saved)
    return {name: default_text(value) for name, value in sorted(factors.items())}


def module_text(found: Sequence[Option], hashed_env: Mapping[str, str | None], version: str) -> str:
    rows = "\n".join(
        f"    Option({o.names!r}, {o.takes!r}, {o.default!r}, {o.key!r}),  # {o.how}" for o in found
    )
    env = "\n".join(f"    {name!r}: {default!r}," for name, default in hashed_env.items())
    return textwrap.dedent('''\
        # ruff: noqa: E501
        """vLLM {version}'s command-line options and the environment variables its compile key reads (generated).

        Written by ``tests/vllm/options_table.py`` from vLLM's own parser and configuration hashing (see there);
        :mod:`cachelib.in_image.vllmargs` reads it. Standard library only, like its reader.
        """

        from __future__ import annotations

        from typing import NamedTuple

        VLLM_VERSION = {version!r}
        """The vLLM whose parser and hashing this table was written from."""


        class Option(NamedTuple):
            names: tuple[str, ...]
            """Every spelling of the option (``--enable-prefix-caching``, ``--no-enable-prefix-caching``, ``-tp``)."""
            takes: str
            """``flag`` (no value), ``one``, ``many`` or ``optional`` (a value or none)."""
            default: str | None
            """The default as a command line writes it (None: none, or not writable)."""
            key: bool
            """Whether another value changes vLLM's compile key."""


        OPTIONS: tuple[Option, ...] = (
        ''').format(version=version) + rows + "\n)\n\nHASHED_ENV: dict[str, str | None] = {\n" + env + "\n}\n" + (
        '"""The environment variables vLLM hashes into its compile key (``envs.compile_factors()``), each with the '
        'value\nit hashes when the variable is not set."""\n'
    )


def write_tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_MODEL))
    return directory


def hashes(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    """vLLM's compile hash of each case: ``{"argv": the options after the model, "env": VLLM_* variables}``, all
    for the tiny model; ``error: ...`` for a start vLLM refuses."""
    import tempfile

    import vllm.envs as envs

    found = []
    with tempfile.TemporaryDirectory() as scratch:
        model = str(write_tiny_model(Path(scratch) / "tiny"))
        for case in cases:
            saved = {k: os.environ.pop(k) for k in list(os.environ) if k in envs.environment_variables}
            os.environ.update(case.get("env") or {})
            try:
                found.append(compile_hash(["--model", model, *case["argv"]]))
            except BaseException as exc:  # argparse's SystemExit, a configuration vLLM refuses
                found.append(f"error: {type(exc).__name__}: {exc}"[:300])
            finally:
                for name in case.get("env") or {}:
                    os.environ.pop(name, None)
                os.environ.update(saved)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Without arguments: the table module on stdout. With ``--hashes``: read cases as JSON from stdin, write
    their hashes as one line ``HASHES <JSON list>`` (vLLM logs to stdout too)."""
    import tempfile

    import vllm

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if list(argv if argv is not None else sys.argv[1:]) == ["--hashes"]:
        found = hashes(json.load(sys.stdin))
        print(f"{HASHES_MARK} {json.dumps(found)}", flush=True)
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        table = options(write_tiny_model(Path(scratch) / "tiny"))
    sys.stdout.write(module_text(table, hashed_environment(), vllm.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
