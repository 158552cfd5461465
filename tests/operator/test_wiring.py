"""A truthful hit rate: the webhook patches only pods whose app containers will read the preload,
preloads only bundles warmed with the pod's own image, says why it leaves a pod alone, and the
operator counts each pod by a result and a reason from fixed sets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from compilecache_operator.admission.webhook import review_pod
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions import cacheview, podpatch
from compilecache_operator.decisions.job_reports import parse_preload, preload_outcome
from compilecache_operator.decisions.plan import BundleRecord
from compilecache_operator.decisions.podpatch import patched_pod
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model import cache_readers, preload_reasons
from compilecache_operator.model.names import (
    ENV_FROM_ANNOTATION,
    PREDICTED_ANNOTATION,
    PREDICTED_DETAIL_ANNOTATION,
    SKIPPED_ANNOTATION,
    SKIPPED_DETAIL_ANNOTATION,
)
from compilecache_operator.model.spec import Defaults

from tests.operator.admission_samples import patched, review
from tests.operator.samples import KEY, env_of, inject, pod, view

IMAGE = "registry.example/workload:1"
GPU = "compilecache.io/gpu"


def app(**fields: Any) -> dict[str, Any]:
    return {"name": "app", "image": IMAGE, **fields}


def cache_dir(value: str) -> list[dict[str, Any]]:
    return [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": value}]


# -- containers that cannot see the preload -------------------------------------------------------------
@pytest.mark.parametrize(
    ("container", "reason", "detail"),
    [
        (app(env=[{"name": "TORCHINDUCTOR_CACHE_DIR", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]),
         "cache-dir-value-from", "TORCHINDUCTOR_CACHE_DIR comes from valueFrom"),
        (app(env=cache_dir("cache/inductor")), "cache-dir-not-absolute", "'cache/inductor' is not an absolute path"),
        (app(env=cache_dir("")), "cache-dir-not-absolute", "'' is not an absolute path"),
        (app(env=cache_dir("/data/inductor"), volumeMounts=[{"name": "pvc", "mountPath": "/data/inductor/"}]),
         "volume-at-cache-dir", "'pvc' is mounted at /data/inductor, at the cache directory /data/inductor"),
        (app(env=cache_dir("/data/inductor"), volumeMounts=[{"name": "pvc", "mountPath": "/data"}]),
         "volume-at-cache-dir", "'pvc' is mounted at /data, above the cache directory /data/inductor"),
        (app(env=cache_dir("/data/inductor"), volumeMounts=[{"name": "pvc", "mountPath": "/data/inductor/triton"}]),
         "volume-at-cache-dir", "mounted at /data/inductor/triton, below the cache directory /data/inductor"),
        (app(volumeMounts=[{"name": "scratch", "mountPath": "/var/cache"}]),
         "volume-at-cache-dir",
         "'scratch' is mounted at /var/cache, above the cache directory /var/cache/compilecache"),
        (app(volumeMounts=[{"name": "mine", "mountPath": "/var/cache/compilecache"}]),
         "volume-at-cache-dir", "at the cache directory /var/cache/compilecache"),
    ],
)
def test_an_app_that_cannot_see_the_preload_is_left_alone(container: dict[str, Any], reason: str,
                                                          detail: str) -> None:
    p = pod(containers=[container])
    result = inject(p, view())
    assert result.skipped == reason and reason in cache_readers.UNWIRED_REASONS
    out = patched_pod(p, result)
    assert out["spec"] == p["spec"], "not patched: a preload the app cannot see would count as a hit"
    assert out["metadata"]["annotations"][SKIPPED_ANNOTATION] == reason
    message = out["metadata"]["annotations"][SKIPPED_DETAIL_ANNOTATION]
    assert message.startswith("container 'app': ") and detail in message
    assert result.warnings == (f"compilecache: pod starts without a preloaded cache ({reason}): {message}",)
    counted = preload_outcome(out, gpu_annotation=GPU)
    assert counted is not None and (counted.result, counted.code, counted.ran) == ("skipped", reason, False)


@pytest.mark.parametrize(
    "container",
    [
        app(volumeMounts=[{"name": "data", "mountPath": "/var/cache/compilecache-other"},
                          {"name": "v", "mountPath": "/var/cachex"}, {"name": "rel", "mountPath": "relative"}]),
        app(env=cache_dir("/data/inductor"), volumeMounts=[{"name": "pvc", "mountPath": "/data/inductor2"}]),
        app(env=cache_dir("/data/inductor"), volumeMounts=[{"name": "compilecache-cache", "mountPath": "/x"}]),
        app(envFrom=[{"configMapRef": {"name": "settings"}}]),
    ],
)
def test_apps_that_see_the_preload_are_wired(container: dict[str, Any]) -> None:
    assert cache_readers.unwired(container) is None
    assert inject(pod(containers=[container]), view()).skipped is None


def test_every_container_that_cannot_see_the_preload_is_named() -> None:
    p = pod(containers=[
        app(),
        app(name="worker", env=[{"name": "TORCHINDUCTOR_CACHE_DIR", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]),
        app(name="tools", volumeMounts=[{"name": "cache", "mountPath": "/var"}]),
    ])
    result = inject(p, view())
    assert result.skipped == "cache-dir-value-from" and not result.containers
    detail = result.annotations[SKIPPED_DETAIL_ANNOTATION]
    assert detail.startswith("container 'worker': ") and "; container 'tools': its volume 'cache'" in detail


# -- images ---------------------------------------------------------------------------------------
def test_a_pod_whose_image_has_no_bundle_is_a_miss_without_a_preload() -> None:
    """Another image's bundle would unpack and report a hit, and torch would miss every entry."""
    p = pod(containers=[app(image="registry.example/workload:2")])
    result = inject(p, view())
    assert result.skipped == "image-mismatch"
    out = patched_pod(p, result)
    assert out["spec"] == p["spec"]
    assert out["metadata"]["annotations"] == {
        SKIPPED_ANNOTATION: "image-mismatch",
        SKIPPED_DETAIL_ANNOTATION: "no bundle of CompileCache team-a/mlp was warmed with the pod's image(s) "
                                   "registry.example/workload:2; its bundles are for registry.example/workload:1 "
                                   "(warm with the image you deploy: spec.image)",
        PREDICTED_ANNOTATION: "cold",
        PREDICTED_DETAIL_ANNOTATION: "image registry.example/workload:1 → registry.example/workload:2",
    }
    counted = preload_outcome(out, gpu_annotation=GPU)
    assert counted is not None and (counted.result, counted.code, counted.ran) == ("miss", "image-mismatch", False)


