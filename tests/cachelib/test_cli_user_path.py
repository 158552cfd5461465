"""The command line on a new user's path: nothing compiles before the store is known to take the bundle, a
compile is never thrown away, long stages say they are alive, an interrupt says what it left where, and a
preload that finds nothing says why (no such store, no permission, other GPU types)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachelib.in_image.stagelog import Stages, heartbeat_seconds, progress_line
from cachelib.publish import publish
from tests.cachelib.helpers import ROOT, last_json, make_key, make_outdir, run_cli
from testsupport.servers import free_port
from testsupport.wait import wait_for

QUICK = "python -c \"import os; open(os.path.join(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'e'), 'w').close()\""
"""A --command warm-up that compiles nothing: the tests of the command line need no compile."""


def error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if ": error: " in line]
    return line


# -- the store checked before anything compiles ---------------------------------------------------------------
@pytest.mark.parametrize("model", [["--target", "tiny_mlp"], ["--command", QUICK]])
def test_warmup_refuses_a_store_that_does_not_answer_before_anything_compiles(model: list[str], tmp_path: Path) -> None:
    down = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    out = tmp_path / "out"
    proc = run_cli("warmup", *model, "--name", "demo", "--store", down, "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert line.startswith("compilecache warmup: error: --store: ") and line.endswith("nothing was compiled"), line
    assert "127.0.0.1" in line and "hunter2" not in proc.stderr
    assert "harness:" not in proc.stderr and not out.exists(), "the harness never ran"


def test_warmup_refuses_a_file_store_it_cannot_create(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    proc = run_cli("warmup", "--command", QUICK, "--name", "demo", "--store", f"file://{tmp_path / 'a-file' / 'store'}")
    assert proc.returncode == 1, proc.stderr
    assert f"{tmp_path / 'a-file'} is not a directory; nothing was compiled" in error_line(proc.stderr)
    assert "harness:" not in proc.stderr


def test_demo_refuses_a_misspelt_store_url_at_once(tmp_path: Path) -> None:
    """exit 2 like warmup, before the demo's compile (and without a traceback)."""
    proc = run_cli("demo", "--store", f"fiel://{tmp_path}/store")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert error_line(proc.stderr).startswith("compilecache demo: error: --store: ")
    assert "1/4" not in proc.stdout and "Traceback" not in proc.stderr
    down = run_cli("demo", "--store", f"redis://127.0.0.1:{free_port()}/0")
    assert down.returncode == 1, down.stdout + down.stderr
    assert error_line(down.stderr).endswith("; nothing was compiled") and "1/4" not in down.stdout


# -- a failed publish keeps the compile ---------------------------------------------------------------------------
def test_a_failed_publish_keeps_the_output_and_prints_the_command_that_publishes_it(tmp_path: Path) -> None:
    """The store passes the check, then goes away during the warm-up (its directory replaced by a file): the
    output is kept, and the printed command publishes it once the store is back."""
    root = tmp_path / "store"
    root.mkdir()
    breaks_the_store = f"python -c \"import os; os.rmdir('{root}'); open('{root}', 'w').close()\""
    proc = run_cli("warmup", "--command", breaks_the_store, "--name", "cmd", "--store", f"file://{root}")
    assert proc.returncode == 1, proc.stderr
    line = error_line(proc.stderr)
    assert line.startswith("compilecache warmup: error: publishing failed: StoreError: "), line
    kept, command = line.split("the compiled output is kept in ", 1)[1].split(": publish it with: ")
    try:
        assert Path(kept, "result.json").is_file() and Path(kept, "cachedir").is_dir()
        assert command == f"compilecache publish {kept} --store file://{root}"
        root.unlink()
        root.mkdir()
        again = run_cli(*shlex.split(command)[1:])
        assert again.returncode == 0, again.stderr
        assert last_json(again.stdout)["key"].startswith("cc1/default/cmd/")
    finally:
        with contextlib.suppress(OSError):
            import shutil

            shutil.rmtree(Path(kept).parent)


