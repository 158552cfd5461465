"""Warning events on the CompileCache: what is posted, and that a standing problem is posted once."""

from __future__ import annotations

from typing import Any

from compilecache_operator.controller import cache_warnings
from compilecache_operator.controller.state import Settings, State, WarningEvent
from compilecache_operator.decisions import cache_status
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.spec import Defaults

from tests.operator.samples import owner

Posted = list[tuple[str, str, str]]


def recorder() -> tuple[Posted, Any]:
    posted: Posted = []

    def emit(body: Any, type_: str, reason: str, message: str) -> None:
        posted.append((type_, reason, message))

    return posted, emit


def new_state() -> State:
    return State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics())


def test_failures_become_warnings_of_the_same_reason() -> None:
    for reason in ("InvalidSpec", "SecretNotFound", "SecretKeyMissing", "NoGPUNodes"):
        warning = cache_warnings.failure_warning(cache_status.Failure(reason, f"spec.x: {reason}"))
        assert warning == WarningEvent(reason, f"spec.x: {reason}")


def test_a_failed_warmup_names_the_job_the_gpu_and_the_failure() -> None:
    job = JobState(name="cc-mlp-0123456789-g3", variant="0123456789", generation=3, phase="failed",
                   reason="CompileFailed", message="container compile of pod p exited with code 1: boom")
    assert cache_warnings.warmup_failed_warning(job, "NVIDIA-L4") == WarningEvent(
        "WarmupFailed",
        "Job cc-mlp-0123456789-g3 (NVIDIA-L4) failed: CompileFailed: container compile of pod p exited with code 1: "
        "boom",
    )
    bare = JobState(name="j", variant="v", generation=1, phase="failed", reason="BackoffLimitExceeded")
    assert cache_warnings.warmup_failed_warning(bare, "cpu").message == "Job j (cpu) failed: BackoffLimitExceeded"


def test_only_new_problems_are_posted() -> None:
    a, b = WarningEvent("InvalidSpec", "spec.image: required"), WarningEvent("StorePruneFailed", "x")
    assert cache_warnings.fresh_warnings(frozenset(), [a, a]) == [a]
    assert cache_warnings.fresh_warnings(frozenset({a}), [a, b]) == [b]
    assert cache_warnings.fresh_warnings(frozenset({a, b}), []) == []


def test_a_standing_problem_is_posted_once_and_again_after_it_cleared() -> None:
    """The resync loop reconciles every minute: one Warning per problem, not one per minute."""
    state, body = new_state(), owner()
    posted, emit = recorder()
    invalid = WarningEvent("InvalidSpec", "spec.model.target: 'x y' is not module:function")
    for _ in range(3):
        cache_warnings.post_warnings(state, body, [invalid], emit)
    assert posted == [("Warning", "InvalidSpec", invalid.message)]
    fixed = WarningEvent("InvalidSpec", "spec.storage.url: required")
    cache_warnings.post_warnings(state, body, [fixed], emit)
    assert posted[-1] == ("Warning", "InvalidSpec", fixed.message), "a different problem is news"
    cache_warnings.post_warnings(state, body, [], emit)
    assert ("team-a", "mlp") not in state.scheduler.warnings
    cache_warnings.post_warnings(state, body, [fixed], emit)
    assert len(posted) == 3, "a problem that comes back is posted again"


def test_warnings_are_kept_per_cache() -> None:
    state = new_state()
    posted, emit = recorder()
    problem = WarningEvent("SecretNotFound", "spec.storage.secretRef.name: Secret 'creds' not found")
    cache_warnings.post_warnings(state, owner(name="a"), [problem], emit)
    cache_warnings.post_warnings(state, owner(name="b"), [problem], emit)
    assert len(posted) == 2


def test_a_failing_event_api_never_breaks_the_reconcile() -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("events are forbidden")

    state = new_state()
    pruning = WarningEvent("StorePruneFailed", "pruning failed: x")
    cache_warnings.post_warnings(state, owner(), [pruning], broken)
    assert state.scheduler.warnings[("team-a", "mlp")] == frozenset({pruning})
