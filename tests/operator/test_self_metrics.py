"""The operator's metrics about itself: build info, process memory and CPU, handler durations and
errors (the webhook's latency apart), and a Ready gauge per CompileCache."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import kopf
import pytest
from compilecache_operator import handlers as registered  # noqa: F401 (Kopf's handlers register at import)
from compilecache_operator import lifecycle
from compilecache_operator.edge.metrics import WEBHOOK_HANDLER, Metrics, error_kind, instrumented
from compilecache_operator.model.names import WEBHOOK_ID
from prometheus_client.parser import text_string_to_metric_families

from tests.operator.reconcile_samples import cache, state_with


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = m.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return samples(m).get((name, tuple(sorted(labels.items()))))


def test_build_info_and_process_metrics() -> None:
    m = Metrics()
    found = samples(m)
    (info,) = [labels for name, labels in found if name == "compilecache_operator_build_info"]
    assert dict(info)["version"] and dict(info)["python_version"].count(".") == 2
    assert found[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in found and ("process_open_fds", ()) in found


def test_ready_gauge_follows_the_status_and_goes_with_the_cache() -> None:
    m = Metrics()
    m.observe_cache("ml", "llama", {"conditions": [{"type": "Ready", "status": "True"}]})
    m.observe_cache("ml", "gpt", {"conditions": [{"type": "Warming", "status": "True"},
                                                 {"type": "Ready", "status": "False"}]})  # fmt: skip
    m.observe_cache("ml", "new", None)
    assert value(m, "compilecache_cache_ready", namespace="ml", cache="llama") == 1
    assert value(m, "compilecache_cache_ready", namespace="ml", cache="gpt") == 0
    assert value(m, "compilecache_cache_ready", namespace="ml", cache="new") == 0
    m.forget_cache("ml", "gpt")
    assert value(m, "compilecache_cache_ready", namespace="ml", cache="gpt") is None


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (kopf.TemporaryError("wait", delay=1), "retry"),
        (kopf.PermanentError("no"), "permanent"),
        (ValueError("bug"), "unexpected"),
    ],
)
def test_errors_are_counted_by_kind(exc: Exception, kind: str) -> None:
    assert error_kind(exc) == kind
    m = Metrics()
    with pytest.raises(type(exc)), m.timed("reconcile"):
        raise exc
    assert value(m, "compilecache_handler_errors_total", handler="reconcile", error=kind) == 1
    assert value(m, "compilecache_handler_duration_seconds_count", handler="reconcile") == 1


def test_instrumented_handlers_take_the_metrics_from_the_memo() -> None:
    m = Metrics()
    memo = kopf.Memo(state=SimpleNamespace(metrics=m))

    @instrumented("reconcile")
    async def reconcile(memo: kopf.Memo, **_: object) -> str:
        return "done"

    @instrumented(WEBHOOK_HANDLER)
    async def webhook(memo: kopf.Memo, **_: object) -> None:
        raise RuntimeError("a bug")

    assert asyncio.run(reconcile(memo=memo)) == "done"
    with pytest.raises(RuntimeError):
        asyncio.run(webhook(memo=memo))
    assert value(m, "compilecache_handler_duration_seconds_count", handler="reconcile") == 1
    assert value(m, "compilecache_webhook_duration_seconds_count") == 1
    assert value(m, "compilecache_handler_duration_seconds_count", handler=WEBHOOK_HANDLER) is None
    assert value(m, "compilecache_handler_errors_total", handler=WEBHOOK_HANDLER, error="unexpected") == 1
    assert asyncio.run(reconcile(memo=kopf.Memo())) == "done"  # no metrics in the memo: it just runs


def test_the_operator_registers_its_handlers_instrumented() -> None:
    """Kopf runs only the pod handler (the reconciles are timed by their workers: tests/operator/test_watches.py)."""
    registry = kopf.get_default_registry()  # the handlers register at import, at module level
    wrapped = {h.id: getattr(h.fn, "__wrapped__", None) is not None
               for h in [*registry._changing.get_all_handlers(), *registry._watching.get_all_handlers()]}
    assert wrapped == {"count-preloads": True}, wrapped


def test_the_pod_webhooks_answer_is_timed_as_the_webhook() -> None:
    state = state_with(cache())
    answers = lifecycle.admission_answers(state, {})
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-1", "operation": "CREATE", "namespace": "team-a", "object": {"metadata": {}}}}
    assert asyncio.run(answers[WEBHOOK_ID](review))["response"]["allowed"] is True
    assert value(state.metrics, "compilecache_webhook_duration_seconds_count") == 1