def test_keys_come_only_from_the_pods_images() -> None:
    v = view(gpuTypes=["NVIDIA-L4", "NVIDIA-A10"])
    old = BundleRecord(variant="oldvariant", key=KEY.format(gpu="nvidia-l4", cap="sm89"), image="img:old")
    with_old = cacheview.CacheView(namespace=v.namespace, name=v.name, ready=True, spec=v.spec,
                                  bundles=(*v.bundles, old), current_variants=v.current_variants, job_id=v.job_id)
    assert podpatch.keys_for_pod_images(pod(containers=[app(image="img:new")]), with_old) == []
    assert podpatch.keys_for_pod_images(pod(containers=[app(image="img:old")]), with_old) == [old.key]
    both = pod(containers=[app(image="img:old"), app(name="b")])
    assert len(podpatch.keys_for_pod_images(both, with_old)) == 3


# -- envFrom ------------------------------------------------------------------------------------------
def test_env_from_is_overridden_with_a_warning_and_an_annotation() -> None:
    p = pod(containers=[app(envFrom=[{"configMapRef": {"name": "settings"}}]),
                        app(name="plain"),
                        app(name="own", envFrom=[{"secretRef": {"name": "s"}}],
                            env=[*cache_dir("/data/inductor"), {"name": "TORCH_COMPILE_JOB_ID", "value": "mine"},
                                 {"name": "COMPILECACHE_PRELOAD_DONE", "value": "/d"}])])
    result = inject(p, view())
    assert result.skipped is None
    out = patched_pod(p, result)
    first = out["spec"]["containers"][0]
    assert env_of(first)["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/compilecache/inductor"
    assert out["metadata"]["annotations"][ENV_FROM_ANNOTATION] == "app", "own sets every variable in env itself"
    assert result.warnings[0] == (
        "compilecache: container 'app' takes variables from envFrom; the ones compilecache sets "
        "(TORCHINDUCTOR_CACHE_DIR, TORCH_COMPILE_JOB_ID, COMPILECACHE_PRELOAD_DONE) take precedence over the same "
        "names there"
    )
    assert result.warnings[1].startswith("compilecache: this pod will compile: env TORCH_COMPILE_JOB_ID: cc-job → "
                                         "mine (container 'own')"), "own keeps its own job id: not the warm-up's"
    plain = patched_pod(pod(), inject(pod(), view()))
    assert ENV_FROM_ANNOTATION not in plain["metadata"]["annotations"]


# -- what the operator counts -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("annotation", "result", "reason"),
    [
        (None, "skipped", "not-injected"),
        ("not-ready", "skipped", "not-ready"),
        ("unknown-cache", "skipped", "unknown-cache"),
        ("volume-at-cache-dir", "skipped", "volume-at-cache-dir"),
        ("image-mismatch", "miss", "image-mismatch"),
        ("anything a user wrote", "skipped", "not-injected"),
    ],
)
def test_pods_without_a_preload_count_by_the_webhooks_reason(annotation: str | None, result: str,
                                                             reason: str) -> None:
    meta: dict[str, Any] = {"annotations": {SKIPPED_ANNOTATION: annotation} if annotation else {}}
    counted = preload_outcome({"metadata": meta, "spec": {"containers": [app()]}}, gpu_annotation=GPU)
    assert counted is not None and (counted.result, counted.code) == (result, reason)


