"""Reading what Jobs and pods report: termination messages and Job states (pure functions).

The publish container of a warm-up pod and the preload init container of an opted-in pod each
end with one JSON line in their termination message; this module turns those, and the Job and
pod statuses around them, into typed results with a reason a human can act on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from cachelib.keyformat import CacheKey, InvalidKey
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.model import preload_reasons
from compilecache_operator.model.names import (
    GENERATION_LABEL,
    PRELOAD_CONTAINER,
    RECORDED_ANNOTATION,
    SKIPPED_ANNOTATION,
    VARIANT_LABEL,
)

HARNESS_CONTAINER = "harness"
COMPILE_CONTAINER = "compile"
PUBLISH_CONTAINER = "publish"

_FAILURE_REASONS = {
    HARNESS_CONTAINER: "HarnessCopyFailed",
    COMPILE_CONTAINER: "CompileFailed",
    PUBLISH_CONTAINER: "PublishFailed",
}


class ResultError(ValueError):
    """A termination message that is not the expected JSON result."""


@dataclass(frozen=True)
class PreloadOutcome:
    """What the operator counts for one opted-in pod: its preload's result (``cachelib.preload.PreloadResult``
    as the termination message carried it), or why it got none."""

    result: str
    """hit, miss, error or skipped (:mod:`compilecache_operator.model.preload_reasons`)."""
    gpu: str = ""
    bytes: int = 0
    seconds: float = 0.0
    reason: str = ""
    """In words, as the preloader or the webhook said it."""
    code: str = ""
    """The reason as one of :data:`preload_reasons.REASONS` (a bounded metric label value)."""
    ran: bool = True
    """False for a pod the webhook did not give a preload container."""


@dataclass(frozen=True)
class JobState:
    name: str
    variant: str
    generation: int
    phase: Literal["active", "succeeded", "failed"]
    reason: str = ""
    message: str = ""
    recorded: bool = False
    duration: float | None = None


def parse_json_message(text: str | None) -> dict[str, Any]:
    """The last JSON object line of a termination message."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    raise ResultError(f"no JSON result in termination message {_tail(text or '', 200)!r}")


def bundle_from_publish(message: str | None, variant: Variant, *, generation: int, job: str) -> BundleRecord:
    """The status record of a bundle from the publish container's termination message."""
    data = parse_json_message(message)
    if data.get("result") not in (None, "published", "ok"):
        raise ResultError(f"publish reported {data.get('result')!r}: {data.get('reason', '')}")
    try:
        key = CacheKey.parse(str(data.get("key", "")))
    except InvalidKey as exc:
        raise ResultError(f"publish result has no valid key: {exc}") from None
    result = data.get("result_metadata") or data.get("metadata") or {}
    seconds = data.get("compile_seconds", result.get("compile_seconds") if isinstance(result, dict) else None)
    precompile, precompile_reason = precompile_verdict(data.get("precompile"))
    return BundleRecord(
        variant=variant.id,
        key=str(key),
        gpu=variant.gpu_label,
        capability=key.capability,
        torch=key.torch,
        triton=key.triton,
        cuda=key.cuda,
        python=key.py,
        image=variant.image,
        digest=str(data.get("sha256") or data.get("digest") or ""),
        bytes=_int(data.get("bytes", data.get("size"))),
        compile_seconds=round(_float(seconds), 3),
        created=str(data.get("created") or ""),
        generation=generation,
        job_id=str(data.get("job_id") or ""),
        job=job,
        bundle_digest=str(data.get("bundle_digest") or ""),
        precompile=precompile,
        precompile_reason=precompile_reason,
        bytecode_files=_int((data.get("bytecode") or {}).get("files") if isinstance(data.get("bytecode"), dict) else 0),
        **_engine(data.get("engine")),
    )


def _engine(engine: Any) -> dict[str, Any]:
    """A vLLM warm-up's version and (first) hash directory, from the publish result's ``engine``."""
    if not isinstance(engine, Mapping) or engine.get("name") != "vllm":
        return {}
    hashes = engine.get("aot_hashes") if isinstance(engine.get("aot_hashes"), list) else []
    return {"vllm_version": str(engine.get("version") or "")[:128], "vllm_hash": str(hashes[0] if hashes else "")[:128]}


PRECOMPILE_REASON_LIMIT = 1024


def precompile_verdict(reported: Any) -> tuple[str, str]:
    """``(Verified|LeftOut|"", reason)`` from the publish result's ``precompile`` (the warm-up's check)."""
    if not isinstance(reported, Mapping) or "verified" not in reported:
        return "", ""
    if reported.get("verified") is True:
        return "Verified", ""
    reason = (str(reported.get("reason") or "the warm-up's check failed").strip().splitlines() or [""])[0]
    return "LeftOut", reason[:PRECOMPILE_REASON_LIMIT]


def parse_preload(message: str | None) -> PreloadOutcome:
    """The preload container's result; anything unreadable counts as an error."""
    try:
        data = parse_json_message(message)
    except ResultError as exc:
        return PreloadOutcome(result=preload_reasons.ERROR, reason=str(exc), code=preload_reasons.RESULT_UNREADABLE)
    result = data.get("result")
    if result not in preload_reasons.PRELOAD_RESULTS:
        return PreloadOutcome(result=preload_reasons.ERROR, reason=f"unknown preload result {result!r}",
                             code=preload_reasons.RESULT_UNREADABLE)
    text = str(data.get("reason") or "")
    return PreloadOutcome(
        result=str(result),
        gpu=str(data.get("gpu") or _keys_gpu(data.get("hits") or data.get("keys") or [])),
        bytes=_int(data.get("bytes")),
        seconds=_float(data.get("seconds")),
        reason=text,
        code=preload_reasons.preload_reason(str(result), text, code=str(data.get("code") or ""),
                                    source=str(data.get("source") or "")),
    )


