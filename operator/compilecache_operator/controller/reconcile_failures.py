"""What a reconcile that failed tells the CompileCache's owner: the object, the field and the reason (pure).

A reconcile's writes (a warm-up Job, a finalizer, the status, a Job's deletion) can fail: the API
server refuses an object (422), a write conflicts (409), the server does not answer. Each write
runs inside :func:`step`, which names what it was doing; :func:`failure_of` turns the error into
the :class:`~compilecache_operator.decisions.cache_status.Failure` the status and a Warning event show
(``Ready=False``), with the CompileCache fields behind the Job fields the API server names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from compilecache_operator.decisions.cache_status import Failure
from compilecache_operator.edge.kube import KubeError

JOB_REFUSED = "WarmupJobRefused"
"""The API server refused a warm-up Job built from the spec: a value it does not accept (fix the spec)."""
APPLY_FAILED = "ApplyFailed"
"""A write of the reconcile failed (conflict, timeout, server error): looked at again."""
RECONCILE_FAILED = "ReconcileFailed"
"""The reconcile failed before it wrote anything (reading what it decides from, or deciding)."""
REFUSED_STATUSES = frozenset({400, 403, 422})
REFUSED_FOR_GOOD = frozenset({400, 422})
"""A Job refused as malformed or invalid stays refused until the spec it is built from changes (403 is a quota or
a permission, which may pass)."""

# Where the Job's fields come from in the CompileCache (warmup_job.build_job), most specific first.
_JOB_FIELDS = (
    (r"spec\.template\.spec\.tolerations", "spec.warmup.tolerations"),
    (r"spec\.template\.spec\.nodeSelector", "spec.warmup.nodeSelector"),
    (r"spec\.template\.spec\.(?:init)?[cC]ontainers\[\d+\]\.resources", "spec.warmup.resources"),
    (r"spec\.template\.spec\.(?:init)?[cC]ontainers\[\d+\]\.image\b", "spec.image"),
    (r"spec\.template\.spec\.(?:init)?[cC]ontainers\[\d+\]\.env", "spec.warmup.env"),
    (r"spec\.template\.spec\.(?:init)?[cC]ontainers\[\d+\]\.volumeMounts", "spec.warmup.volumeMounts"),
    (r"spec\.template\.spec\.volumes", "spec.warmup.volumes"),
    (r"spec\.template\.spec\.serviceAccountName", "spec.warmup.serviceAccountName"),
    (r"spec\.template\.spec\.imagePullSecrets", "spec.warmup.imagePullSecrets"),
    (r"spec\.template\.spec\.securityContext", "spec.warmup.securityContext"),
    (r"spec\.activeDeadlineSeconds", "spec.warmup.activeDeadlineSeconds"),
    (r"spec\.backoffLimit", "spec.warmup.backoffLimit"),
)


class StepError(Exception):
    """A write of the reconcile failed; ``what`` says which (``creating warm-up Job mlp-...``)."""

    def __init__(self, what: str, cause: BaseException) -> None:
        self.what, self.cause = what, cause
        super().__init__(f"{what}: {describe(cause)}")


@contextmanager
def step(what: str) -> Iterator[None]:
    """Run one write; any error comes out as a :class:`StepError` naming ``what``."""
    try:
        yield
    except StepError:
        raise
    except Exception as exc:
        raise StepError(what, exc) from exc


def describe(exc: BaseException) -> str:
    """An error as one line: the API server's refusal (HTTP status, reason, message), else the exception."""
    if isinstance(exc, KubeError):
        if exc.status == 0:
            return f"the API server did not answer ({exc.detail})"
        return f"HTTP {exc.status}{f' {exc.reason}' if exc.reason else ''}: {exc.detail}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def cache_field(job_field: str) -> str | None:
    """The CompileCache field a warm-up Job's field comes from, or None."""
    for pattern, field in _JOB_FIELDS:
        if re.match(pattern, job_field):
            return field
    return None


def failure_of(exc: BaseException) -> Failure:
    """The condition's reason and message for a failed reconcile."""
    if not isinstance(exc, StepError):
        return Failure(RECONCILE_FAILED, f"reconcile failed: {describe(exc)}")
    cause = exc.cause
    if isinstance(cause, KubeError) and cause.status in REFUSED_STATUSES and exc.what.startswith("creating"):
        fields = sorted({f for f in (cache_field(field) for field, _ in cause.causes) if f})
        named = f"{', '.join(fields)}: " if fields else ""
        return Failure(JOB_REFUSED, f"{named}{exc.what} refused by the API server: {describe(cause)}",
                       until_changed=cause.status in REFUSED_FOR_GOOD)
    return Failure(APPLY_FAILED, f"{exc.what} failed: {describe(cause)}")


__all__ = ["APPLY_FAILED", "JOB_REFUSED", "RECONCILE_FAILED", "StepError", "cache_field", "describe", "failure_of",
           "step"]
