"""CompileCache objects, warm-up Jobs and operator states as a reconcile reads them, for the operator's unit tests."""

from __future__ import annotations

from typing import Any

from compilecache_operator.controller.state import Indexes, Settings, State
from compilecache_operator.decisions import warmup_job
from compilecache_operator.decisions.plan import job_name, plan_variants
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.names import GENERATION_LABEL, RECORDED_ANNOTATION, VARIANT_LABEL, WARMUP_LABEL
from compilecache_operator.model.spec import Defaults
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.samples import owner

SETTINGS = Settings(defaults=Defaults(), jobs=warmup_job.JobSettings(preloader_image="p"), retry_seconds=7)


def cache(generation: int = 3, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = owner(generation=generation, **spec)
    body["metadata"]["resourceVersion"] = "100"
    if status is not None:
        body["status"] = status
    return body


def variant_of(body: dict[str, Any], gpus: frozenset[str] = frozenset()) -> Any:
    spec = parse_spec(body["spec"], Defaults())
    return plan_variants("team-a", "mlp", spec, gpus)[0]


def job(body: dict[str, Any], *, phase: str, generation: int = 3, recorded: bool = False, uid: str = "job-uid",
        gpus: frozenset[str] = frozenset()) -> dict[str, Any]:
    variant = variant_of(body, gpus)
    conditions = {"succeeded": [{"type": "Complete", "status": "True"}],
                  "failed": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}.get(phase, [])
    return {
        "metadata": {
            "name": job_name("mlp", variant, generation), "namespace": "team-a", "uid": uid, "resourceVersion": "7",
            "labels": {WARMUP_LABEL: "mlp", VARIANT_LABEL: variant.id, GENERATION_LABEL: str(generation)},
            "annotations": {RECORDED_ANNOTATION: "succeeded"} if recorded else {},
            "ownerReferences": [{"kind": "CompileCache", "uid": "uid-1234", "name": "mlp"}],
        },
        "status": {"conditions": conditions},
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def state_with(body: dict[str, Any], jobs: tuple[dict[str, Any], ...] = ()) -> State:
    state = State(settings=SETTINGS, metrics=Metrics())
    state.cluster.indexes = Indexes(caches={("team-a", "mlp"): [body]}, jobs={"uid-1234": list(jobs)},
                            nodes={"nvidia.com/gpu.product": ["NVIDIA-L4"]})
    return state