def _keys_gpu(keys: Sequence[Any]) -> str:
    """The GPU slug the preloaded keys share (``mixed`` when they differ, ``""`` without keys)."""
    gpus = set()
    for key in keys:
        try:
            gpus.add(CacheKey.parse(str(key)).gpu)
        except InvalidKey:
            continue
    if not gpus:
        return ""
    return gpus.pop() if len(gpus) == 1 else "mixed"


# -- Jobs -----------------------------------------------------------------------------------------
def job_condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond  # type: ignore[no-any-return]
    return None


def observe_job(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> JobState:
    """Where a warm-up Job stands, with the reason of a failure or of a wait."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = job.get("status") or {}
    state = JobState(
        name=str(meta.get("name", "")),
        variant=str(labels.get(VARIANT_LABEL, "")),
        generation=_int(labels.get(GENERATION_LABEL)),
        phase="active",
        reason="WarmupInProgress",
        recorded=RECORDED_ANNOTATION in annotations,
        duration=_seconds_between(status.get("startTime"), status.get("completionTime")),
    )
    if job_condition(job, "Complete"):
        return replace(state, phase="succeeded", reason="")
    failed = job_condition(job, "Failed")
    if failed:
        reason, message = describe_failure(failed, pods)
        duration = state.duration
        if duration is None:
            duration = _seconds_between(status.get("startTime"), failed.get("lastTransitionTime"))
        return replace(state, phase="failed", reason=reason, message=message, duration=duration)
    return replace(state, message=describe_wait(pods))


def describe_failure(failed: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(reason, message) of a failed Job: the failing container of its latest pod when there is one."""
    job_reason = str(failed.get("reason") or "JobFailed")
    job_message = str(failed.get("message") or "")
    if job_reason == "DeadlineExceeded":
        return "WarmupDeadlineExceeded", job_message or "the warm-up ran past spec.warmup.activeDeadlineSeconds"
    for pod in sorted(pods, key=_created, reverse=True):
        found = failing_container(pod)
        if found is not None:
            return found
    return job_reason, job_message or "the warm-up Job failed"


def failing_container(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    status = pod.get("status") or {}
    for entry in list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or []):
        name = str(entry.get("name", ""))
        for state_key in ("state", "lastState"):
            terminated = (entry.get(state_key) or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if code not in (None, 0):
                detail = _tail(str(terminated.get("message") or terminated.get("reason") or ""), 600)
                reason = _FAILURE_REASONS.get(name, "ContainerFailed")
                text = f"container {name} of pod {(pod.get('metadata') or {}).get('name', '')} exited with code {code}"
                return reason, f"{text}: {detail}" if detail else text
    if status.get("phase") == "Failed" and status.get("reason"):
        return str(status["reason"]), str(status.get("message") or "")
    return None


def describe_wait(pods: Sequence[Mapping[str, Any]]) -> str:
    """What the newest pod of an active Job waits for (scheduling, image pull, missing config)."""
    for pod in sorted(pods, key=_created, reverse=True):
        name = (pod.get("metadata") or {}).get("name", "")
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"pod {name} is not scheduled: {cond.get('message') or cond.get('reason', '')}"
        for entry in list(status.get("initContainerStatuses") or []) + list(status.get("containerStatuses") or []):
            waiting = (entry.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") not in (None, "PodInitializing", "ContainerCreating"):
                detail = waiting.get("message") or ""
                return f"pod {name}: container {entry.get('name')} waits: {waiting['reason']} {detail}".strip()
        return f"pod {name} is {status.get('phase', 'Pending')}"
    return "waiting for the Job's pod"


def publish_message(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The publish container's termination message from the Job's succeeded pod."""
    for pod in sorted(pods, key=_created, reverse=True):
        for entry in (pod.get("status") or {}).get("containerStatuses") or []:
            if entry.get("name") != PUBLISH_CONTAINER:
                continue
            terminated = (entry.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode") == 0:
                return str(terminated.get("message") or "")
    return None


def preload_termination(pod: Mapping[str, Any]) -> str | None:
    """The preload init container's termination message once it has terminated, else None."""
    for entry in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if entry.get("name") == PRELOAD_CONTAINER:
            state = (entry.get("state") or {}).get("terminated")
            terminated = state or (entry.get("lastState") or {}).get("terminated")
            if terminated:
                return str(terminated.get("message") or "")
    return None


# -- helpers -----------------------------------------------------------------------------------
def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _seconds_between(start: Any, end: Any) -> float | None:
    if not start or not end:
        return None
    try:
        a = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
        b = datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (b - a).total_seconds())


def _tail(text: str, limit: int) -> str:
    text = " ".join(text.strip().splitlines()[-5:]) if text.strip() else ""
    return text if len(text) <= limit else "…" + text[-limit:]


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def preload_outcome(pod: Mapping[str, Any], *, gpu_annotation: str) -> PreloadOutcome | None:
    """What to count for an opted-in pod: its preload result once the preload container has
    terminated (None before); for a pod without one, what the webhook's ``compilecache.io/skipped``
    annotation says (``skipped``, or ``miss`` for ``image-mismatch``; ``not-injected`` without it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    annotated_gpu = str(annotations.get(gpu_annotation) or "")
    init = (pod.get("spec") or {}).get("initContainers") or []
    if not any(c.get("name") == PRELOAD_CONTAINER for c in init):
        counted, code = preload_reasons.not_injected(annotations.get(SKIPPED_ANNOTATION))
        return PreloadOutcome(result=counted, gpu=annotated_gpu, code=code, ran=False)
    message = preload_termination(pod)
    if message is None:
        return None
    result = parse_preload(message)
    return replace(result, gpu=result.gpu or annotated_gpu)
