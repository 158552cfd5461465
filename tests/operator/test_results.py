"""Termination messages, Job states, the controller's per-variant decisions and the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.admission.webhook import fill_namespace
from compilecache_operator.controller import reconcile
from compilecache_operator.decisions.job_reports import (
    JobState,
    ResultError,
    bundle_from_publish,
    observe_job,
    parse_preload,
    preload_outcome,
    publish_message,
)
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.edge import certs
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.lifecycle import CountedPods
from compilecache_operator.main import admission_from, parse_args, settings_from
from compilecache_operator.model.spec import SecretKey, StorageSpec
from compilecache_operator.model.store_access import SecretReader

KEY = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/nvidia-l4/sm89/torch-2.13.0/triton-3.6.0/cuda-12.8/py-3.11.7"
VARIANT = Variant("aaaaaaaaaa", "NVIDIA-L4", "img:1")


def terminated(name: str, code: int, message: str = "", reason: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, "message": message, "reason": reason}}}


def job(conditions: list[dict[str, Any]], **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "cc-mlp-aaaaaaaaaa-g2", "annotations": annotations,
                     "labels": {"compilecache.io/variant": "aaaaaaaaaa", "compilecache.io/generation": "2"}},
        "status": {"conditions": conditions, "startTime": "2025-01-01T00:00:00Z",
                   "completionTime": "2025-01-01T00:01:30Z"},
    }


def pod(created: str, init: list[dict[str, Any]], main: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"pod-{created[-3:-1]}", "creationTimestamp": created},
            "status": {"initContainerStatuses": init, "containerStatuses": main, **status}}


# -- publish results -------------------------------------------------------------------------------------
def test_bundle_record_from_the_publish_message() -> None:
    message = "packing...\n" + json.dumps({
        "result": "published", "key": KEY, "sha256": "ab" * 32, "bytes": 12345, "compile_seconds": 10.4321,
        "created": "2025-01-01T00:01:00Z", "job_id": "cc-plan",
    })
    rec = bundle_from_publish(message, VARIANT, generation=2, job="cc-mlp-aaaaaaaaaa-g2")
    assert rec == BundleRecord(
        variant="aaaaaaaaaa", key=KEY, gpu="NVIDIA-L4", capability="sm89", torch="2.13.0", triton="3.6.0",
        cuda="12.8", python="3.11.7", image="img:1", digest="ab" * 32, bytes=12345, compile_seconds=10.432,
        created="2025-01-01T00:01:00Z", generation=2, job_id="cc-plan", job="cc-mlp-aaaaaaaaaa-g2",
    )


@pytest.mark.parametrize(
    ("reported", "state", "reason"),
    [
        (None, "", ""),
        ({"verified": True, "reason": None, "seconds": 5.6}, "Verified", ""),
        ({"verified": False, "reason": "the precompiled entry failed to load: install_failed: TypeError: x\nmore"},
         "LeftOut", "the precompiled entry failed to load: install_failed: TypeError: x"),
        ({"verified": False, "reason": "r" * 5000}, "LeftOut", "r" * 1024),
    ],
)
def test_the_warm_up_check_reaches_the_bundle_record(reported: Any, state: str, reason: str) -> None:
    message = json.dumps({"result": "published", "key": KEY, "precompile": reported})
    rec = bundle_from_publish(message, VARIANT, generation=1, job="j")
    assert (rec.precompile, rec.precompile_reason) == (state, reason)
    assert BundleRecord.from_status(rec.to_status()) == rec


@pytest.mark.parametrize(("reported", "files"), [(None, 0), ({"files": 2402, "bytes": 64_000_000}, 2402),
                                                 ({"files": 0, "skipped": "the image carries byte code"}, 0)])
def test_the_byte_code_part_reaches_the_bundle_record(reported: Any, files: int) -> None:
    rec = bundle_from_publish(json.dumps({"result": "published", "key": KEY, "bytecode": reported}), VARIANT,
                              generation=1, job="j")
    assert rec.bytecode_files == files and BundleRecord.from_status(rec.to_status()) == rec
    assert ("bytecodeFiles" in rec.to_status()) is bool(files)


@pytest.mark.parametrize("message", [None, "", "Traceback: boom", '{"result": "error", "reason": "store down"}',
                                     '{"result": "published", "key": "cc1/bad"}'])
def test_unusable_publish_messages_raise(message: str | None) -> None:
    with pytest.raises(ResultError):
        bundle_from_publish(message, VARIANT, generation=1, job="j")


def test_publish_message_comes_from_the_successful_pod() -> None:
    pods = [pod("2025-01-01T00:00:01Z", [], [terminated("publish", 1, "first try failed")]),
            pod("2025-01-01T00:00:09Z", [], [terminated("publish", 0, '{"key": "k"}')])]
    assert publish_message(pods) == '{"key": "k"}'
    assert publish_message([]) is None


# -- Job states -------------------------------------------------------------------------------------
def test_job_phases_and_duration() -> None:
    done = observe_job(job([{"type": "Complete", "status": "True"}], **{"compilecache.io/recorded": "succeeded"}),
                       [])
    assert (done.phase, done.variant, done.generation, done.recorded, done.duration) == (
        "succeeded", "aaaaaaaaaa", 2, True, 90.0)
    running = observe_job(job([]), [pod("2025-01-01T00:00:01Z", [], [], phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}])])
    assert running.phase == "active" and "Insufficient nvidia.com/gpu" in running.message


def test_failed_job_reports_the_failing_container() -> None:
    failed = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "too many"}]
    pods = [
        pod("2025-01-01T00:00:01Z", [terminated("harness", 0), terminated("compile", 0)],
            [terminated("publish", 3, '{"result": "error", "reason": "store unreachable"}')], phase="Failed"),
        pod("2025-01-01T00:00:05Z", [terminated("harness", 0),
                                     terminated("compile", 1, "line1\nRuntimeError: CUDA out of memory")],
            [], phase="Failed"),
    ]
    state = observe_job(job(failed), pods)
    assert state.phase == "failed" and state.reason == "CompileFailed"
    assert "exited with code 1" in state.message and "CUDA out of memory" in state.message
    publish_only = observe_job(job(failed), pods[:1])
    assert publish_only.reason == "PublishFailed" and "store unreachable" in publish_only.message
    nothing = observe_job(job(failed), [])
    assert (nothing.reason, nothing.message) == ("BackoffLimitExceeded", "too many")


def test_deadline_exceeded_is_named() -> None:
    state = observe_job(job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                              "message": "Job was active longer than specified deadline"}]), [])
    assert state.reason == "WarmupDeadlineExceeded" and "deadline" in state.message


# -- preload results ----------------------------------------------------------------------------------
def test_preload_results() -> None:
    hit = parse_preload('{"result": "hit", "gpu": "nvidia-l4", "bytes": 100, "seconds": 0.5, "keys": ["k"]}')
    assert (hit.result, hit.gpu, hit.bytes, hit.seconds) == ("hit", "nvidia-l4", 100, 0.5)
    assert parse_preload('{"result": "miss", "reason": "no matching variant"}').reason == "no matching variant"
    assert parse_preload("garbage").result == "error"
    from_keys = parse_preload(json.dumps({"result": "hit", "gpu": None, "keys": [KEY], "hits": [KEY]}))
    assert from_keys.gpu == "nvidia-l4"
    mixed = parse_preload(json.dumps({"result": "hit", "keys": [KEY, KEY.replace("nvidia-l4", "cpu")]}))
    assert mixed.gpu == "mixed"
    assert parse_preload('{"result": "maybe"}').result == "error"


def test_preload_outcome_of_pods() -> None:
    labelled: dict[str, Any] = {"metadata": {"annotations": {"compilecache.io/gpu": "NVIDIA-L4"}},
                "spec": {"initContainers": [{"name": "compilecache-preload"}]},
                "status": {"initContainerStatuses": [{"name": "compilecache-preload", "state": {"running": {}}}]}}
    assert preload_outcome(labelled, gpu_annotation="compilecache.io/gpu") is None
    labelled["status"]["initContainerStatuses"][0]["state"] = {"terminated": {"exitCode": 0,
                                                                             "message": '{"result": "miss"}'}}
    outcome = preload_outcome(labelled, gpu_annotation="compilecache.io/gpu")
    assert outcome is not None and (outcome.result, outcome.gpu) == ("miss", "NVIDIA-L4")
    skipped = preload_outcome({"metadata": {}, "spec": {"containers": []}}, gpu_annotation="compilecache.io/gpu")
    assert skipped is not None and skipped.result == "skipped"


def test_counted_pods_count_each_uid_once() -> None:
    counted = CountedPods(limit=2)
    assert counted.add("a") and not counted.add("a")
    assert counted.add("b") and counted.add("c") and counted.add("a"), "the oldest uid is forgotten past the limit"


# -- metrics ----------------------------------------------------------------------------------------
def test_metrics_exposition() -> None:
    m = Metrics()
    m.count_preload("team-a", "mlp", gpu="nvidia-l4", result="hit", reason="preloaded", seconds=0.4, size=1000)
    m.count_preload("team-a", "mlp", gpu="", result="skipped", reason="volume-at-cache-dir")
    m.count_preload("team-a", "mlp", gpu="cpu", result="bogus", reason="made up by a user", seconds=1.0)
    m.count_warmup("team-a", "mlp", result="succeeded", seconds=42.0)
    m.set_bundles("team-a", "mlp", [BundleRecord("a", "k1", gpu="NVIDIA-L4", bytes=10),
                                    BundleRecord("b", "k2", gpu="cpu", bytes=5)])
    text = m.exposition().decode()
    assert ('compilecache_preloads_total{cache="mlp",gpu="nvidia-l4",namespace="team-a",reason="preloaded",'
            'result="hit"} 1.0') in text
    assert ('compilecache_preloads_total{cache="mlp",gpu="unknown",namespace="team-a",reason="volume-at-cache-dir",'
            'result="skipped"} 1.0') in text
    assert ('compilecache_preloads_total{cache="mlp",gpu="cpu",namespace="team-a",reason="unknown",'
            'result="error"} 1.0') in text, "results and reasons outside the fixed sets are bounded"
    assert 'compilecache_preload_bytes_total{cache="mlp",namespace="team-a"} 1000.0' in text
    assert 'compilecache_preload_duration_seconds_count{cache="mlp",namespace="team-a",result="hit"} 1.0' in text
    assert 'compilecache_warmup_jobs_total{cache="mlp",namespace="team-a",result="succeeded"} 1.0' in text
    assert 'compilecache_warmup_duration_seconds_sum{cache="mlp",namespace="team-a",result="succeeded"} 42.0' in text
    assert 'compilecache_bundles{cache="mlp",namespace="team-a"} 2.0' in text
    assert 'compilecache_bundle_bytes{cache="mlp",gpu="NVIDIA-L4",namespace="team-a"} 10.0' in text
    m.set_bundles("team-a", "mlp", [BundleRecord("b", "k2", gpu="cpu", bytes=5)])
    assert 'gpu="NVIDIA-L4"' not in m.exposition().decode().split("compilecache_bundle_bytes")[-1]
    m.forget_cache("team-a", "mlp")
    assert "compilecache_bundles{" not in m.exposition().decode()


def test_bundles_by_precompile_check_are_gauged_only_for_checked_caches() -> None:
    m = Metrics()
    m.set_bundles("team-a", "bert", [BundleRecord("a", "k1", precompile="Verified"),
                                     BundleRecord("b", "k2", precompile="LeftOut", precompile_reason="r")])
    text = m.exposition().decode()
    assert 'compilecache_bundles_precompile{cache="bert",namespace="team-a",state="LeftOut"} 1.0' in text
    assert 'compilecache_bundles_precompile{cache="bert",namespace="team-a",state="Verified"} 1.0' in text
    m.set_bundles("team-a", "plain", [BundleRecord("c", "k3")])
    assert 'cache="plain"' not in text and 'cache="plain",namespace="team-a",state' not in m.exposition().decode()
    m.forget_cache("team-a", "bert")
    assert "compilecache_bundles_precompile{" not in m.exposition().decode()


# -- reconcile decisions --------------------------------------------------------------------------
def js(phase: str, generation: int, variant: str = "aaaaaaaaaa", recorded: bool = True) -> JobState:
    return JobState(name=f"j-{variant[:1]}-{phase}-{generation}", variant=variant, generation=generation,
                    phase=phase, recorded=recorded)  # type: ignore[arg-type]


def test_decide_per_variant() -> None:
    def step(*states: JobState, generation: int = 3) -> tuple[str, str | None]:
        s = reconcile.decide(VARIANT, [({}, st) for st in states], generation)
        return s.action, s.state.name if s.state else None

    assert step() == ("create", None)
    assert step(js("succeeded", 1), js("active", 3)) == ("record", "j-a-succeeded-1")
    assert step(js("failed", 3), js("active", 2)) == ("wait", "j-a-active-2")
    assert step(js("failed", 3)) == ("failed", "j-a-failed-3")
    assert step(js("failed", 2)) == ("create", None), "a spec change retries a failed warm-up"
    assert step(js("active", 3, variant="bbbbbbbbbb")) == ("create", None)


def test_superseded_jobs() -> None:
    states = [js("succeeded", 1, "old"), js("failed", 1), js("failed", 2), js("active", 1, "old"),
              js("failed", 1, "zzz", recorded=False)]
    assert reconcile.superseded_jobs(states, {"aaaaaaaaaa"}) == ["j-o-succeeded-1", "j-a-failed-1"]


def test_secret_problems_name_the_field() -> None:
    storage = StorageSpec(url="redis://r/0", secret_name="creds", secret_keys=(
        SecretKey("COMPILECACHE_REDIS_PASSWORD", "password"), SecretKey("X", "opt", optional=True)))
    missing = reconcile.secret_problem(storage, None, "team-a")
    assert missing is not None and missing.reason == "SecretNotFound"
    assert missing.message.startswith("spec.storage.secretRef.name: Secret 'creds' not found")
    no_key = reconcile.secret_problem(storage, {"other": b"x"}, "team-a")
    assert no_key is not None and no_key.reason == "SecretKeyMissing" and "'password'" in no_key.message
    assert reconcile.secret_problem(storage, {"password": b"pw"}, "team-a") is None
    assert reconcile.secret_credentials(storage, {"password": b"pw"}) == {"COMPILECACHE_REDIS_PASSWORD": "pw"}
    reader = SecretReader("cc-compilecache-operator-secret-reader", "compilecache-system/cc-compilecache-operator")
    forbidden = reconcile.secret_problem(storage, None, "team-a", reader)
    assert forbidden is not None and forbidden.reason == "SecretForbidden"
    assert forbidden.message == (
        "spec.storage.secretRef.name: the operator may not read Secret 'creds' in namespace 'team-a' (HTTP 403); "
        "allow it with: kubectl create rolebinding cc-compilecache-operator-secret-reader -n team-a "
        "--clusterrole=cc-compilecache-operator-secret-reader "
        "--serviceaccount=compilecache-system:cc-compilecache-operator")
    unknown = reconcile.secret_problem(storage, None, "team-a", SecretReader())
    assert unknown is not None and "get on Secrets of namespace 'team-a'" in unknown.message


# -- command line and webhook plumbing -------------------------------------------------------------
def test_command_line_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COMPILECACHE_PRELOADER_IMAGE", "example/preloader@sha256:" + "0" * 64)
    monkeypatch.setenv("COMPILECACHE_IMAGE_PULL_SECRETS", "a, b")
    monkeypatch.setenv("COMPILECACHE_NAMESPACE", "team-a")
    options = parse_args(["--webhook-config", "managed", "--webhook-host", "127.0.0.1", "--gpu-label-key", "x/gpu"])
    assert options.namespaces == ("team-a",)
    settings = settings_from(options)
    assert settings.jobs.preloader_image.startswith("example/preloader@sha256:")
    assert settings.jobs.image_pull_secrets == ("a", "b") and settings.defaults.gpu_label_key == "x/gpu"
    assert not settings.in_scope("team-b") and settings.in_scope("team-a")
    metrics = Metrics()
    admission = admission_from(options, tmp_path, metrics)
    assert admission.managed == "team-a.compilecache.io" and admission.server is not None
    assert (tmp_path / "tls.crt").is_file() and (tmp_path / "ca.crt").is_file()
    assert admission.cert_ready and admission.serving is None
    assert metrics.webhook_cert_expiry._value.get() == certs.not_after((tmp_path / "tls.crt").read_bytes()).timestamp()
    assert parse_args(["--all-namespaces", "--webhook-config", "off"]).namespaces == ()
    for wrong in (["--metrics-port", "70000"],
                  ["--webhook-cert-secret", "tls"],  # no operator namespace for the Secret
                  ["--operator-namespace", "ops", "--webhook-cert-secret", "tls", "--webhook-cert-dir", "/x"],
                  ["--operator-namespace", "ops", "--signing-key-secret", "k", "--signing-key-file", "/k"],
                  ["--webhook-cert-validity-days", "10", "--webhook-cert-renew-before-days", "10"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)
    serving = admission_from(parse_args(["--operator-namespace", "ops", "--webhook-cert-secret", "tls",
                                         "--webhook-ca-inject", "a,b", "--webhook-host", "hook.ops.svc"]),
                             tmp_path / "own", metrics)
    assert serving.serving is not None and not serving.cert_ready
    assert serving.serving.configs == ("a", "b") and "hook.ops.svc" in serving.serving.hostnames


def test_certificate_directory(tmp_path: Path) -> None:
    with pytest.raises(certs.CertError, match=r"tls\.crt is missing"):
        certs.from_directory(tmp_path)
    made = certs.self_signed(["webhook.compilecache.svc", "10.0.0.1"], tmp_path)
    loaded = certs.from_directory(tmp_path)
    assert loaded == made and (tmp_path / "tls.key").stat().st_mode & 0o077 == 0


def test_fill_namespace_from_the_admission_request() -> None:
    review: dict[str, Any] = {"request": {"namespace": "team-a", "object": {"metadata": {"generateName": "p-"}}}}
    fill_namespace(review)
    assert review["request"]["object"]["metadata"]["namespace"] == "team-a"
