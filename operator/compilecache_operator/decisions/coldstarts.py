"""Why a CompileCache's pods started cold: their verdicts, tallied into status (pure functions).

A workload that calls ``cachelib.runtime.warm_start()`` decides, after each graph it compiles,
whether torch's caches had it and, when not, which factor differed from the warm-up
(:mod:`cachelib.verdict`). It writes that verdict as one JSON line,
``{"compilecache_why": {"result", "cause", "reason"}}``, into its container's termination-message
file, which the kubelet copies into the pod's status when the container ends. A vLLM pod's verdict comes
from the ``compilecache-vllm-watch`` sidecar (:mod:`cachelib.vllmwatch`), in the same words, as soon as vLLM
is up. The operator already reads pod statuses, so this needs no permission in the user's namespace beyond
what it has.

The tally lives in ``status.coldStarts``: pods with a verdict, pods that compiled afresh, and the
causes by pods (all of them, most frequent first: the set is bounded), each with one reason as an
example; and ``predictions``: what the admission predicted for those pods (``compilecache.io/predicted``)
against how they started, ``{"warm": {"warm": 9, "cold": 1}, "cold": {"cold": 2}}``.
When most pods with a verdict started cold for one cause, the ``ColdStarts`` condition is
True and names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachelib.in_image.masking import mask_text
from cachelib.prediction import COLD, OUTCOMES, WARM
from cachelib.verdict import CAUSES, WHY_KEY
from compilecache_operator.decisions.job_reports import ResultError, parse_json_message
from compilecache_operator.model.conditions import Condition
from compilecache_operator.model.names import PREDICTED_ANNOTATION, PREDICTED_DETAIL_ANNOTATION, VLLM_WATCH_CONTAINER

CONDITION = "ColdStarts"
MIN_PODS = 2
"""Pods with a verdict before the condition says a cause is the fleet's."""
MAX_REASON = 300


@dataclass(frozen=True)
class Verdict:
    """One pod's verdict as its workload reported it."""

    container: str
    result: str
    cause: str
    reason: str


def parse_verdict(message: str | None, container: str = "") -> Verdict | None:
    """The verdict in a termination message, None when it carries none. An unknown cause is
    counted as ``unknown`` (the label stays bounded); the reason is masked and clipped."""
    try:
        found = parse_json_message(message).get(WHY_KEY)
    except ResultError:  # no JSON line at all: the app's own message
        return None
    if not isinstance(found, Mapping):
        return None
    result = str(found.get("result") or "")
    if result not in ("hit", "miss"):
        return None
    cause = str(found.get("cause") or "unknown")
    cause = "none" if result == "hit" else cause if cause in CAUSES and cause != "none" else "unknown"
    reason = mask_text(" ".join(str(found.get("reason") or "").split()))[:MAX_REASON]
    return Verdict(container, result, cause, reason)


def pod_verdict(pod: Mapping[str, Any]) -> Verdict | None:
    """The verdict of the first app container of ``pod`` that ended with one (its latest run first), or of the
    ``compilecache-vllm-watch`` sidecar of a vLLM pod, which ends once when it has it (:mod:`cachelib.vllmwatch`)."""
    status = pod.get("status") or {}
    watchers = [e for e in status.get("initContainerStatuses") or [] if e.get("name") == VLLM_WATCH_CONTAINER]
    for entry in [*(status.get("containerStatuses") or []), *watchers]:
        for state_key in ("state", "lastState"):
            terminated = (entry.get(state_key) or {}).get("terminated") or {}
            verdict = parse_verdict(terminated.get("message"), str(entry.get("name") or ""))
            if verdict is not None:
                return verdict
    return None


def actual(verdict: Verdict) -> str:
    """How the pod started, in the prediction's words: ``warm`` (a hit) or ``cold``."""
    return WARM if verdict.result == "hit" else COLD


def pod_prediction(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """What the admission predicted for ``pod`` (its annotations): the outcome and its detail; None without one."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    predicted = str(annotations.get(PREDICTED_ANNOTATION) or "")
    if predicted not in OUTCOMES:
        return None
    return predicted, str(annotations.get(PREDICTED_DETAIL_ANNOTATION) or "")


def missed_prediction(pod: str, prediction: tuple[str, str] | None, verdict: Verdict) -> str | None:
    """The log line of a pod predicted warm that started cold (a factor the admission does not see, or a wrong
    prediction): both factor lists, the admission's and the verdict's; None for any other pair."""
    if prediction is None or prediction[0] != WARM or actual(verdict) != COLD:
        return None
    return (f"pod {pod} was predicted warm ({prediction[1] or 'no detail'}) but started cold: {verdict.cause}: "
            f"{verdict.reason or 'no reason given'}")  # fmt: skip


def tally(current: Mapping[str, Any] | None, verdict: Verdict, predicted: str | None = None) -> dict[str, Any]:
    """``status.coldStarts`` with one more pod's verdict counted (and, where the admission predicted it, the
    prediction against the verdict in ``predictions``)."""
    current = current or {}
    causes = {str(c.get("cause")): dict(c) for c in current.get("causes") or [] if isinstance(c, Mapping)}
    out: dict[str, Any] = {
        "pods": int(current.get("pods") or 0) + 1,
        "cold": int(current.get("cold") or 0) + (verdict.result == "miss"),
    }
    if verdict.result == "miss":
        entry = causes.setdefault(verdict.cause, {"cause": verdict.cause, "pods": 0})
        entry["pods"] = int(entry.get("pods") or 0) + 1
        entry["example"] = verdict.reason or entry.get("example", "")
    ranked = sorted(causes.values(), key=lambda c: (-int(c["pods"]), CAUSES.index(c["cause"])
                                                    if c["cause"] in CAUSES else len(CAUSES)))  # fmt: skip
    out["causes"] = ranked  # every cause (a bounded set: cachelib.in_image.factors.CAUSES), so a count is never lost
    predictions = {str(k): dict(v) for k, v in (current.get("predictions") or {}).items()
                   if k in OUTCOMES and isinstance(v, Mapping)}  # fmt: skip
    if predicted in OUTCOMES:
        entry = predictions.setdefault(str(predicted), {})
        entry[actual(verdict)] = int(entry.get(actual(verdict)) or 0) + 1
    if predictions:
        out["predictions"] = predictions
    return out


def condition(cold: Mapping[str, Any] | None) -> Condition | None:
    """``ColdStarts``: True when most pods with a verdict started cold for one cause; None before
    :data:`MIN_PODS` pods reported."""
    cold = cold or {}
    pods = int(cold.get("pods") or 0)
    if pods < MIN_PODS:
        return None
    causes: Sequence[Mapping[str, Any]] = cold.get("causes") or []
    top = causes[0] if causes else None
    if top is not None and int(top["pods"]) * 2 > pods:
        return Condition(
            CONDITION, True, "MostPodsCold",
            f"{top['pods']} of {pods} pods compiled afresh for one cause, {top['cause']}: {top.get('example', '')}",
        )  # fmt: skip
    return Condition(CONDITION, False, "NoCommonCause", f"{int(cold.get('cold') or 0)} of {pods} pods compiled afresh")
