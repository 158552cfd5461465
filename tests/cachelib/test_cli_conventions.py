"""The command line behaves as users of kubectl and coreutils expect: exit status 2 for bad
arguments, an error for a store that is not there, quiet ends on a closed pipe, global flags
before or after the command, `ls -o wide|json`, a progress line that fits a 100-column terminal
(a real pseudo-terminal), and a demo that explains what a plain `pip install` lacks."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import textwrap
from pathlib import Path

import pytest

from cachelib.publish import pack, publish
from cachelib.stores import open_store
from tests.cachelib.helpers import ROOT, make_key, make_outdir, run_cli

KEY = make_key()


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'store'}"
    outdir = make_outdir(tmp_path / "out", KEY)
    result = json.loads((outdir / "result.json").read_text())
    result.update(target="cachelib.in_image.targets:tiny_mlp", options={"mode": "max-autotune", "backward": True})
    (outdir / "result.json").write_text(json.dumps(result))
    with open_store(url) as opened:
        publish(outdir, opened)
    return url


# -- exit statuses --------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["preload", "load", "ls", "gc"])
def test_a_malformed_cache_is_a_bad_argument(command: str, store: str, tmp_path: Path) -> None:
    extra = {"preload": ["--target", str(tmp_path / "t")], "load": [], "ls": [], "gc": ["--keep", "1"]}[command]
    proc = run_cli(command, "--store", store, "--cache", "nope", *extra)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "argument --cache: expected NAMESPACE/NAME, got 'nope'" in proc.stderr
    assert proc.stdout == ""  # no result line: nothing was attempted


@pytest.mark.parametrize("command", [["ls"], ["gc", "--keep", "1"]])
def test_a_missing_file_store_is_an_error(command: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    proc = run_cli(command[0], "--store", f"file://{missing}", *command[1:])
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"compilecache {command[0]}: error: file://{missing}: no such store (directory {missing} does not exist)"
    )
    assert not missing.exists()


def test_an_empty_file_store_lists_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = run_cli("ls", "--store", f"file://{tmp_path / 'empty'}")
    assert proc.returncode == 0 and "0 bundle(s)" in proc.stderr


def test_a_closed_pipe_ends_quietly(store: str, tmp_path: Path) -> None:
    """`compilecache inspect … | head` where head has already gone: no error, no traceback,
    the status of a command ended by SIGPIPE (141, as a shell reports it)."""
    bundle = tmp_path / "b.ccb"
    pack(make_outdir(tmp_path / "o2", KEY), bundle)
    for argv in (["inspect", str(bundle)], ["ls", "--store", store, "-o", "json"]):
        reader, writer = os.pipe()
        os.close(reader)  # the reader is gone before the first byte
        proc = subprocess.run(
            [sys.executable, "-m", "cachelib.cli", *argv],
            stdout=writer, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120, check=False,
        )  # fmt: skip
        os.close(writer)
        assert proc.returncode == 141, proc.stderr
        assert proc.stderr == ""


def test_global_flags_after_the_command(tmp_path: Path) -> None:
    missing = f"file://{tmp_path / 'missing'}"
    before = run_cli("--log-format", "json", "ls", "--store", missing)
    after = run_cli("ls", "--store", missing, "--log-format", "json")
    for proc in (before, after):
        assert proc.returncode == 1
        assert json.loads(proc.stderr)["level"] == "error"
    verbose = run_cli("ls", "--store", missing, "-v")
    assert "Traceback" in verbose.stderr
    assert "Traceback" not in run_cli("ls", "--store", missing).stderr


# -- warmup: every argument checked before anything compiles -----------------------------------------
@pytest.mark.parametrize(("args", "argument", "message"), [
    (["--store", "ftp://host/x"], "--store", "has scheme 'ftp'"),
    (["--store", "redis://:pa#hunter2@h"], "--store", "an '@' after the host"),
    (["--store", "s3://b"], "--store", "is not a valid S3 bucket name"),
    (["--name", "n" * 254], "argument --name", "not a Kubernetes object name"),
    (["--name", "a" * 201], "argument --name", "at most 200"),
    (["--name", "Bad_Name"], "argument --name", "not a Kubernetes object name"),
    (["--namespace", "team a"], "argument --namespace", "not a Kubernetes namespace name"),
    (["--level", "99"], "argument --level", "not a zstd level from 1 to 22"),
])
@pytest.mark.parametrize("model", [["--target", "tiny_mlp"], ["--command", "python -c pass"]])
def test_warmup_refuses_bad_arguments_before_the_harness_runs(
    model: list[str], args: list[str], argument: str, message: str, tmp_path: Path
) -> None:
    given = {"--name": "demo", "--store": f"file://{tmp_path / 'store'}"}
    given.update(dict(zip(args[::2], args[1::2], strict=True)))
    out = tmp_path / "out"
    proc = run_cli("warmup", *model, "--out", str(out), *(x for item in given.items() for x in item))
    assert proc.returncode == 2, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("compilecache")]
    assert line.startswith(f"compilecache warmup: error: {argument}"), line
    assert message in line and "hunter2" not in proc.stderr
    assert proc.stdout == "" and not out.exists(), "the harness never ran"


def test_a_malformed_trusted_key_is_a_bad_argument(store: str, tmp_path: Path) -> None:
    proc = run_cli("preload", "--store", store, "--cache", "team-a/mlp", "--target", str(tmp_path / "t"),
                   "--trusted-key", "not-a-key")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("compilecache preload: error: --trusted-key:")
    assert proc.stdout == "" and not (tmp_path / "t").exists()


def test_no_credential_in_errors_json_or_logs(tmp_path: Path) -> None:
    url = "redis://admin:hunter2@127.0.0.1:1/0?timeout=0.2&retries=0"
    for argv in (["ls", "--store", url], ["ls", "--store", url, "--log-format", "json", "-v"],
                 ["preload", "--store", url, "--cache", "team-a/mlp", "--target", str(tmp_path / "t")],
                 ["ls", "--store", url, f"--unknown={url}"]):
        proc = run_cli(*argv)
        assert proc.returncode != 0 or proc.stdout, proc
        assert "hunter2" not in proc.stdout + proc.stderr, argv
        assert "redis://***@127.0.0.1:1/0" in proc.stdout + proc.stderr, argv


# -- ls -o ---------------------------------------------------------------------------------------
def test_ls_wide_shows_the_target_and_mode(store: str) -> None:
    proc = run_cli("ls", "--store", store, "-o", "wide")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["CACHE", "TARGET", "MODE", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE", "AGE",
                              "KEY"]  # fmt: skip
    assert row.split()[:3] == ["team-a/llama", "tiny_mlp", "max-autotune+backward"]
    assert row.split()[-1] == str(KEY)


def test_ls_json_carries_the_target(store: str) -> None:
    for flags in (["-o", "json"], ["--json"]):
        proc = run_cli("ls", "--store", store, *flags)
        (line,) = proc.stdout.splitlines()
        entry = json.loads(line)
        assert entry["key"] == str(KEY) and entry["target"] == "cachelib.in_image.targets:tiny_mlp"
        assert entry["compile_options"] == {"mode": "max-autotune", "backward": True}


def test_ls_wide_names_a_bundle_it_cannot_read(store: str) -> None:
    root = Path(store.removeprefix("file://"))
    broken = make_key(name="broken")
    (root / str(broken)).parent.mkdir(parents=True)
    (root / str(broken)).write_bytes(b"not a bundle")
    wide = run_cli("ls", "--store", store, "-o", "wide")
    assert wide.returncode == 0
    (row,) = [line for line in wide.stdout.splitlines() if line.startswith("team-a/broken")]
    assert row.split()[1:3] == ["?", "?"]
    rows = [json.loads(line) for line in run_cli("ls", "--store", store, "-o", "json").stdout.splitlines()]
    (bad,) = [r for r in rows if r["name"] == "broken"]
    assert bad["target"] is None and "not a compilecache bundle" in bad["error"]


# -- progress on a real terminal --------------------------------------------------------------------
def run_in_terminal(argv: list[str], columns: int) -> tuple[int, str]:
    """Run ``argv`` with its stderr on a pseudo-terminal ``columns`` wide; its exit status and
    everything it drew there."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=follower, cwd=ROOT)
    os.close(follower)
    drawn = b""
    while True:
        ready = select.select([leader], [], [], 1.0)[0]
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    return proc.wait(timeout=60), drawn.decode()


