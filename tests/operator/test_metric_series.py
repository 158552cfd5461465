"""Counter series made at 0 when their label values become known, so that ``increase()`` sees every first event."""

from __future__ import annotations

import json

from compilecache_operator.decisions.job_reports import parse_preload
from compilecache_operator.decisions.plan import BundleRecord
from compilecache_operator.edge.metrics import PRELOAD_OUTCOMES, UNKNOWN_GPU, WARMUP_RESULTS, Metrics, cache_gpus
from compilecache_operator.model import preload_reasons
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from cachelib.keyformat import gpu_slug
from tests.cachelib.helpers import make_key


def series(m: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(m.exposition().decode()) for s in family.samples
            if s.name == name}  # fmt: skip


def preload(namespace: str, cache: str, gpu: str, result: str, reason: str) -> tuple[tuple[str, str], ...]:
    labels = {"namespace": namespace, "cache": cache, "gpu": gpu, "result": result, "reason": reason}
    return tuple(sorted(labels.items()))


def test_a_known_cache_has_every_outcome_at_zero_per_gpu_and_nothing_more() -> None:
    m = Metrics()
    m.know_cache("ml", "mlp", ["cpu", "nvidia-l4"])
    made = series(m, "compilecache_preloads_total")
    expected = {preload("ml", "mlp", gpu, result, reason)
                for gpu in ("cpu", "nvidia-l4") for result, why in PRELOAD_OUTCOMES.items() for reason in why}
    skipped = preload_reasons.SKIPPED
    expected |= {preload("ml", "mlp", UNKNOWN_GPU, skipped, r) for r in PRELOAD_OUTCOMES[skipped]}
    assert set(made) == expected and set(made.values()) == {0.0}
    warmups = series(m, "compilecache_warmup_jobs_total")
    assert {dict(labels)["result"] for labels in warmups} == set(WARMUP_RESULTS) and set(warmups.values()) == {0.0}
    for name, results in (("compilecache_warmup_duration_seconds_count", set(WARMUP_RESULTS)),
                          ("compilecache_preload_duration_seconds_count",
                           set(preload_reasons.RESULTS) - {preload_reasons.SKIPPED})):
        durations = series(m, name)
        assert {dict(labels)["result"] for labels in durations} == results and set(durations.values()) == {0.0}

    # a GPU type seen later adds its own series; known ones are left as they are
    m.count_preload("ml", "mlp", gpu="cpu", result=preload_reasons.HIT, reason=preload_reasons.PRELOADED)
    m.know_cache("ml", "mlp", ["cpu", "nvidia-h100"])
    after = series(m, "compilecache_preloads_total")
    assert after[preload("ml", "mlp", "cpu", preload_reasons.HIT, preload_reasons.PRELOADED)] == 1.0
    per_gpu = sum(len(why) for why in PRELOAD_OUTCOMES.values())
    assert len(after) == len(made) + per_gpu


def test_the_outcomes_are_the_fixed_results_and_reasons() -> None:
    pairs = {(result, reason) for result, why in PRELOAD_OUTCOMES.items() for reason in why}
    assert {result for result, _ in pairs} == set(preload_reasons.RESULTS)
    assert {reason for _, reason in pairs} == set(preload_reasons.REASONS) - {preload_reasons.UNKNOWN_CACHE}


@given(result=st.sampled_from(preload_reasons.PRELOAD_RESULTS), text=st.text(max_size=40),
       prefix=st.sampled_from(["", "store unavailable: ", "deadline of 30 s passed ", "SignatureError: "]),
       source=st.sampled_from(["", "node-cache", "store"]), garbled=st.booleans())
def test_every_preload_the_operator_reads_is_counted_on_a_series_made_in_advance(
    result: str, text: str, prefix: str, source: str, garbled: bool
) -> None:
    message = json.dumps({"result": result, "reason": prefix + text, "source": source})
    outcome = parse_preload(message[:-1] if garbled else message)
    assert outcome.code in PRELOAD_OUTCOMES[outcome.result], outcome
    for annotation in (*preload_reasons.WEBHOOK_RESULTS, None, text):
        counted, reason = preload_reasons.not_injected(annotation)
        assert reason == preload_reasons.UNKNOWN_CACHE or reason in PRELOAD_OUTCOMES[counted], (annotation, counted)


def test_the_gpus_of_a_cache_are_its_bundles_and_the_nodes_gpu_types() -> None:
    l4 = make_key(gpu=gpu_slug("NVIDIA-L4"))
    status = {"bundles": [BundleRecord("a", str(l4), gpu="NVIDIA-L4").to_status(), {"key": ""}]}
    assert cache_gpus(status, ["NVIDIA-H100-80GB-HBM3", ""]) == {"nvidia-l4", "nvidia-h100-80gb-hbm3"}
    assert cache_gpus(None, []) == set()


def test_series_at_zero_cost_nothing_held_and_go_with_their_cache() -> None:
    """Thousands of CompileCaches: what is held per cache is what it knows (not a series object per label set);
    the exposition is the same as with every series made, and a deleted cache's zeros go (its counts stay)."""
    m = Metrics()
    for i in range(50):
        m.know_cache("ml", f"c{i}", ["cpu"])
    assert not next(iter(m.preloads.collect())).samples, "no series object made for a series at 0"
    exported = series(m, "compilecache_preloads_total")
    assert len(exported) == 50 * (sum(len(why) for why in PRELOAD_OUTCOMES.values()) + len(PRELOAD_OUTCOMES["skipped"]))
    created = series(m, "compilecache_preloads_created")
    assert created.keys() == exported.keys() and all(v > 0 for v in created.values())
    buckets = series(m, "compilecache_warmup_duration_seconds_bucket")
    assert {dict(labels)["le"] for labels in buckets} >= {"+Inf", "10.0"} and set(buckets.values()) == {0.0}

    m.count_preload("ml", "c0", gpu="cpu", result=preload_reasons.HIT, reason=preload_reasons.PRELOADED)
    m.forget_cache("ml", "c0")
    after = series(m, "compilecache_preloads_total")
    assert {labels for labels in after if dict(labels)["cache"] == "c0"} == {
        preload("ml", "c0", "cpu", preload_reasons.HIT, preload_reasons.PRELOADED)}
    assert len(after) == len(exported) - len(exported) // 50 + 1
