"""The point of it all, on real CPU compiles: a fresh process that preloads the bundle of a warm-up
into an empty directory and compiles the same model with the same options HITS, by torch's counters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cachelib import harness
from tests.cachelib.conftest import WARM_NAME, WARM_NAMESPACE, WARM_TARGET, Warmed
from tests.cachelib.helpers import last_json, run_cli, tree

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
    assert tree(cache_dir) == expected  # byte for byte, at a new path

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
    warm_section = out.split("3/3")[1]
    assert "fxgraph hit 1 / miss 0, aotautograd hit 1 / miss 0" in warm_section
    assert 'compilecache_runtime_cache_events_total{cache="fxgraph",result="hit"} 1.0' in warm_section
    assert 'compilecache_runtime_cache_events_total{cache="fxgraph",result="miss"} 0.0' in warm_section
    print(out)  # the figures, for the record (-s shows them)