def test_progress_fits_a_100_column_terminal(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    big = {"fxgraph/big": os.urandom(6 * 1024 * 1024)}
    with open_store(url) as opened:
        publish(make_outdir(tmp_path / "out", KEY, files=big), opened)
    argv = [sys.executable, "-m", "cachelib.cli", "preload", "--store", url, "--cache", "team-a/llama",
            "--target", str(tmp_path / "cache")]  # fmt: skip
    status, drawn = run_in_terminal(argv, columns=100)
    assert status == 0
    lines = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", piece) for piece in re.split(r"[\r\n]+", drawn)]
    bars = [line for line in lines if "[" in line and "ETA" in line]
    assert bars, drawn
    assert all(len(line) < 100 for line in lines), max(lines, key=len)
    assert all(line.startswith("get team-a/llama nvidia-h100-80gb-hbm3 [") for line in bars)
    assert str(KEY) not in drawn


# -- the demo after a plain pip install --------------------------------------------------------------
HIDE_MODULES = '''
"""Test-only: the modules named in $HIDE_MODULES are not installed, for this process and its
children (what a plain `pip install compilecache`, without extras, leaves out)."""
import importlib.abc, os, sys

class _Hide(importlib.abc.MetaPathFinder):
    hidden = set(filter(None, os.environ.get("HIDE_MODULES", "").split(",")))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hide())
'''


def without(modules: str, tmp_path: Path) -> dict[str, str]:
    """An environment in which ``modules`` (comma-separated) cannot be imported."""
    site = tmp_path / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(textwrap.dedent(HIDE_MODULES))
    return {"PYTHONPATH": str(site), "HIDE_MODULES": modules}


def test_demo_without_torch_says_what_to_install(tmp_path: Path) -> None:
    proc = run_cli("demo", "--store", f"file://{tmp_path / 'store'}", env=without("torch,prometheus_client", tmp_path))
    assert proc.returncode == 1
    assert "compilecache demo: error: the demo compiles a model on this machine's CPU and needs torch" in proc.stderr
    assert "pip install torch" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "store").exists()


