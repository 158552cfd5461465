"""What a shell user of the CLI gets: completion scripts that a real bash runs (commands, flags, the values of
flags with a fixed set, from the parser itself), `ls -o yaml` and `inspect -o yaml` (the same entries as `-o json`),
`--help` naming the exit statuses and every credential variable, and a `gc` that would delete every bundle refused
without `--yes` as a bare `gc` is."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cachelib import completion, yamltext
from cachelib.cli.parser import build_parser
from cachelib.publish import publish
from cachelib.stores import CREDENTIALS, open_store
from tests.cachelib.helpers import make_key, make_outdir, run_cli
from testsupport import unavailable

PARSER = build_parser()
COMMANDS = completion._subparsers(PARSER)


def complete(words: list[str], script: str) -> list[str]:
    """What bash offers for the last of ``words`` (``compilecache`` first), with the generated function."""
    line = " ".join(words)
    program = (f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
               f"COMP_LINE={line!r}; _compilecache; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


@pytest.fixture(scope="module")
def bash_script() -> str:
    proc = run_cli("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_bash_completes_each_command_and_its_flags(bash_script: str, command: str) -> None:
    assert command in complete(["compilecache", command[:2]], bash_script)
    flags = complete(["compilecache", command, "--"], bash_script)
    expected = {s for a in COMMANDS[command]._actions for s in a.option_strings if s.startswith("--")}
    assert set(flags) == expected
    for flag, values in completion._choices(COMMANDS[command]).items():
        assert complete(["compilecache", command, flag, ""], bash_script) == values


def test_bash_skips_a_global_flags_value_and_offers_output_formats(bash_script: str) -> None:
    assert complete(["compilecache", "--log-format", "json", "l"], bash_script) == ["load", "ls"]
    assert complete(["compilecache", "-v", "ls", "-o", ""], bash_script) == ["table", "wide", "json", "yaml"]
    assert complete(["compilecache", "completion", ""], bash_script) == ["bash", "zsh"]


def test_zsh_gets_the_same_function_under_bashcompinit(bash_script: str) -> None:
    proc = run_cli("completion", "zsh")
    assert proc.returncode == 0 and proc.stdout.startswith("#compdef compilecache\n")
    assert "bashcompinit" in proc.stdout and proc.stdout.endswith(bash_script)
    zsh = shutil.which("zsh")
    if zsh is None:  # scripts/test.sh installs it; CI never passes by skipping
        unavailable("no zsh on this machine to parse the script")
    assert subprocess.run([zsh, "-n"], input=proc.stdout, text=True, timeout=30).returncode == 0


def test_an_unknown_shell_is_a_bad_argument() -> None:
    proc = run_cli("completion", "fish")
    assert proc.returncode == 2 and "invalid choice: 'fish'" in proc.stderr


def test_help_names_the_exit_statuses_and_every_credential_variable() -> None:
    text = run_cli("--help").stdout
    for status in ("0", "1", "2", "130", "141"):
        assert f"\n  {status}  " in text or f"; {status}  " in text, status
    for credentials in CREDENTIALS.values():
        for credential in credentials:
            assert credential.env in text, credential.env
    assert "AWS_ENDPOINT_URL_S3" in text and "COMPILECACHE_STORE" in text


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'store'}"
    with open_store(url) as opened:
        for i, gpu in enumerate(("cpu", "nvidia-l4", "nvidia-h100")):
            publish(make_outdir(tmp_path / f"out{i}", make_key(gpu=gpu)), opened)
    return url


def test_ls_yaml_is_the_json_lines_as_one_list(store: str) -> None:
    lines = run_cli("ls", "--store", store, "-o", "json").stdout.splitlines()
    as_json = [json.loads(line) for line in lines]
    proc = run_cli("ls", "--store", store, "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    as_yaml = yaml.safe_load(proc.stdout)
    strip = [{k: v for k, v in e.items() if k != "age_seconds"} for e in as_json]
    assert [{k: v for k, v in e.items() if k != "age_seconds"} for e in as_yaml] == strip
    assert len(as_yaml) == 3


def test_inspect_yaml_is_the_json_header(store: str) -> None:
    key = json.loads(run_cli("ls", "--store", store, "-o", "json").stdout.splitlines()[0])["key"]
    as_json = run_cli("inspect", "--store", store, key, "--verify")
    as_yaml = run_cli("inspect", "--store", store, key, "--verify", "-o", "yaml")
    assert as_json.returncode == as_yaml.returncode == 0, as_json.stderr + as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
    assert json.loads(as_json.stdout)["key"] == key


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
@example([1e16, -2.5e-300, 0.1, "𐀀\x7f\"\\", {"on": "null", "": [{}]}])
@example([{"\u0300" * 200: {"k": ["\u0300" * 200]}}, {"\u0300" * 200: []}])  # keys past YAML's 1024 characters
def test_yaml_text_reads_back_as_the_value(value: object) -> None:
    assert yaml.safe_load(yamltext.dump(value)) == value


def test_gc_keep_zero_needs_yes_as_a_bare_gc_refuses(store: str) -> None:
    def count() -> int:
        return len(run_cli("ls", "--store", store, "-o", "json").stdout.splitlines())

    bare = run_cli("gc", "--store", store)
    assert bare.returncode == 2 and "refusing to delete everything" in bare.stderr
    dry = run_cli("gc", "--store", store, "--keep", "0", "--dry-run")  # deletes nothing: no --yes needed
    assert dry.returncode == 0, dry.stderr
    assert len(dry.stdout.splitlines()) == 3 and count() == 3
    refused = run_cli("gc", "--store", store, "--keep", "0")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--keep 0 without --older-than deletes every bundle" in refused.stderr and "--yes" in refused.stderr
    assert refused.stdout == "" and count() == 3
    aged = run_cli("gc", "--store", store, "--keep", "0", "--older-than", "1d")  # bounded by age: no --yes needed
    assert aged.returncode == 0 and count() == 3
    time.sleep(0.01)
    every = run_cli("gc", "--store", store, "--older-than", "0s")  # every bundle is older: the same guard
    assert every.returncode == 2 and "would empty the store (3 bundles)" in every.stderr
    assert "--yes" in every.stderr
    assert every.stdout == "" and count() == 3
    one = json.loads(run_cli("ls", "--store", store, "-o", "json").stdout.splitlines()[0])["key"]
    scoped = run_cli("gc", "--store", store, "--prefix", one, "--older-than", "0s")  # a retention job: no --yes
    assert scoped.returncode == 0 and count() == 2, scoped.stderr
    confirmed = run_cli("gc", "--store", store, "--keep", "0", "--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    assert count() == 0