@pytest.mark.parametrize(
    ("message", "result", "reason"),
    [
        ({"result": "hit", "gpu": "cpu"}, "hit", "preloaded"),
        ({"result": "hit", "source": "store"}, "hit", "preloaded"),
        ({"result": "hit", "source": "mixed"}, "hit", "preloaded"),
        ({"result": "hit", "source": "node-cache"}, "hit", "node-cache"),
        ({"result": "miss", "reason": "not in the store: cc1/x"}, "miss", "no-bundle"),
        ({"result": "miss", "reason": "no bundle of cache a/b for gpu cpu and any versions (0 in the store)"},
         "miss", "no-bundle"),
        ({"result": "miss", "reason": "store unavailable: redis://r:6379/0: timed out"}, "miss", "store-unavailable"),
        ({"result": "error", "reason": "deadline of 30 s passed while fetching and unpacking cc1/x (--deadline …)"},
         "error", "deadline-exceeded"),
        ({"result": "error", "reason": "UnpackError: member x exceeds the budget"}, "error", "preload-failed"),
        ({"result": "error", "reason": "whatever", "code": "store-unavailable"}, "error", "store-unavailable"),
        ({"result": "error", "reason": "whatever", "code": "not one of ours"}, "error", "preload-failed"),
        ({"result": "skipped"}, "error", "result-unreadable"),
        ({"result": "maybe"}, "error", "result-unreadable"),
    ],
)
def test_preloader_results_are_filed_under_a_fixed_reason(message: dict[str, Any], result: str,
                                                          reason: str) -> None:
    parsed = parse_preload(json.dumps(message))
    assert (parsed.result, parsed.code) == (result, reason)
    assert parsed.code in preload_reasons.REASONS


def test_an_unreadable_termination_message_is_an_error() -> None:
    parsed = parse_preload("Killed")
    assert (parsed.result, parsed.code) == ("error", "result-unreadable")


def test_every_webhook_reason_has_a_result() -> None:
    assert set(cache_readers.UNWIRED_REASONS) <= set(preload_reasons.WEBHOOK_RESULTS)
    assert set(preload_reasons.WEBHOOK_RESULTS.values()) <= set(preload_reasons.RESULTS)
    assert len(set(preload_reasons.REASONS)) == len(preload_reasons.REASONS)


# -- the webhook handler ------------------------------------------------------------------------------
def test_the_webhook_answer_carries_the_warnings_and_the_annotations() -> None:
    """The AdmissionReview's ``warnings`` say what the pod's author should know; the annotations stay on the pod."""
    state = State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics())
    caches = {("team-a", "mlp"): [view()]}

    def admit(p: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        answer = review_pod(state, caches, review(p))
        return patched(p, answer), list(answer["response"].get("warnings", []))

    skipped = pod(containers=[app(image="other:1")])
    admitted, warnings = admit(skipped)
    assert admitted["spec"] == skipped["spec"]
    assert admitted["metadata"]["annotations"][SKIPPED_ANNOTATION] == "image-mismatch"
    assert len(warnings) == 1 and warnings[0].startswith("compilecache: pod starts without a preloaded cache")
    admitted, warnings = admit(pod(containers=[app(envFrom=[{"configMapRef": {"name": "settings"}}])]))
    assert admitted["spec"]["initContainers"][0]["name"] == "compilecache-preload"
    assert admitted["metadata"]["annotations"][ENV_FROM_ANNOTATION] == "app" and len(warnings) == 1
