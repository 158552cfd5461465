"""The Warning events of a CompileCache's problems: one per problem while it stands, posted again when it comes back."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache_operator.controller.state import Emit, State, WarningEvent
from compilecache_operator.decisions import cache_status
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.model.conditions import shown_message

logger = logging.getLogger(__name__)


def post_warnings(state: State, body: Mapping[str, Any], current: Sequence[WarningEvent], emit: Emit | None) -> None:
    """Post the warnings of ``current`` that are new for this cache, and remember what stands."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    for warning in fresh_warnings(state.scheduler.warnings.get(key, frozenset()), current):
        emit_event(emit, body, "Warning", warning.reason, warning.message)
    if current:
        state.scheduler.warnings[key] = frozenset(current)
    else:
        state.scheduler.warnings.pop(key, None)


def emit_event(emit: Emit | None, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    if emit is not None:
        try:
            emit(body, type_, reason, shown_message(message))
        except Exception as exc:  # events are best effort; the log keeps what it said
            logger.warning("event %s not posted (%s): %s", reason, exc, message)


def fresh_warnings(standing: frozenset[WarningEvent], current: Sequence[WarningEvent]) -> list[WarningEvent]:
    """The warnings of ``current`` to post: those not already standing since an earlier reconcile
    (a problem is reconciled again until it passes; one event per problem, not one per pass). A
    problem that goes away and comes back is posted again."""
    return [w for w in dict.fromkeys(current) if w not in standing]


def failure_warning(failure: cache_status.Failure) -> WarningEvent:
    """A failure that keeps the cache from being served (InvalidSpec, SecretNotFound, SecretForbidden,
    SecretKeyMissing, NoGPUNodes) as a Warning event of the same reason."""
    return WarningEvent(failure.reason, failure.message)


def warmup_failed_warning(job: JobState, gpu: str) -> WarningEvent:
    """A failed warm-up Job (posted once, when the Job is counted)."""
    what = f"{job.reason}: {job.message}" if job.message else job.reason
    return WarningEvent("WarmupFailed", f"Job {job.name} ({gpu}) failed: {what}")
