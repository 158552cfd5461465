"""The prediction's surfaces in the operator: the bundle's record of its warm-up's variables (from the Job), the
admission's warning, annotation and count, ``spec.preload.onPredictedCold`` (Warn admits, Deny refuses with the
same text, an error in the webhook still admits), and the check against the pod's verdict."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import Any

import kopf
import pytest
from compilecache_operator.admission import webhook
from compilecache_operator.controller.reconcile import read_result, with_warmup_env
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions import coldstarts
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.handlers import count_cold_start
from compilecache_operator.lifecycle import CountedPods
from compilecache_operator.model import names
from compilecache_operator.model.spec import ON_PREDICTED_COLD, Defaults, InvalidSpec

from cachelib.verdict import WHY_KEY
from tests.operator.admission_samples import patched, review
from tests.operator.samples import job_for, parsed, pod, view
from testsupport.servers import free_port

AUTOTUNE = (("TORCHINDUCTOR_MAX_AUTOTUNE", "1"),)
COLD_WARNING = "compilecache: this pod will compile: env TORCHINDUCTOR_MAX_AUTOTUNE: 1 → 0"


def new_state(api: KubeAPI | None = None) -> State:
    return State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics(),
                 api=api)  # fmt: skip


def autotune_pod(value: str = "0", **spec: Any) -> dict[str, Any]:
    return pod(containers=[{"name": "app", "image": "registry.example/workload:1", "command": ["python", "app.py"],
                            "env": [{"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "value": value}]}], **spec)  # fmt: skip


def views(on_predicted_cold: str = "Warn") -> dict[tuple[str, str], list[Any]]:
    return {("team-a", "mlp"): [view(warmup_env=AUTOTUNE, preload={"onPredictedCold": on_predicted_cold})]}


def predictions(metrics: Metrics, outcome: str, cause: str) -> float | None:
    return metrics.registry.get_sample_value(
        "compilecache_admission_predictions_total",
        {"namespace": "team-a", "cache": "mlp", "prediction": outcome, "cause": cause},
    )


# -- the record ------------------------------------------------------------------------------------------------------
def test_the_bundle_records_the_key_factor_variables_its_job_ran_with() -> None:
    job = job_for(warmup={"env": [{"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "value": "1"},
                                  {"name": "HF_HOME", "value": "/tmp/hf"},
                                  {"name": "OMP_NUM_THREADS", "valueFrom": {"configMapKeyRef": {
                                      "name": "tuning", "key": "threads"}}}]})  # fmt: skip
    record = with_warmup_env(BundleRecord(variant="v", key="k"), job)
    entry = record.to_status()
    assert entry["warmupEnv"] == {"values": {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}, "fromElsewhere": ["OMP_NUM_THREADS"]}
    assert "TRITON_HOME" not in entry["warmupEnv"]["values"], "the Job's scratch directory enters no key"
    assert BundleRecord.from_status(entry) == record
    assert "warmupEnv" not in BundleRecord(variant="v", key="k").to_status(), "an old record stays as it was"


def test_the_record_of_a_succeeded_job_carries_its_variables() -> None:
    job = job_for(warmup={"env": [{"name": "OMP_NUM_THREADS", "value": "4"}]})
    job["metadata"]["uid"] = "job-uid"
    key = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/cpu/cpu/torch-2.13.0/triton-none/cuda-none/py-3.11.7"
    publish = {"name": "publish", "state": {"terminated": {"exitCode": 0, "message": json.dumps({"key": key})}}}
    pods = {"job-uid": [{"metadata": {"creationTimestamp": "2025-01-01T00:00:00Z"},
                         "status": {"containerStatuses": [publish]}}]}  # fmt: skip
    state = JobState(name=job["metadata"]["name"], variant="0123456789", generation=3, phase="succeeded")
    record = read_result(job, state, Variant(id="0123456789", gpu="", image="registry.example/workload:1"), pods)
    assert isinstance(record, BundleRecord) and record.warmup_env == (("OMP_NUM_THREADS", "4"),)


# -- the admission ----------------------------------------------------------------------------------------------------
def test_warn_admits_a_pod_predicted_cold_with_the_warning_the_annotation_and_the_count() -> None:
    state = new_state()
    answer = webhook.review_pod(state, views(), review(autotune_pod()))
    response = answer["response"]
    assert response["allowed"] is True and response["warnings"] == [COLD_WARNING]
    annotations = patched(autotune_pod(), answer)["metadata"]["annotations"]
    assert annotations[names.PREDICTED_ANNOTATION] == "cold"
    assert annotations[names.PREDICTED_DETAIL_ANNOTATION] == "env TORCHINDUCTOR_MAX_AUTOTUNE: 1 → 0"
    assert predictions(state.metrics, "cold", "env") == 1.0
    dry = review(autotune_pod())
    dry["request"]["dryRun"] = True
    webhook.review_pod(state, views(), dry)
    assert predictions(state.metrics, "cold", "env") == 1.0, "a dry run is not counted"


def test_deny_refuses_a_pod_predicted_cold_with_the_same_text() -> None:
    answer = webhook.review_pod(new_state(), views("Deny"), review(autotune_pod()))
    response = answer["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": COLD_WARNING}


def test_deny_refuses_a_pod_of_another_image_with_its_skip_warning() -> None:
    other = pod(containers=[{"name": "app", "image": "registry.example/workload:2", "command": ["python", "a.py"]}])
    response = webhook.review_pod(new_state(), views("Deny"), review(other))["response"]
    assert response["allowed"] is False
    assert response["status"]["message"] == response["warnings"][0]
    assert "image-mismatch" in response["status"]["message"]


@pytest.mark.parametrize(
    ("shape", "outcome"),
    [
        (autotune_pod("1"), "warm"),
        (pod(containers=[{"name": "app", "image": "registry.example/workload:1", "command": ["python"],
                          "envFrom": [{"configMapRef": {"name": "tuning"}}],
                          "env": [{"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "value": "1"}]}]), "unknown"),
    ],
    ids=["warm", "unknown"],
)  # fmt: skip
def test_deny_admits_every_pod_not_predicted_cold(shape: dict[str, Any], outcome: str) -> None:
    answer = webhook.review_pod(new_state(), views("Deny"), review(shape))
    assert answer["response"]["allowed"] is True
    assert patched(shape, answer)["metadata"]["annotations"][names.PREDICTED_ANNOTATION] == outcome


def test_a_webhook_error_is_never_a_refusal() -> None:
    broken = autotune_pod()
    broken["spec"]["containers"] = "not a list"
    answer = webhook.review_pod(new_state(), views("Deny"), review(broken))
    assert answer["response"] == {"uid": "u-1", "allowed": True}


def test_a_bad_on_predicted_cold_names_the_field_and_the_values() -> None:
    with pytest.raises(InvalidSpec) as raised:
        parsed(preload={"onPredictedCold": "Refuse"})
    errors = {e.path: e.message for e in raised.value.errors}
    assert errors == {"spec.preload.onPredictedCold": "'Refuse' is not one of Warn, Deny"}
    assert parsed().preload.on_predicted_cold == "Warn"


def test_the_crd_offers_the_values_the_spec_reads() -> None:
    from tests.chart.crd_files import CRD_FILES, load_crd

    for path in CRD_FILES:
        crd = load_crd(path)
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert schema["preload"]["properties"]["onPredictedCold"]["enum"] == list(ON_PREDICTED_COLD)


# -- checked against the verdict -----------------------------------------------------------------------------------
def ended(predicted: str, result: str, cause: str, reason: str) -> dict[str, Any]:
    message = json.dumps({WHY_KEY: {"result": result, "cause": cause, "reason": reason}})
    return {
        "metadata": {"labels": {names.CACHE_LABEL: "mlp"}, "annotations": {
            names.PREDICTED_ANNOTATION: predicted,
            names.PREDICTED_DETAIL_ANNOTATION: "every key factor matches the warm-up (image, env OMP_NUM_THREADS)"}},
        "status": {"containerStatuses": [
            {"name": "app", "state": {"terminated": {"exitCode": 0, "message": message}}}]},
    }  # fmt: skip


def test_each_verdict_counts_its_prediction_and_a_wrong_warm_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The API server here is a loopback port nothing listens on: the counts come before the status write."""
    state = new_state(KubeAPI(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"), timeout=5))
    missed = ended("warm", "miss", "inductor_config", "inductor config max_autotune: False → True")

    async def events() -> None:
        try:
            await count_cold_start(state, CountedPods(), "MODIFIED", missed, "team-a", "p1", "u1")
            await count_cold_start(state, CountedPods(), "MODIFIED", ended("cold", "miss", "env", "x"), "team-a",
                                   "p2", "u2")  # fmt: skip
            await count_cold_start(state, CountedPods(), "MODIFIED", ended("warm", "hit", "none", ""), "team-a",
                                   "p3", "u3")  # fmt: skip
        finally:
            assert state.api is not None
            await state.api.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(events())

    def outcomes(predicted: str, actual: str) -> float | None:
        return state.metrics.registry.get_sample_value("compilecache_prediction_outcomes_total", {
            "namespace": "team-a", "cache": "mlp", "predicted": predicted, "actual": actual})  # fmt: skip

    assert (outcomes("warm", "cold"), outcomes("cold", "cold"), outcomes("warm", "warm")) == (1.0, 1.0, 1.0)
    lines = [r.getMessage() for r in caplog.records if "was predicted warm" in r.getMessage()]
    assert lines == ["pod team-a/p1 was predicted warm (every key factor matches the warm-up (image, env "
                     "OMP_NUM_THREADS)) but started cold: inductor_config: inductor config max_autotune: False → True"]


def test_the_tally_keeps_the_predictions_against_the_verdicts() -> None:
    miss, hit = coldstarts.Verdict("app", "miss", "env", "x"), coldstarts.Verdict("app", "hit", "none", "")
    cold: dict[str, Any] | None = None
    for verdict, predicted in [(miss, "warm"), (hit, "warm"), (hit, "warm"), (miss, "cold"), (hit, None)]:
        cold = coldstarts.tally(cold, verdict, predicted)
    assert cold is not None and cold["pods"] == 5
    assert cold["predictions"] == {"warm": {"cold": 1, "warm": 2}, "cold": {"cold": 1}}
    assert "predictions" not in coldstarts.tally(None, hit), "no prediction: nothing said"
    assert coldstarts.pod_prediction({"metadata": {"annotations": {names.PREDICTED_ANNOTATION: "maybe"}}}) is None


def test_a_pod_predicted_cold_is_logged_only_when_warm_was_wrong() -> None:
    verdict = coldstarts.Verdict("app", "miss", "env", "x")
    assert coldstarts.missed_prediction("a/b", ("cold", ""), verdict) is None
    assert coldstarts.missed_prediction("a/b", None, verdict) is None
    assert coldstarts.missed_prediction("a/b", ("warm", ""), dataclasses.replace(verdict, result="hit")) is None
