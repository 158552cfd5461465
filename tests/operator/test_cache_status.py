"""The CompileCache's status: conditions Ready, Warming, Degraded and Precompiled, and the status written."""

from __future__ import annotations

from typing import Any

from compilecache_operator.decisions.cache_status import (
    Failure,
    build_status,
    failure_conditions,
    precompile_condition,
    status_changed,
    warmup_conditions,
)
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.model.conditions import merge_conditions

VARIANTS = [Variant("aaaaaaaaaa", "", "img"), Variant("bbbbbbbbbb", "NVIDIA-L4", "img")]


def state(variant: str, phase: str, reason: str = "", message: str = "") -> JobState:
    return JobState(name=f"job-{variant[:2]}", variant=variant, generation=1, phase=phase,  # type: ignore[arg-type]
                    reason=reason, message=message)


def by_type(conds: list[Any]) -> dict[str, Any]:
    return {c.type: c for c in conds}


def test_conditions_ready_when_every_variant_has_a_bundle() -> None:
    bundles = [BundleRecord(variant=v.id, key="k" + v.id) for v in VARIANTS]
    c = by_type(warmup_conditions(VARIANTS, bundles, {}))
    assert (c["Ready"].status, c["Ready"].reason) == (True, "BundlesAvailable")
    assert not c["Warming"].status and not c["Degraded"].status


def test_conditions_while_warming_and_after_failures() -> None:
    one = [BundleRecord(variant="aaaaaaaaaa", key="k")]
    warming = by_type(warmup_conditions(VARIANTS, one, {"bbbbbbbbbb": state("bbbbbbbbbb", "active")}))
    assert (warming["Ready"].status, warming["Ready"].reason) == (False, "WarmupInProgress")
    assert warming["Warming"].status and "NVIDIA-L4" in warming["Warming"].message

    failed = {"bbbbbbbbbb": state("bbbbbbbbbb", "failed", "CompileFailed", "exit 1: boom")}
    partial = by_type(warmup_conditions(VARIANTS, one, failed))
    assert (partial["Ready"].status, partial["Ready"].reason) == (True, "PartiallyAvailable")
    assert (partial["Degraded"].status, partial["Degraded"].reason) == (True, "CompileFailed")
    assert "exit 1: boom" in partial["Degraded"].message

    none = by_type(warmup_conditions(VARIANTS, [], {
        "aaaaaaaaaa": state("aaaaaaaaaa", "failed", "PublishFailed", "store down"), **failed}))
    assert (none["Ready"].status, none["Ready"].reason) == (False, "WarmupFailed")
    assert none["Degraded"].reason == "WarmupFailed" and "store down" in none["Ready"].message


def test_merge_keeps_transition_time_until_the_status_changes() -> None:
    first = merge_conditions([], failure_conditions(Failure("InvalidSpec", "spec.image: x")),
                             generation=1, now="2025-01-01T00:00:00Z")
    again = merge_conditions(first, failure_conditions(Failure("SecretNotFound", "y")),
                             generation=2, now="2025-01-02T00:00:00Z")
    ready = {c["type"]: c for c in again}["Ready"]
    assert ready["lastTransitionTime"] == "2025-01-01T00:00:00Z" and ready["reason"] == "SecretNotFound"
    assert ready["observedGeneration"] == 2
    healed = merge_conditions(again, warmup_conditions(VARIANTS[:1], [BundleRecord("aaaaaaaaaa", "k")], {}),
                              generation=2, now="2025-01-03T00:00:00Z")
    assert {c["type"]: c for c in healed}["Ready"]["lastTransitionTime"] == "2025-01-03T00:00:00Z"
    assert [c["type"] for c in healed] == ["Ready", "Warming", "Degraded"]


def test_build_status_counts_bundles_and_masks_the_store_password() -> None:
    bundles = [BundleRecord(variant="aaaaaaaaaa", key="k", bytes=5)]
    status = build_status({}, generation=4, conditions=warmup_conditions(VARIANTS[:1], bundles, {}),
                          bundles=bundles, planned_gpus=["cpu"], storage_url="redis://:pw@r:6379/0",
                          now="2025-01-01T00:00:00Z")
    assert status["observedGeneration"] == 4 and status["bundleCount"] == 1
    assert status["bundles"][0]["bytes"] == 5 and status["plannedGPUs"] == "cpu"
    assert status["storage"] == "redis://***@r:6379/0"
    assert not status_changed(status, status)
    kept = build_status(status, generation=5, conditions=[], bundles=None, planned_gpus=None,
                        storage_url=None, now="2025-01-02T00:00:00Z")
    assert kept["bundles"] == status["bundles"] and kept["plannedGPUs"] == "cpu"
    assert status_changed(status, kept)


def test_status_never_carries_empty_strings() -> None:
    bundles = [BundleRecord(variant="aaaaaaaaaa", key="k", created="", job_id="")]
    status = build_status({}, generation=1, conditions=warmup_conditions(VARIANTS[:1], bundles, {}),
                          bundles=bundles, planned_gpus=[], storage_url=None, now="2025-01-01T00:00:00Z")
    assert "plannedGPUs" not in status
    assert "created" not in status["bundles"][0] and "jobId" not in status["bundles"][0]
    assert all(c["message"] for c in status["conditions"])


def test_the_precompiled_condition_names_each_left_out_bundle() -> None:
    verified = BundleRecord(variant="a", key="k1", gpu="NVIDIA-H100", precompile="Verified")
    left = BundleRecord(variant="b", key="k2", gpu="NVIDIA-L4", precompile="LeftOut",
                        precompile_reason="the precompiled entry failed to load: install_failed: TypeError: x")
    assert precompile_condition([BundleRecord(variant="c", key="k3")]) is None
    ok = precompile_condition([verified])
    assert ok is not None and ok.status and ok.reason == "Verified"
    bad = precompile_condition([verified, left])
    assert bad is not None and not bad.status and bad.reason == "PrecompileUnverified"
    assert "1 of 2" in bad.message and "NVIDIA-L4: the precompiled entry failed to load: install_failed" in bad.message
