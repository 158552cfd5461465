"""The vLLM pod's verdict (cachelib.vllmwatch): the judgement over the cache directory, pure, with every outcome;
the watch over a real directory that a stand-in for vLLM writes into as vLLM does (what vLLM itself writes is
checked with vLLM in tests/vllm), a real listening socket, inotify, and the sidecar's one exit then its wait."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cachelib import vllmwatch
from cachelib.in_image.vllmwarm import MANIFEST_NAME
from cachelib.verdict import WHY_NAME

HASH = "af3b457dfc4178e215d23e1ede1d451d7a05af0a7e2d03bad797ff25d16d6ae8"
OTHER = "5e900c96ea00" + "0" * 52
ARTIFACT = f"vllm/torch_compile_cache/torch_aot_compile/{HASH}/rank_0_0/model"
KERNEL = f"vllm/torch_compile_cache/torch_aot_compile/{HASH}/inductor_cache/ab/kernel.so"
MANIFEST = {"format": 1, "vllm": "0.32.0", "aot_hashes": [HASH], "hashes": [],
            "artifacts": [{"path": ARTIFACT, "sha256": "0" * 64, "size": 3}]}  # fmt: skip
PREDICTION = [{"factor": "--max-model-len", "before": "8192", "after": "4096", "kind": "argument"}]


def tree(*hashes: str, artifact: tuple[int, float] = (3, 1.0), files: tuple[str, ...] = (KERNEL,)) -> vllmwatch.Tree:
    return vllmwatch.Tree(frozenset(hashes or (HASH,)), frozenset(), {ARTIFACT: artifact}, frozenset(files))


BEFORE = tree()


@pytest.mark.parametrize(
    ("now", "opened", "ready", "prediction", "expected"),
    [
        (tree(HASH, OTHER), None, False, PREDICTION, ("miss", "engine_argument", "--max-model-len 8192 → 4096")),
        (tree(HASH, OTHER), None, False, [{**PREDICTION[0], "kind": "env", "factor": "VLLM_X"}],
         ("miss", "env", "env VLLM_X: 8192 → 4096")),
        (tree(HASH, OTHER), None, True, [], ("miss", "unknown", "no argument or VLLM_* variable")),
        (tree(artifact=(4, 2.0)), True, False, [], ("miss", "artifact_load", "could not load its compiled artifact")),
        (tree(), True, False, [], None),
        (tree(), True, True, [], ("hit", "none", "loaded its compiled artifact")),
        (tree(), None, True, [], ("hit", "none", "loaded its compiled artifact")),
        (tree(), False, True, PREDICTION, ("miss", "engine_argument", "did not open")),
    ],
)  # fmt: skip
def test_the_judgement(now: vllmwatch.Tree, opened: bool | None, ready: bool, prediction: list[dict[str, str]],
                       expected: tuple[str, str, str] | None) -> None:  # fmt: skip
    found = vllmwatch.judge(MANIFEST, BEFORE, now, opened=opened, ready=ready, prediction=prediction)
    if expected is None:
        assert found is None
        return
    assert found is not None and (found.result, found.cause) == expected[:2] and expected[2] in found.reason, found


def test_an_artifact_that_could_not_load_says_whether_the_kernels_hit() -> None:
    rewritten = vllmwatch.judge(MANIFEST, BEFORE, tree(artifact=(4, 2.0)), opened=True, ready=False)
    assert rewritten is not None and "compiled no kernel afresh" in rewritten.reason
    again = vllmwatch.judge(MANIFEST, BEFORE, tree(artifact=(4, 2.0), files=(KERNEL, KERNEL + "2.so")), opened=True,
                            ready=False)  # fmt: skip
    assert again is not None and "compiled 1 kernels" in again.reason and again.details["kernels_compiled"] == 1


def test_without_aot_a_hit_is_no_graph_saved_afresh() -> None:
    manifest = {**MANIFEST, "aot_hashes": [], "artifacts": []}
    empty = vllmwatch.Tree(inductor_files=frozenset({"fxgraph/a/b"}))
    assert vllmwatch.judge(manifest, empty, empty, opened=None, ready=True).result == "hit"  # type: ignore[union-attr]
    more = vllmwatch.Tree(inductor_files=frozenset({"fxgraph/a/b", "fxgraph/c/d", "ab/k.so"}))
    missed = vllmwatch.judge(manifest, empty, more, opened=None, ready=True, prediction=PREDICTION)
    assert missed is not None and (missed.result, missed.cause) == ("miss", "engine_argument")
    assert "1 graphs and 1 kernels" in missed.reason


def test_without_a_bundle_the_verdict_names_the_preload() -> None:
    found = vllmwatch.judge(None, BEFORE, BEFORE, opened=None, ready=True, preload={"result": "miss", "reason": "x"})
    assert found is not None and (found.result, found.cause) == ("miss", "unknown") and "(miss: x)" in found.reason


# -- the tree as vLLM leaves it -------------------------------------------------------------------------------------
def lay_out(cache: Path) -> None:
    (cache / ARTIFACT).parent.mkdir(parents=True)
    (cache / ARTIFACT).write_bytes(b"abc")
    (cache / KERNEL).parent.mkdir(parents=True)
    (cache / KERNEL).write_bytes(b"so")
    (cache / "vllm/modelinfos").mkdir()
    (cache / "vllm/modelinfos/qwen.json").write_text("{}")
    (cache / f"vllm/torch_compile_cache/torch_aot_compile/{HASH}/inductor_cache/locks").mkdir()
    (cache / "fxgraph/aa").mkdir(parents=True)
    (cache / "fxgraph/aa/entry").write_bytes(b"g")
    (cache / MANIFEST_NAME).write_text(json.dumps(MANIFEST))


def test_observe_reads_hashes_artifacts_and_inductors_files(tmp_path: Path) -> None:
    lay_out(tmp_path)
    seen = vllmwatch.observe(tmp_path)
    assert seen.aot_hashes == {HASH} and set(seen.artifacts) == {ARTIFACT}
    assert seen.inductor_files == {KERNEL, "fxgraph/aa/entry"}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        yield server


def test_listening_reads_this_network_namespaces_sockets(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    assert not vllmwatch.listening(port)
    listener.listen()
    assert vllmwatch.listening(port)


def test_inotify_sees_a_file_opened(tmp_path: Path) -> None:
    path = tmp_path / "model"
    path.write_bytes(b"x")
    opened = vllmwatch.Opened([path])
    try:
        assert opened.poll() is False
        path.read_bytes()
        assert opened.poll() is True
    finally:
        opened.close()


class FakeVllm:
    """Writes into the cache directory what vLLM writes, then starts listening."""

    def __init__(self, cache: Path, behaviour: str) -> None:
        self.cache, self.behaviour = cache, behaviour
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]

    def run(self) -> None:
        time.sleep(0.3)
        if self.behaviour == "other key":
            (self.cache / f"vllm/torch_compile_cache/torch_aot_compile/{OTHER}/rank_0_0").mkdir(parents=True)
        else:
            (self.cache / ARTIFACT).read_bytes()
        if self.behaviour == "reload failed":
            time.sleep(0.1)
            (self.cache / ARTIFACT).write_bytes(b"abcd")
        time.sleep(0.3)
        self.server.listen()


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [("loaded", ("hit", "none")), ("reload failed", ("miss", "artifact_load")),
     ("other key", ("miss", "engine_argument"))],
)  # fmt: skip
def test_the_watch_over_a_directory_vllm_writes_into(tmp_path: Path, behaviour: str, expected: tuple[str, str]) -> None:
    lay_out(tmp_path)
    vllm = FakeVllm(tmp_path, behaviour)
    thread = threading.Thread(target=vllm.run)
    thread.start()
    try:
        found = vllmwatch.watch(vllmwatch.Watch(tmp_path, vllm.port, PREDICTION, deadline=20, poll=0.05))
    finally:
        thread.join()
        vllm.server.close()
    assert found is not None and (found.result, found.cause) == expected, found


def test_the_sidecar_says_it_once_then_waits_for_the_pods_end(tmp_path: Path) -> None:
    lay_out(tmp_path)
    vllm = FakeVllm(tmp_path, "loaded")
    log = tmp_path / "termination-log"
    env = {**os.environ, "COMPILECACHE_TERMINATION_LOG": str(log)}
    command = [sys.executable, "-m", "cachelib.cli", "vllm-watch", "--cache-dir", str(tmp_path), "--port",
               str(vllm.port)]  # fmt: skip
    watcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the sidecar starts before vLLM does
    vllm.run()
    try:
        stdout, _ = watcher.communicate(timeout=60)
        first = subprocess.CompletedProcess(command, watcher.returncode, stdout)
        assert watcher.returncode == 0
    finally:
        if watcher.poll() is None:
            watcher.kill()
    said: dict[str, Any] = json.loads(log.read_text())["compilecache_why"]
    assert said["result"] == "hit" and json.loads(first.stdout)["compilecache_why"]["result"] == "hit"
    assert json.loads((tmp_path / WHY_NAME).read_text())["delivered"] is True
    log.unlink()
    second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(second.stdout.readline())["compilecache_why"]["result"] == "hit"  # type: ignore[union-attr]
        time.sleep(0.5)
        assert second.poll() is None, "the second run waits for the pod's end"
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    finally:
        if second.poll() is None:
            second.kill()
    assert json.loads(log.read_text())["compilecache_why"]["reason"] == said["reason"]
    vllm.server.close()


# -- compilecache why of a vLLM cache --------------------------------------------------------------------------------
WARMUP_START = {"launcher": ["vllm", "serve"], "model": "Qwen/Qwen3-8B",
                "options": {"--max-model-len": "8192", "--max-num-seqs": "64"}, "env": {}, "unread": []}  # fmt: skip


def test_why_and_ls_of_a_vllm_cache_directory_and_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cachelib import publish
    from cachelib.cli import main

    out = tmp_path / "out"
    lay_out(out / "cachedir")
    (out / "cachedir" / MANIFEST_NAME).write_text(json.dumps({**MANIFEST, "invocation": WARMUP_START}))
    (out / "cachedir" / WHY_NAME).write_text(json.dumps({"result": "miss", "cause": "artifact_load", "reason": "r"}))
    (out / "megacache.bin").write_bytes(b"")
    fields = {"namespace": "ml", "name": "q", "model": "0" * 16, "options": "1" * 16, "gpu": "cpu", "capability": "cpu",
              "torch": "2.13.0", "triton": "none", "cuda": "none", "py": "3.11"}  # fmt: skip
    engine = {"name": "vllm", "version": "0.32.0", "model": "Qwen/Qwen3-8B", "aot_hashes": [HASH]}
    (out / "result.json").write_text(json.dumps({"key": fields, "versions": {"torch": "2.13.0", "vllm": "0.32.0"},
                                                 "engine": engine}))  # fmt: skip
    assert main(["why", str(out / "cachedir"), "--vllm", "vllm serve Qwen/Qwen3-8B --max-model-len 4096 "
                 "--max-num-seqs 64 --port 9000"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("vLLM warm-up: vLLM 0.32.0, model Qwen/Qwen3-8B, --max-model-len 8192")
    assert "this start against the warm-up: engine_argument" in lines and "  --max-model-len 8192 → 4096" in lines
    assert lines[-1] == "the pod's verdict (compilecache-why.json): miss (artifact_load): r"
    publish.pack(out, tmp_path / "q.ccb")
    assert main(["why", str(tmp_path / "q.ccb"), "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hashes"] == [HASH] and report["warmup"]["model"] == "Qwen/Qwen3-8B" and report["pod"] is None
    assert main(["why", str(tmp_path), "--vllm", "vllm serve x"]) == 1  # a directory without a vLLM manifest
    assert "--vllm needs a vLLM cache" in capsys.readouterr().err
    publish.publish(tmp_path / "q.ccb", f"file://{tmp_path / 'store'}")
    assert main(["ls", "--store", f"file://{tmp_path / 'store'}", "-o", "wide"]) == 0
    listed = capsys.readouterr().out
    assert "vllm: Qwen/Qwen3-8B" in listed and "vllm 0.32.0" in listed, listed
