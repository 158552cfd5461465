"""The done file between a preloader running beside the workload and the workload's wait."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cachelib import handoff
from cachelib.handoff import DONE_FILE_ENV, DONE_FILE_NAME, read_done, wait_for_preload, write_done
from cachelib.publish import publish
from cachelib.runtime import TorchCompileCacheCollector
from tests.cachelib.helpers import ROOT, last_json, make_key, make_outdir, run_cli

KEY = make_key()


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'store'}"
    publish(make_outdir(tmp_path / "out", KEY, files={"fxgraph/a/entry": b"graph"}), url)
    return url


def test_write_then_read_round_trips_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = write_done(tmp_path / "cache" / DONE_FILE_NAME, {"result": "hit", "files": 3})
    assert read_done(path) == {"result": "hit", "files": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == [DONE_FILE_NAME]


def test_the_done_file_is_readable_by_every_uid(open_dir: Path) -> None:
    """The workload rarely runs as the preloader's uid: a done file only its writer can read would
    make wait_for_preload() fail with PermissionError (mkstemp creates files 0600)."""
    old_umask = os.umask(0o077)
    try:
        path = write_done(open_dir / DONE_FILE_NAME, {"result": "hit"})
    finally:
        os.umask(old_umask)
    assert path.stat().st_mode & 0o777 == 0o644
    if os.geteuid() == 0:
        code = f"from cachelib.handoff import read_done; print(read_done({str(path)!r})['result'])"
        proc = subprocess.run(["setpriv", "--reuid", "1000", "--regid", "1000", "--clear-groups", sys.executable,
                               "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
        assert proc.stdout.strip() == "hit", proc.stderr


def test_read_before_the_preload_finished_is_none(tmp_path: Path) -> None:
    assert read_done(tmp_path / DONE_FILE_NAME) is None


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"files": 3}'])
def test_a_file_that_is_not_a_result_reads_as_an_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / DONE_FILE_NAME
    path.write_text(text)
    result = read_done(path)
    assert result is not None and result["result"] == "error" and str(path) in result["reason"]


def test_no_done_file_configured_means_no_wait() -> None:
    assert wait_for_preload(env={}) is None


def test_wait_returns_the_result_once_it_is_written(tmp_path: Path) -> None:
    path = tmp_path / DONE_FILE_NAME
    timer = threading.Timer(0.2, write_done, args=(path, {"result": "miss", "reason": "not in the store"}))
    timer.start()
    started = time.monotonic()
    result = wait_for_preload(env={DONE_FILE_ENV: str(path)}, timeout=30)
    timer.join()
    assert result == {"result": "miss", "reason": "not in the store"}
    assert time.monotonic() - started >= 0.2
    assert handoff.last_wait is not None and handoff.last_wait.result == "miss"


def test_wait_gives_up_after_the_timeout_with_a_timeout_result(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    result = wait_for_preload(tmp_path / DONE_FILE_NAME, timeout=5, poll=1, clock=lambda: now[0], sleep=sleep)
    assert result is not None and result["result"] == "timeout"
    assert str(tmp_path / DONE_FILE_NAME) in result["reason"] and "5 s" in result["reason"]
    assert now[0] == 5


def test_the_wait_is_exported_as_a_metric() -> None:
    collector = TorchCompileCacheCollector(source=dict, waited=lambda: handoff.Waited("hit", 0.25))
    families = {f.name: f for f in collector.collect()}
    sample = families["compilecache_runtime_preload_wait_seconds"].samples[0]
    assert sample.labels == {"result": "hit"} and sample.value == 0.25
    nothing = TorchCompileCacheCollector(source=dict, waited=lambda: None)
    assert "compilecache_runtime_preload_wait_seconds" not in {f.name for f in nothing.collect()}


# -- the preloader's side ---------------------------------------------------------------------------
def test_preload_writes_the_done_file_with_its_result(store: str, tmp_path: Path) -> None:
    done = tmp_path / "done.json"
    proc = run_cli("preload", "--store", store, "--key", str(KEY), "--target", str(tmp_path / "t"),
                   "--done-file", str(done))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert read_done(done) == last_json(proc.stdout)
    assert last_json(proc.stdout)["result"] == "hit"


def test_a_failure_outside_the_fetch_still_writes_the_done_file(tmp_path: Path) -> None:
    """A store URL the preloader cannot even parse ends in an error result, not a waiting workload."""
    done = tmp_path / "done.json"
    proc = run_cli("preload", "--store", "ftp://nowhere", "--key", str(KEY), "--target", str(tmp_path / "t"),
                   "--done-file", str(done))  # fmt: skip
    result = read_done(done)
    assert result is not None and result["result"] in ("error", "miss"), (proc.stdout, proc.stderr)


def test_strict_cannot_be_a_sidecar(store: str, tmp_path: Path) -> None:
    proc = run_cli("preload", "--store", store, "--key", str(KEY), "--target", str(tmp_path / "t"),
                   "--sidecar", "--strict")  # fmt: skip
    assert proc.returncode == 2
    assert "--strict cannot be combined with --sidecar" in proc.stderr


@pytest.mark.parametrize(("cache", "expected"), [("team-a/llama", "hit"), ("team-a/nothing", "miss")])
def test_sidecar_stays_until_sigterm_then_exits_0(store: str, tmp_path: Path, cache: str, expected: str) -> None:
    """As a native sidecar: the done file (default path in the target), then running until SIGTERM."""
    target = tmp_path / "t"
    log = tmp_path / "termination-log"
    key_args = ["--key", str(KEY)] if expected == "hit" else ["--cache", cache]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cachelib.cli", "preload", "--store", store, *key_args, "--target", str(target),
         "--sidecar"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "COMPILECACHE_TERMINATION_LOG": str(log)},
    )  # fmt: skip
    try:
        result = wait_for_preload(target / DONE_FILE_NAME, timeout=60)
        assert result is not None and result["result"] == expected
        time.sleep(0.3)
        assert proc.poll() is None, "a sidecar that exits is restarted by the kubelet"
        assert json.loads(log.read_text())["result"] == expected  # there for the kubelet when it ends
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert last_json(out)["result"] == expected
