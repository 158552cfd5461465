"""The point of it all, on real CPU compiles: a fresh process that preloads the bundle of a warm-up
into an empty directory and compiles the same model with the same options HITS, by torch's counters."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cachelib.handoff import DONE_FILE_ENV, DONE_FILE_NAME
from cachelib.in_image import harness
from cachelib.unpack import RUNTIME_DIRS
from tests.cachelib.conftest import WARM_NAME, WARM_NAMESPACE, WARM_TARGET, Warmed
from tests.cachelib.helpers import ROOT, content, last_json, run_cli, tree

pytestmark = pytest.mark.slow


def compile_in_fresh_process(cache_dir: Path, out: Path) -> dict[str, int]:
    """The harness's own compile path, pointed at ``cache_dir``: torch's cache counters afterwards."""
    proc = subprocess.run(
        [sys.executable, harness.__file__, "--target", WARM_TARGET, "--out", str(out),
         "--namespace", WARM_NAMESPACE, "--name", WARM_NAME, "--cache-dir", str(cache_dir)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    cache: dict[str, int] = json.loads((out / "result.json").read_text())["cache"]
    return cache


def test_preloaded_process_hits_through_every_store(warmed: Warmed, store_url: str, tmp_path: Path) -> None:
    """Through every store the preload writes the warm-up's tree byte for byte at a new path; a fresh process compiles
    on it and hits. The compile runs once, on the file store's tree: the others are the same bytes."""
    published = run_cli("publish", str(warmed.out), "--store", store_url)
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["key"] == warmed.key

    cache_dir = tmp_path / "pod-cache"
    cache_dir.mkdir()  # the pod's emptyDir exists before the init container runs
    pre = run_cli("preload", "--store", store_url, "--cache", f"{WARM_NAMESPACE}/{WARM_NAME}",
                  "--target", str(cache_dir), "--torch", warmed.result["key"]["torch"], "--strict")  # fmt: skip
    assert pre.returncode == 0, pre.stderr
    result = last_json(pre.stdout)
    assert result["result"] == "hit" and result["keys"] == [warmed.key]

    expected = {k: v for k, v in tree(warmed.out / "cachedir").items() if not k.startswith("locks")}
    expected = {k: v for k, v in expected.items() if not k.endswith(".lock")}
    expected.update(dict.fromkeys(RUNTIME_DIRS, "dir"))  # what torch writes at run time, made writable
    assert content(cache_dir) == expected  # byte for byte, at a new path

    if not store_url.startswith("file:"):
        return
    counters = compile_in_fresh_process(cache_dir, tmp_path / "pod-out")
    assert counters["fxgraph_hit"] > 0 and counters["fxgraph_miss"] == 0, counters
    assert counters["aotautograd_hit"] > 0 and counters["aotautograd_miss"] == 0, counters


def test_load_feeds_the_megacache_to_torch(warmed: Warmed, tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("publish", str(warmed.out), "--store", store).returncode == 0
    cache_dir = tmp_path / "loaded"
    proc = run_cli("load", "--store", store, "--key", warmed.key, "--target", str(cache_dir))
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc.stdout)
    assert result["result"] == "hit" and result["mode"] == "load"
    assert result["unpacked_bytes"] == warmed.result["megacache"]["bytes"]
    assert any((cache_dir / "fxgraph").rglob("*")), "torch wrote no FX-graph entries"


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    """`compilecache demo`: cold warm-up, preload in a fresh process, warm compile, metrics."""
    proc = run_cli("demo", "--store", f"file://{tmp_path / 'store'}", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "hit: " in out and "warm start: every FX-graph lookup hit." in out
    warm_section = out.split("3/4")[1]
    assert "fxgraph hit 1 / miss 0, aotautograd hit 1 / miss 0" in warm_section.split("4/4")[0]
    assert 'compilecache_runtime_cache_events_total{cache="fxgraph",result="hit"} 1.0' in warm_section
    assert 'compilecache_runtime_cache_events_total{cache="fxgraph",result="miss"} 0.0' in warm_section
    # the floor and the ceiling beside cold and warm, each a figure from its own fresh process
    floor = {m[1]: float(m[2]) for m in re.finditer(r"^    first call, (.+?) +([0-9.]+) s", out, re.M)}
    assert set(floor) == {"eager", "cold compile", "node's hot cache", "warm start"}, floor
    assert floor["eager"] < floor["cold compile"] and floor["node's hot cache"] < floor["cold compile"], floor
    print(out)  # the figures, for the record (-s shows them)


WAITING_WORKLOAD = """
import json, sys
import torch  # the import a sidecar preload runs beside
from cachelib.handoff import wait_for_preload
waited = wait_for_preload(timeout=120)
print(json.dumps({"waited": waited, "torch_imported_first": "torch" in sys.modules}), flush=True)
from cachelib.in_image import harness
sys.exit(harness.main(sys.argv[1:]))
"""


def test_sidecar_preload_beside_the_workload_hits(warmed: Warmed, tmp_path: Path) -> None:
    """The sidecar mode on real compiles: the preloader and the workload start together; the
    workload imports torch, waits on the done file, then compiles and hits."""
    store = f"file://{tmp_path / 'store'}"
    assert run_cli("publish", str(warmed.out), "--store", store).returncode == 0
    cache_dir = tmp_path / "pod-cache"
    cache_dir.mkdir()
    done = cache_dir / DONE_FILE_NAME
    env = {**os.environ, DONE_FILE_ENV: str(done), "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
           "COMPILECACHE_TERMINATION_LOG": ""}  # fmt: skip
    out = tmp_path / "pod-out"
    workload = subprocess.Popen(
        [sys.executable, "-c", WAITING_WORKLOAD, "--target", WARM_TARGET, "--out", str(out),
         "--namespace", WARM_NAMESPACE, "--name", WARM_NAME, "--cache-dir", str(cache_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "cachelib.cli", "preload", "--store", store, "--key", warmed.key,
         "--target", str(cache_dir), "--sidecar"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        stdout, stderr = workload.communicate(timeout=600)
        assert workload.returncode == 0, stderr[-3000:]
        assert sidecar.poll() is None, "the sidecar left before the pod ended"
    finally:
        sidecar.send_signal(signal.SIGTERM)
        side_out, side_err = sidecar.communicate(timeout=60)
    assert sidecar.returncode == 0, side_err
    waited = json.loads(stdout.splitlines()[0])
    assert waited["waited"]["result"] == "hit" and waited["torch_imported_first"]
    assert last_json(side_out)["result"] == "hit"
    counters = json.loads((out / "result.json").read_text())["cache"]
    assert counters["fxgraph_hit"] > 0 and counters["fxgraph_miss"] == 0, counters
    assert counters["aotautograd_hit"] > 0 and counters["aotautograd_miss"] == 0, counters