# -- --out and --force ------------------------------------------------------------------------------------
def test_out_is_refused_when_full_and_replaced_with_force(tmp_path: Path) -> None:
    store, out = f"file://{tmp_path / 'store'}", tmp_path / "out"
    first = run_cli("warmup", "--command", QUICK, "--name", "cmd", "--store", store, "--out", str(out))
    assert first.returncode == 0, first.stderr
    again = run_cli("warmup", "--command", QUICK, "--name", "cmd", "--store", store, "--out", str(out))
    assert again.returncode == 2
    assert error_line(again.stderr).endswith("exists and is not an empty directory (--force replaces it)")
    forced = run_cli("warmup", "--command", QUICK, "--name", "cmd", "--store", store, "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (out / "result.json").is_file()


def test_force_never_removes_a_directory_that_is_not_a_warm_up_output(tmp_path: Path) -> None:
    out = tmp_path / "home"
    (out / "cachedir").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    proc = run_cli("warmup", "--command", QUICK, "--name", "cmd", "--store", f"file://{tmp_path / 's'}",
                   "--out", str(out), "--force")  # fmt: skip
    assert proc.returncode == 2
    assert "--force replaces a warm-up's output directory only, and this one also holds 'notes.txt'" in proc.stderr
    assert (out / "notes.txt").read_text() == "mine"


# -- progress ---------------------------------------------------------------------------------------------
def test_a_warm_up_says_its_stages_and_a_heartbeat_as_plain_lines_in_a_log(tmp_path: Path) -> None:
    """stderr is not a terminal (a Job's log): one plain line per stage and per heartbeat."""
    slow = 'python -c "import time; time.sleep(2.5)"'
    proc = run_cli("warmup", "--command", slow, "--name", "cmd", "--store", f"file://{tmp_path / 'store'}",
                   env={"COMPILECACHE_PROGRESS_SECONDS": "0.5"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "\r" not in proc.stderr
    said = [line.split("] ", 1)[1] for line in lines if "s] " in line]
    assert said[0].startswith("checking the store file://")
    assert "running the command (python) with the cache environment" in said
    assert any(s.startswith("still running the command (python) with the cache environment (") for s in said), said
    assert said[-1].startswith("packing, verifying and publishing to file://"), said


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_heartbeat_redraws_one_line() -> None:
    stream = _Terminal()
    stages = Stages("harness", stream=stream, every=0.05)
    stages.stage("compiling and running entry 1 of 1 (GPT2Model)")
    wait_for(lambda: "still compiling" in stream.getvalue(), 10, "a heartbeat")
    stages.done("done")
    text = stream.getvalue()
    assert "\r\033[Kharness: [" in text and "still compiling and running entry 1 of 1 (GPT2Model) (" in text
    assert text.endswith("] done\n")
    assert text.count("\n") == 2, repr(text)  # the stage line and the last one: heartbeats redraw in place


def test_progress_line_and_heartbeat_period() -> None:
    assert progress_line("harness", 42.4, "saving the Mega-Cache") == "harness: [   42s] saving the Mega-Cache"
    assert heartbeat_seconds({}) == 15
    assert heartbeat_seconds({"COMPILECACHE_PROGRESS_SECONDS": "2.5"}) == 2.5
    assert heartbeat_seconds({"COMPILECACHE_PROGRESS_SECONDS": "0"}) == 0
    assert heartbeat_seconds({"COMPILECACHE_PROGRESS_SECONDS": "soon"}) == 15


# -- --command: the harness's own Python, its factors --------------------------------------------------------
def test_python_in_a_command_is_the_harness_s_interpreter_and_its_factors_are_recorded(tmp_path: Path) -> None:
    """With the venv off PATH, `python` in --command is still the interpreter that runs the harness (and whose
    versions it records); what the harness can record of a command (the process's factors) is in the cache."""
    where = "import os, sys; open(os.path.join(os.environ['TORCHINDUCTOR_CACHE_DIR'], 'py'), 'w').write(sys.executable)"
    out = tmp_path / "out"
    proc = run_cli("warmup", "--command", f'python -c "{where}"', "--name", "cmd", "--store",
                   f"file://{tmp_path / 'store'}", "--out", str(out), env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out / "cachedir" / "py").read_text() == sys.executable
    recorded = json.loads((out / "cachedir" / "compilecache-factors.json").read_text())
    assert recorded["recorded"] is False and "--command" in recorded["problem"]
    assert recorded["process"]["python_version:version"] and recorded["process"]["torch_version:version"]
    why = run_cli("why", str(out / "cachedir"))
    assert why.returncode == 0, why.stderr
    assert "its graphs were not recorded: a --command warm-up compiles in the command's own process" in why.stdout


# -- SIGINT -------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def cli_process(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``compilecache ARGS`` running, its stderr lines collected as they come."""
    proc = subprocess.Popen([sys.executable, "-m", "cachelib.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **(env or {})})  # fmt: skip
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        reader.join(10)


def test_an_interrupted_warm_up_says_what_it_left_where(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with cli_process("warmup", "--command", 'python -c "import time; time.sleep(120)"', "--name", "cmd",
                     "--store", f"file://{tmp_path / 'store'}", "--out", str(out)) as (proc, lines):  # fmt: skip
        wait_for(lambda: any("running the command" in line for line in lines), 120, "the command running")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    last = [line.rstrip("\n") for line in lines if line.strip()][-1]
    assert last == (f"compilecache warmup: interrupted: nothing was published; the harness's incomplete output "
                    f"is in {out} (--force replaces it)"), lines  # fmt: skip
    assert not (tmp_path / "store").exists()


@contextlib.contextmanager
def frozen_server() -> Iterator[tuple[int, threading.Event]]:
    """A TCP server that accepts and never answers (a frozen Redis); the event is set once it accepted."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])
                accepted.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("deadline", ["30", "0"])
def test_an_interrupted_preload_says_what_the_target_holds(tmp_path: Path, deadline: str) -> None:
    target = tmp_path / "inductor"
    with frozen_server() as (port, accepted), cli_process(
        "preload", "--store", f"redis://127.0.0.1:{port}/0", "--cache", "ml/llama", "--target", str(target),
        "--deadline", deadline,
    ) as (proc, lines):  # fmt: skip
        assert accepted.wait(60), "the preload connected"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    said = [line.rstrip("\n") for line in lines if line.startswith("compilecache preload: ")]
    assert said == [f"compilecache preload: interrupted: nothing was installed into {target}, and nothing "
                    "partial was left there"], lines  # fmt: skip


# -- preload: a miss that is really something else says so ------------------------------------------------------
def test_a_file_store_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "sotre"
    proc = run_cli("preload", "--store", f"file://{missing}", "--cache", "ml/llama", "--target", str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    assert result["result"] == "miss"
    assert result["reason"] == f"no such store: file://{missing} (the directory {missing} does not exist)"


def test_a_gpu_the_store_has_no_bundle_for_names_the_gpus_it_has(tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    for index, gpu in enumerate(("nvidia-a100-sxm4-80gb", "nvidia-l4")):
        publish(make_outdir(tmp_path / f"o{index}", make_key(gpu=gpu)), store)
    proc = run_cli("preload", "--store", store, "--cache", "team-a/llama", "--gpu", "H100", "--target",
                   str(tmp_path / "t"))  # fmt: skip
    result = last_json(proc.stdout)
    assert result["result"] == "miss"
    assert result["reason"].endswith("(2 in the store); the store has this cache for gpu nvidia-a100-sxm4-80gb, "
                                     "nvidia-l4")


def test_a_target_the_preload_may_not_write_is_named(open_dir: Path, tmp_path: Path) -> None:
    """As another uid, into a directory it may not write: an error that says so, with the path, before any
    fetch (not a lock file's FileNotFoundError)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    store = f"file://{open_dir / 'store'}"
    publish(make_outdir(tmp_path / "o", make_key()), store)
    locked = open_dir / "locked"
    locked.mkdir(mode=0o755)
    target = locked / "inductor"
    proc = subprocess.run(
        ["setpriv", "--reuid", "65532", "--regid", "65532", "--clear-groups", sys.executable, "-m", "cachelib.cli",
         "preload", "--store", store, "--cache", "team-a/llama", "--target", str(target)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    assert result["result"] == "error" and result["bytes"] == 0, result
    assert result["reason"] == f"no permission: uid 65532 may not write {target} (its parent {locked} is not writable)"