def test_demo_without_prometheus_client_still_starts_warm(tmp_path: Path) -> None:
    env = without("prometheus_client", tmp_path)
    hidden = subprocess.run([sys.executable, "-c", "import prometheus_client"], env={**os.environ, **env},
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert "No module named 'prometheus_client'" in hidden.stderr  # the environment does hide it
    proc = run_cli("demo", "--store", f"file://{tmp_path / 'store'}", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warm start: every FX-graph lookup hit." in proc.stdout
    assert "not shown, prometheus_client is not installed" in proc.stdout
    assert "pip install 'compilecache[metrics]'" in proc.stdout


@pytest.mark.parametrize("url", ["ftp://host/x", "redis://:pa#hunter2@h", "s3://b", "file://relative"])
@pytest.mark.parametrize("command", [["ls"], ["gc", "--keep", "1"], ["inspect", "default/demo"]])
def test_a_store_url_that_names_no_store_is_a_bad_argument_for_every_command(command: list[str], url: str) -> None:
    """Exit status 2 with the URL's problem on stderr, whichever command reads the store, and no credential
    (preload and load instead fail open: exit 0 with result "error", unless --strict)."""
    proc = run_cli(*command, "--store", url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"compilecache {command[0]}: error: --store"), proc.stderr
    assert "hunter2" not in proc.stderr and proc.stdout == ""
