"""The CompileCache's status (pure): the conditions Ready, Warming and Degraded from the plan, the
bundles and the Jobs (or from one failure), Precompiled from the bundles' checks, and the full status
the reconcile writes. The condition type and its merge rules are :mod:`compilecache_operator.model.conditions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachelib.in_image.masking import mask_url
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.model import conditions as cond


@dataclass(frozen=True)
class Failure:
    """Why the cache cannot be (fully) served: one reason for Ready and Degraded."""

    reason: str
    message: str
    until_changed: bool = False
    """Only a change of the cache's inputs can end it (the API server refuses a Job built from the spec as it
    is): trying again with the same inputs would only repeat the refusal."""


def failure_conditions(failure: Failure) -> list[cond.Condition]:
    return [
        cond.Condition(cond.READY, False, failure.reason, failure.message),
        cond.Condition(cond.WARMING, False, "Idle", "no warm-up running"),
        cond.Condition(cond.DEGRADED, True, failure.reason, failure.message),
    ]


def warmup_conditions(
    variants: Sequence[Variant],
    bundles: Sequence[BundleRecord],
    jobs: Mapping[str, JobState],
) -> list[cond.Condition]:
    """Ready, Warming and Degraded from the plan, the bundles and the Jobs of missing variants.

    Ready is True when every planned variant has a bundle, or when some have and the rest
    failed (reason PartiallyAvailable, Degraded True): pods are served where a bundle exists.
    """
    have = {b.variant for b in bundles}
    missing = [v for v in variants if v.id not in have]
    active = [(v, jobs[v.id]) for v in missing if v.id in jobs and jobs[v.id].phase == "active"]
    failed = [(v, jobs[v.id]) for v in missing if v.id in jobs and jobs[v.id].phase == "failed"]
    served = [v for v in variants if v.id in have]
    warming = _warming_condition(active, len(variants))
    degraded = _degraded_condition(failed)
    return [_ready_condition(served, bool(missing), warming, degraded), warming, degraded]


def _warming_condition(active: Sequence[tuple[Variant, JobState]], planned: int) -> cond.Condition:
    if not active:
        return cond.Condition(cond.WARMING, False, "Idle", "no warm-up running")
    text = "; ".join(f"{v.gpu_label}: job {j.name}: {j.message}" for v, j in active)
    return cond.Condition(cond.WARMING, True, "WarmupInProgress", f"warming {len(active)} of {planned}: {text}")


def _degraded_condition(failed: Sequence[tuple[Variant, JobState]]) -> cond.Condition:
    if not failed:
        return cond.Condition(cond.DEGRADED, False, "AsExpected", "no warm-up failed")
    reasons = {j.reason for _, j in failed}
    text = "; ".join(f"{v.gpu_label}: job {j.name} failed: {j.reason}: {j.message}" for v, j in failed)
    return cond.Condition(cond.DEGRADED, True, reasons.pop() if len(reasons) == 1 else "WarmupFailed", text)


def _ready_condition(
    served: Sequence[Variant], missing: bool, warming: cond.Condition, degraded: cond.Condition
) -> cond.Condition:
    """Ready from what is served and the other two conditions (a True one means Jobs run, or failed)."""
    gpus = ", ".join(v.gpu_label for v in served)
    if not missing:
        return cond.Condition(cond.READY, True, "BundlesAvailable", f"{len(served)} bundle(s): {gpus}")
    if warming.status:
        return cond.Condition(cond.READY, False, "WarmupInProgress", warming.message)
    if degraded.status and served:
        return cond.Condition(cond.READY, True, "PartiallyAvailable", f"bundles for {gpus}; {degraded.message}")
    if degraded.status:
        return cond.Condition(cond.READY, False, "WarmupFailed", degraded.message)
    return cond.Condition(cond.READY, False, "WarmupPending", "warm-up Jobs are being created")


PRECOMPILED = "Precompiled"
"""Condition type of caches with spec.model.precompile Auto: whether the current bundles carry a verified
precompiled part."""


def precompile_condition(bundles: Sequence[BundleRecord]) -> cond.Condition | None:
    """Precompiled from the warm-up checks of the current bundles; None before any was recorded."""
    checked = [b for b in bundles if b.precompile]
    if not checked:
        return None
    left_out = [b for b in checked if b.precompile != "Verified"]
    if not left_out:
        message = f"{len(checked)} bundle(s) carry a verified precompiled part"
        return cond.Condition(PRECOMPILED, True, "Verified", message)
    text = "; ".join(f"{b.gpu}: {b.precompile_reason or 'the check failed'}" for b in left_out)
    return cond.Condition(
        PRECOMPILED, False, "PrecompileUnverified",
        f"precompiled part left out of {len(left_out)} of {len(checked)} bundle(s) (they still serve the FX-graph "
        f"cache; pods compile with Dynamo as without Auto): {text}",
    )  # fmt: skip


def build_status(
    current: Mapping[str, Any] | None,
    *,
    generation: int,
    conditions: Sequence[cond.Condition],
    bundles: Sequence[BundleRecord] | None,
    planned_gpus: Sequence[str] | None,
    storage_url: str | None,
    now: str,
) -> dict[str, Any]:
    """The status the reconcile writes; ``bundles``/``planned_gpus``/``storage_url`` None keep the current values.
    ``coldStarts`` is not the reconcile's: it is left out, so that the merge patch keeps what the tally
    (:func:`compilecache_operator.handlers.count_cold_start`) wrote."""
    current = current or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": cond.merge_conditions(current.get("conditions"), conditions, generation=generation, now=now),
    }
    if bundles is not None:
        status["bundles"] = [b.to_status() for b in bundles]
        status["bundleCount"] = len(bundles)
    else:
        status["bundles"] = list(current.get("bundles") or [])
        status["bundleCount"] = len(status["bundles"])
    if planned_gpus is not None:
        status["plannedGPUs"] = ",".join(planned_gpus) if planned_gpus else ""
    elif "plannedGPUs" in current:
        status["plannedGPUs"] = current["plannedGPUs"]
    if storage_url is not None:
        status["storage"] = mask_url(storage_url)
    elif "storage" in current:
        status["storage"] = current["storage"]
    compact: dict[str, Any] = without_empty_strings(status)
    return compact


def without_empty_strings(value: Any) -> Any:
    """``value`` with every ``""`` field dropped. API servers up to 1.20 read an empty string in a
    merge patch of a custom resource as null and reject it, so status never carries one."""
    if isinstance(value, Mapping):
        return {k: without_empty_strings(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [without_empty_strings(v) for v in value]
    return value


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` changes anything (timestamps of unchanged conditions are kept by merge)."""
    return {k: (current or {}).get(k) for k in new} != dict(new)
