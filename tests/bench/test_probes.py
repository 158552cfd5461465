"""The benchmark probes' pure parts: which samples run in which order, with which environment,
and how their records are summarised. (The probes themselves time real GPU processes.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import cache_dir_probe, warm_pool_probe


def test_warm_pool_plan_interleaves_warm_pairs_then_cold_pairs() -> None:
    order = warm_pool_probe.plan(rounds=2, cold_rounds=1)
    assert [(name, cold) for name, _, cold in order] == [
        ("hot", False),
        ("hot-no-warm-pool", False),
        ("hot", False),
        ("hot-no-warm-pool", False),
        ("cold", True),
        ("cold-no-warm-pool", True),
    ]
    envs = {name: env for name, env, _ in order}
    assert envs["hot"] is None and envs["cold"] is None
    assert envs["hot-no-warm-pool"] == envs["cold-no-warm-pool"] == {"TORCH_WARM_POOL": "0"}


def test_warm_pool_summary_groups_by_sample_name_and_reports_misses() -> None:
    hit = {"inductor": {"fxgraph_cache_hit": 1}, "aot_autograd": {"autograd_cache_hit": 1}}
    miss = {"inductor": {"fxgraph_cache_miss": 1}, "aot_autograd": {"autograd_cache_hit": 1}}
    records = [
        {"name": "hot-0", "ok": True, "first_call_s": 2.0, "counters": hit},
        {"name": "hot-no-warm-pool-1", "ok": True, "first_call_s": 3.0, "counters": miss},
        {"name": "hot-2", "ok": True, "first_call_s": 4.0, "counters": hit},
        {"name": "hot-no-warm-pool-3", "ok": False, "first_call_s": 5.0, "counters": {}},
    ]
    out = warm_pool_probe.summary(records)
    assert list(out) == ["hot", "hot-no-warm-pool"]
    assert out["hot"]["first_call_s"] == {"median": 3.0, "all": [2.0, 4.0]}
    assert out["hot"]["ok"] is True and out["hot"]["cache"] == ["hit", "hit"]
    assert out["hot-no-warm-pool"]["cache"] == ["MISS (1 miss, 1 hit)", "no lookups"]
    assert out["hot-no-warm-pool"]["ok"] is False
    assert "wrap_s" not in out["hot"]  # a measure no record has is left out, not zero


@pytest.mark.parametrize(
    ("sample", "job_id", "source"),
    [
        ("hot", False, "local"),
        ("local-copy", False, "local"),
        ("hot+job-id", True, "local"),
        ("preloaded-again", True, "preloaded"),
        ("preloaded-copy", True, "preloaded"),
        ("preloaded-no-job-id", False, "preloaded"),
    ],
)
def test_cache_dir_probe_samples(sample: str, job_id: bool, source: str) -> None:
    assert sample in cache_dir_probe.SAMPLES
    assert cache_dir_probe.uses_job_id(sample) is job_id
    assert cache_dir_probe.source_dir(sample) == source


def test_cache_dir_probe_rejects_an_unknown_sample_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cache_dir_probe.main(["--work", str(tmp_path), "--model", "gpt2", "--samples", "hot,bogus"])
    assert "unknown bogus" in capsys.readouterr().err


def test_probes_refuse_a_work_directory_without_the_benchmark_s_output(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="local: missing"):
        warm_pool_probe.main(["--work", str(tmp_path), "--model", "gpt2"])
    with pytest.raises(SystemExit, match="missing"):
        cache_dir_probe.main(["--work", str(tmp_path), "--model", "gpt2", "--samples", "hot"])
