"""The pure builders: warm-up Job, pod patch, conditions and status."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator import builders
from compilecache_operator.conditions import merge_conditions
from compilecache_operator.names import (
    CACHE_LABEL,
    INJECTED_ANNOTATION,
    PRELOAD_CONTAINER,
    PRELOAD_MODE_ANNOTATION,
    PRELOAD_MODE_REASON_ANNOTATION,
    PRELOAD_SHARE_ANNOTATION,
    SKIPPED_ANNOTATION,
    SKIPPED_DETAIL_ANNOTATION,
)
from compilecache_operator.plan import BundleRecord, Variant, plan_variants
from compilecache_operator.results import JobState
from compilecache_operator.sidecars import SidecarSupport
from compilecache_operator.spec import Defaults
from compilecache_operator.spec_parse import parse_spec

from tests.operator.podpatch import apply_pod_patch
from tests.operator.samples import (
    BUDGET,
    KEY,
    SETTINGS,
    WITH_SIDECARS,
    env_of,
    flag,
    inject,
    owner,
    parsed,
    pod,
    raw_spec,
    view,
)

DONE = "/var/cache/compilecache/inductor/.compilecache-preload.json"
WITHOUT_SIDECARS = SidecarSupport(False, "the API server is v1.20.2")


def job_for(gpu: str = "", **spec: Any) -> dict[str, Any]:
    body = owner(**spec)
    parsed_spec = parse_spec(body["spec"], Defaults())
    variant = Variant(id="0123456789", gpu=gpu, image=parsed_spec.image)
    return builders.build_job(body, parsed_spec, variant, name="cc-mlp-0123456789-g3", job_id="cc-abc",
                              settings=SETTINGS)


def containers(job: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pod = job["spec"]["template"]["spec"]
    return pod["initContainers"], pod["containers"]


# -- Job ------------------------------------------------------------------------------------------
def test_job_runs_harness_copy_then_compile_then_publish() -> None:
    job = job_for(storage={"url": "redis://redis:6379/0", "secretRef": {"name": "redis-creds"}})
    init, main = containers(job)
    assert [c["name"] for c in init] == ["harness", "compile"]
    assert [c["name"] for c in main] == ["publish"]
    harness, compile_, publish = init[0], init[1], main[0]
    assert harness["image"] == publish["image"] == "ghcr.io/compilecache/preloader:1"
    assert harness["command"][:2] == ["python", "-c"] and harness["command"][-1] == builders.HARNESS_FILE
    assert compile_["image"] == "registry.example/workload:1"
    assert compile_["command"] == [
        "python", builders.HARNESS_FILE, "--target", "tiny_mlp", "--out", "/work/out", "--namespace", "team-a",
        "--name", "mlp", "--mode", "default", "--dynamic", "auto", "--backend", "inductor",
    ]
    assert {"name": "TORCH_COMPILE_JOB_ID", "value": "cc-abc"} in compile_["env"]
    assert compile_["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert publish["command"] == ["compilecache", "publish", "/work/out", "--store", "redis://redis:6379/0"]
    assert publish["env"] == [{"name": "TMPDIR", "value": "/work"},
                              {"name": "COMPILECACHE_REDIS_PASSWORD",
                               "valueFrom": {"secretKeyRef": {"name": "redis-creds", "key": "password"}}}]
    assert "env" not in harness and "COMPILECACHE_REDIS_PASSWORD" not in str(compile_)


def test_job_identity_owner_and_labels() -> None:
    job = job_for()
    meta = job["metadata"]
    assert meta["name"] == "cc-mlp-0123456789-g3" and meta["namespace"] == "team-a"
    assert meta["ownerReferences"] == [{"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                                        "name": "mlp", "uid": "uid-1234", "controller": True,
                                        "blockOwnerDeletion": True}]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["compilecache.io/warmup-for"] == "mlp" and labels["compilecache.io/variant"] == "0123456789"
    assert labels["compilecache.io/generation"] == "3"
    assert CACHE_LABEL not in labels, "warm-up pods must never be injected by the webhook"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "nodeSelector" not in pod
    assert job["spec"]["backoffLimit"] == 2 and job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_gpu_variant_selects_the_product_and_requests_a_gpu() -> None:
    job = job_for("NVIDIA-H100-80GB-HBM3", gpuTypes=["NVIDIA-H100-80GB-HBM3"],
                  warmup={"nodeSelector": {"pool": "gpu"}, "resources": {"limits": {"memory": "8Gi"}},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    compile_ = pod["initContainers"][1]
    assert compile_["resources"] == {"limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}
    assert {"name": "COMPILECACHE_GPU", "value": "NVIDIA-H100-80GB-HBM3"} in compile_["env"]


def test_gpus_per_job_zero_requests_no_gpu_resource() -> None:
    job = job_for("NVIDIA-L4", gpuTypes=["NVIDIA-L4"], warmup={"gpusPerJob": 0},
                  gpuDiscovery={"labelKey": "example.com/gpu"})
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"example.com/gpu": "NVIDIA-L4"}
    assert not any("/" in name for part in pod["initContainers"][1]["resources"].values() for name in part)


def test_job_options_command_env_and_remote_cache() -> None:
    job = job_for(model={"command": "python serve.py", "compile": {"fullgraph": True}, "backward": True},
                  remoteCache={"host": "fleet-redis", "port": 6380}, imagePullPolicy="Always",
                  warmup={"env": [{"name": "HF_HOME", "value": "/tmp/hf"}], "serviceAccountName": "warm"})
    compile_ = job["spec"]["template"]["spec"]["initContainers"][1]
    assert compile_["command"][2:4] == ["--command", "python serve.py"]
    assert "--fullgraph" in compile_["command"] and compile_["command"][-1] == "--backward"
    env = {e["name"]: e["value"] for e in compile_["env"]}
    assert env["TORCHINDUCTOR_REDIS_HOST"] == "fleet-redis" and env["TORCHINDUCTOR_REDIS_PORT"] == "6380"
    assert env["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "1" and env["HF_HOME"] == "/tmp/hf"
    assert compile_["imagePullPolicy"] == "Always"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "warm"


# -- pod patch ---------------------------------------------------------------------------------------
def test_pod_gets_volume_preload_first_and_cache_env() -> None:
    p = pod(initContainers=[{"name": "setup", "image": "busybox"}])
    result = inject(p, view(storage={"url": "redis://redis:6379/0", "secretRef": {"name": "creds"}}))
    assert result.skipped is None
    out = apply_pod_patch(p, result)
    init = out["spec"]["initContainers"]
    assert [c["name"] for c in init] == [PRELOAD_CONTAINER, "setup"]
    preload = init[0]
    key = KEY.format(gpu="cpu", cap="cpu")
    assert preload["command"] == ["compilecache", "preload", "--store", "redis://redis:6379/0", "--key", key,
                                  "--target", "/var/cache/compilecache/inductor", "--done-file", DONE,
                                  "--max-bytes", BUDGET, "--deadline", "30", "--share", "all"]
    assert "restartPolicy" not in preload, "an init container: the app starts after it"
    assert preload["volumeMounts"] == [{"name": "compilecache-cache", "mountPath": "/var/cache/compilecache"}]
    assert preload["env"][0] == {"name": "TMPDIR", "value": "/var/cache/compilecache"}
    assert preload["env"][1]["valueFrom"]["secretKeyRef"] == {"name": "creds", "key": "password"}
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": "16Gi"}}]
    app = out["spec"]["containers"][0]
    assert {"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/var/cache/compilecache/inductor"} in app["env"]
    assert {"name": "TORCH_COMPILE_JOB_ID", "value": "cc-job"} in app["env"]
    assert {"name": "COMPILECACHE_PRELOAD_DONE", "value": DONE} in app["env"]
    assert app["volumeMounts"] == [{"name": "compilecache-cache", "mountPath": "/var/cache/compilecache"}]
    assert out["metadata"]["annotations"] == {INJECTED_ANNOTATION: "mlp", PRELOAD_MODE_ANNOTATION: "InitContainer",
                                              PRELOAD_SHARE_ANNOTATION: "all"}
    assert result.warnings == ()


def test_injection_is_idempotent() -> None:
    v = view()
    once = apply_pod_patch(pod(), inject(pod(), v))
    second = inject(once, v)
    assert second.skipped == "already-injected" and not second.changes
    assert apply_pod_patch(once, second) == once


def test_existing_cache_dir_is_respected_and_mounted_there() -> None:
    p = pod(containers=[
        {"name": "app", "image": "registry.example/workload:1",
         "env": [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/data/inductor/"},
                 {"name": "TORCH_COMPILE_JOB_ID", "value": "mine"}],
         "volumeMounts": [{"name": "data", "mountPath": "/datasets"}]},
    ])
    out = apply_pod_patch(p, inject(p, view()))
    (app,) = out["spec"]["containers"]
    assert app["volumeMounts"] == [{"name": "data", "mountPath": "/datasets"},
                                   {"name": "compilecache-cache", "mountPath": "/data/inductor",
                                    "subPath": "inductor"}]
    env = env_of(app)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/data/inductor/" and env["TORCH_COMPILE_JOB_ID"] == "mine"
    assert env["COMPILECACHE_PRELOAD_DONE"] == "/data/inductor/.compilecache-preload.json"


def test_sidecar_mode_with_native_sidecars() -> None:
    p = pod(initContainers=[{"name": "setup", "image": "busybox"}],
            containers=[{"name": "app", "image": "registry.example/workload:1"},
                        {"name": "own", "image": "registry.example/workload:1",
                         "env": [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/data/inductor/"}]}])
    out = apply_pod_patch(p, inject(p, view(preload={"mode": "Sidecar", "maxBytes": 10})))
    preload, setup = out["spec"]["initContainers"]
    assert preload["name"] == PRELOAD_CONTAINER and setup["name"] == "setup", "the sidecar starts first"
    assert preload["restartPolicy"] == "Always"
    command = preload["command"]
    assert flag(command, "--done-file") == DONE and "--sidecar" in command
    assert "--strict" not in command and flag(command, "--max-bytes") == "10"
    app, own = out["spec"]["containers"]
    assert env_of(app)["COMPILECACHE_PRELOAD_DONE"] == DONE
    assert env_of(own)["COMPILECACHE_PRELOAD_DONE"] == "/data/inductor/.compilecache-preload.json"
    assert out["metadata"]["annotations"] == {INJECTED_ANNOTATION: "mlp", PRELOAD_MODE_ANNOTATION: "Sidecar",
                                              PRELOAD_SHARE_ANNOTATION: "all"}
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": "16Gi"}}]
    again = inject(out, view(preload={"mode": "Sidecar"}))
    assert again.skipped == "already-injected" and not again.changes


def test_the_sidecar_command_is_one_the_preloader_accepts() -> None:
    """The flags the webhook writes, read by the preloader's own command line (cachelib.cli)."""
    from cachelib.cli import build_parser

    for mode, sidecars in (("Sidecar", WITH_SIDECARS), ("Sidecar", WITHOUT_SIDECARS), ("InitContainer", WITH_SIDECARS)):
        out = apply_pod_patch(pod(), inject(pod(), view(preload={"mode": mode}), sidecars))
        args = build_parser().parse_args(out["spec"]["initContainers"][0]["command"][1:])
        assert args.done_file == DONE and args.target == "/var/cache/compilecache/inductor"
        assert args.sidecar is (mode == "Sidecar" and sidecars.available)
        assert (args.max_bytes, args.deadline, args.share, args.owner) == (16 * 2**30, 30.0, "all", None)
    node = view(preload={"nodeCache": {"hostPath": "/var/cache/cc"}, "deadlineSeconds": 5, "maxBytes": 99})
    p = pod(securityContext={"runAsUser": 1000, "runAsGroup": 100})
    args = build_parser().parse_args(apply_pod_patch(p, inject(p, node))["spec"]["initContainers"][0]
                                     ["command"][1:])
    assert (args.max_bytes, args.deadline, args.share, args.owner) == (99, 5.0, "all", (1000, 100))


def test_sidecar_mode_without_native_sidecars_falls_back_to_an_init_container() -> None:
    out = apply_pod_patch(pod(), inject(pod(), view(preload={"mode": "Sidecar"}), WITHOUT_SIDECARS))
    (preload,) = out["spec"]["initContainers"]
    assert "restartPolicy" not in preload, "an API server without native sidecars must never see the field"
    assert "--sidecar" not in preload["command"] and "--done-file" in preload["command"]
    assert env_of(out["spec"]["containers"][0])["COMPILECACHE_PRELOAD_DONE"] == DONE
    assert out["metadata"]["annotations"] == {
        INJECTED_ANNOTATION: "mlp",
        PRELOAD_MODE_ANNOTATION: "InitContainer",
        PRELOAD_MODE_REASON_ANNOTATION: "Sidecar needs Kubernetes 1.29+ native sidecars; the API server is v1.20.2",
        PRELOAD_SHARE_ANNOTATION: "all",
    }
    plain = apply_pod_patch(pod(), inject(pod(), view(), WITHOUT_SIDECARS))
    assert PRELOAD_MODE_REASON_ANNOTATION not in plain["metadata"]["annotations"], "nothing asked for a sidecar"


def test_a_sidecar_into_a_node_cache_hands_off_through_a_pod_volume() -> None:
    """The node's cache directory keeps an earlier pod's done file: a sidecar (which the app does not
    wait for) writes this pod's into an emptyDir of its own. An init container needs none."""
    handoff = "/run/compilecache/.compilecache-preload.json"
    v = view(preload={"mode": "Sidecar", "nodeCache": {"hostPath": "/var/cache/cc"}})
    out = apply_pod_patch(pod(), inject(pod(), v))
    assert out["spec"]["volumes"][1] == {"name": "compilecache-handoff", "emptyDir": {}}
    preload, app = out["spec"]["initContainers"][0], out["spec"]["containers"][0]
    command = preload["command"]
    assert flag(command, "--done-file") == handoff
    handoff_mount = {"name": "compilecache-handoff", "mountPath": "/run/compilecache"}
    assert handoff_mount in preload["volumeMounts"] and handoff_mount in app["volumeMounts"]
    assert env_of(app)["COMPILECACHE_PRELOAD_DONE"] == handoff
    fallback = apply_pod_patch(pod(), inject(pod(), v, WITHOUT_SIDECARS))
    assert len(fallback["spec"]["volumes"]) == 1
    assert env_of(fallback["spec"]["containers"][0])["COMPILECACHE_PRELOAD_DONE"] == DONE


@pytest.mark.parametrize(
    ("mounts", "done"),
    [
        ([{"name": "compilecache-cache", "mountPath": "/var/cache/compilecache"}], DONE),
        ([{"name": "compilecache-cache", "mountPath": "/data/inductor", "subPath": "inductor"}],
         "/data/inductor/.compilecache-preload.json"),
        ([{"name": "compilecache-cache", "mountPath": "/cache/", "subPath": "inductor/"}],
         "/cache/.compilecache-preload.json"),
        ([{"name": "compilecache-cache", "mountPath": "/x", "subPath": "other"}], None),
        ([{"name": "data", "mountPath": "/var/cache/compilecache"}], None),
        ([], None),
    ],
)
def test_done_file_as_a_container_sees_it(mounts: list[dict[str, str]], done: str | None) -> None:
    assert builders.done_file_seen_by(mounts) == done


def test_a_done_file_variable_of_the_container_is_kept() -> None:
    p = pod(containers=[{"name": "app", "image": "registry.example/workload:1",
                         "env": [{"name": "COMPILECACHE_PRELOAD_DONE", "value": "/elsewhere/done.json"}]}])
    out = apply_pod_patch(p, inject(p, view(preload={"mode": "Sidecar"})))
    env = out["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "COMPILECACHE_PRELOAD_DONE"] == [
        {"name": "COMPILECACHE_PRELOAD_DONE", "value": "/elsewhere/done.json"}]


def test_not_ready_and_unknown_caches_are_skipped_with_a_reason() -> None:
    for v, reason, detail in ((view(ready=False), "not-ready", "CompileCache team-a/mlp is not Ready"),
                              (None, "unknown-cache", "no CompileCache 'mlp' in namespace 'team-a'")):
        result = inject(pod(), v)
        assert result.skipped == reason
        out = apply_pod_patch(pod(), result)
        assert out["spec"] == pod()["spec"]
        assert out["metadata"]["annotations"] == {SKIPPED_ANNOTATION: reason, SKIPPED_DETAIL_ANNOTATION: detail}
        assert result.warnings == (f"compilecache: pod starts without a preloaded cache ({reason}): {detail}",)


def test_system_namespaces_are_left_alone() -> None:
    p = pod()
    p["metadata"]["namespace"] = "kube-system"
    result = inject(p, view())
    assert result.skipped == "excluded-namespace" and not result.changes


@pytest.mark.parametrize(
    ("pod_spec", "annotations", "gpu"),
    [
        ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}, {}, "NVIDIA-L4"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]},
        ]}}}}, {}, "NVIDIA-L4"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                   "values": ["NVIDIA-L4", "NVIDIA-A10"]}]},
        ]}}}}, {}, None),
        ({}, {"compilecache.io/gpu": "NVIDIA-A10"}, "NVIDIA-A10"),
        ({}, {}, None),
    ],
)
def test_pinned_gpu_narrows_the_preload(pod_spec: dict[str, Any], annotations: dict[str, str],
                                        gpu: str | None) -> None:
    p = pod(**pod_spec)
    p["metadata"]["annotations"] = annotations
    assert builders.pinned_gpu(p, "nvidia.com/gpu.product") == gpu
    command = apply_pod_patch(p, inject(p, view()))["spec"]["initContainers"][0]["command"]
    assert flag(command, "--gpu") == (gpu.lower() if gpu else None)


def test_keys_follow_the_pods_image() -> None:
    v = view(gpuTypes=["NVIDIA-L4", "NVIDIA-A10"])
    old = BundleRecord(variant="oldvariant", key=KEY.format(gpu="nvidia-l4", cap="sm89"), image="img:old")
    v2 = builders.CacheView(namespace=v.namespace, name=v.name, ready=True, spec=v.spec, bundles=(*v.bundles, old),
                            current_variants=v.current_variants, job_id=v.job_id)
    current = builders.keys_for_pod_images(pod(), v2)
    assert len(current) == 2 and old.key not in current
    assert builders.keys_for_pod_images(pod(containers=[{"name": "a", "image": "img:old"}]), v2) == [old.key]


def test_node_cache_remote_cache_strict_and_max_bytes() -> None:
    v = view(preload={"strict": True, "maxBytes": 1000, "nodeCache": {"hostPath": "/var/cache/cc/"},
                      "resources": {"limits": {"memory": "1Gi"}}},
             remoteCache={"host": "fleet-redis"})
    out = apply_pod_patch(pod(), inject(pod(), v))
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "hostPath": {
        "path": "/var/cache/cc/team-a/mlp", "type": "DirectoryOrCreate"}}]
    preload = out["spec"]["initContainers"][0]
    assert preload["command"][-9:] == ["--strict", "--max-bytes", "1000", "--deadline", "30",
                                       "--share", "all", "--owner", "65532:65532"]
    assert preload["resources"] == {"limits": {"memory": "1Gi"}}
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert env["TORCHINDUCTOR_REDIS_HOST"] == "fleet-redis" and env["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "1"


@pytest.mark.parametrize(
    ("preload", "size_limit", "max_bytes", "deadline"),
    [
        ({}, "16Gi", BUDGET, "30"),
        ({"sizeLimit": "2Gi", "deadlineSeconds": 12}, "2Gi", str(2 * 2**30), "12"),
        ({"sizeLimit": "500M", "maxBytes": 1000}, "500M", "1000", "30"),
    ],
)
def test_preloads_are_bounded_by_the_volume_and_a_deadline(preload: dict[str, Any], size_limit: str,
                                                           max_bytes: str, deadline: str) -> None:
    """The cache emptyDir gets the sizeLimit; the preload may fetch and unpack no more than
    maxBytes, else that size, and ends by the deadline (then the pod starts)."""
    out = apply_pod_patch(pod(), inject(pod(), view(preload=preload)))
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": size_limit}}]
    command = out["spec"]["initContainers"][0]["command"]
    assert flag(command, "--max-bytes") == max_bytes and flag(command, "--deadline") == deadline


def test_a_node_cache_has_no_size_limit_but_the_same_budget() -> None:
    out = apply_pod_patch(pod(), inject(pod(), view(preload={"nodeCache": {"hostPath": "/var/cache/cc"},
                                                                     "sizeLimit": "1Gi"})))
    assert "emptyDir" not in out["spec"]["volumes"][0]
    assert flag(out["spec"]["initContainers"][0]["command"], "--max-bytes") == str(2**30)


def test_apply_does_not_modify_the_input() -> None:
    p = pod()
    before = copy.deepcopy(p)
    apply_pod_patch(p, inject(p, view()))
    assert p == before


def test_cache_view_from_a_body() -> None:
    body = owner()
    spec = parsed()
    (variant,) = plan_variants("team-a", "mlp", spec)
    body["status"] = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "plannedGPUs": "cpu",
        "bundles": [BundleRecord(variant=variant.id, key=KEY.format(gpu="cpu", cap="cpu"), job_id="cc-j").to_status()],
    }
    v = builders.cache_view(body, Defaults())
    assert v.ready and v.current_variants == {variant.id} and v.job_id == "cc-j" and len(v.bundles) == 1
    body["spec"] = raw_spec(image=None)
    assert not builders.cache_view(body, Defaults()).ready


# -- conditions and status -------------------------------------------------------------------------
VARIANTS = [Variant("aaaaaaaaaa", "", "img"), Variant("bbbbbbbbbb", "NVIDIA-L4", "img")]


def state(variant: str, phase: str, reason: str = "", message: str = "") -> JobState:
    return JobState(name=f"job-{variant[:2]}", variant=variant, generation=1, phase=phase,  # type: ignore[arg-type]
                    reason=reason, message=message)


def by_type(conds: list[Any]) -> dict[str, Any]:
    return {c.type: c for c in conds}


def test_conditions_ready_when_every_variant_has_a_bundle() -> None:
    bundles = [BundleRecord(variant=v.id, key="k" + v.id) for v in VARIANTS]
    c = by_type(builders.warmup_conditions(VARIANTS, bundles, {}))
    assert (c["Ready"].status, c["Ready"].reason) == (True, "BundlesAvailable")
    assert not c["Warming"].status and not c["Degraded"].status


def test_conditions_while_warming_and_after_failures() -> None:
    one = [BundleRecord(variant="aaaaaaaaaa", key="k")]
    warming = by_type(builders.warmup_conditions(VARIANTS, one, {"bbbbbbbbbb": state("bbbbbbbbbb", "active")}))
    assert (warming["Ready"].status, warming["Ready"].reason) == (False, "WarmupInProgress")
    assert warming["Warming"].status and "NVIDIA-L4" in warming["Warming"].message

    failed = {"bbbbbbbbbb": state("bbbbbbbbbb", "failed", "CompileFailed", "exit 1: boom")}
    partial = by_type(builders.warmup_conditions(VARIANTS, one, failed))
    assert (partial["Ready"].status, partial["Ready"].reason) == (True, "PartiallyAvailable")
    assert (partial["Degraded"].status, partial["Degraded"].reason) == (True, "CompileFailed")
    assert "exit 1: boom" in partial["Degraded"].message

    none = by_type(builders.warmup_conditions(VARIANTS, [], {
        "aaaaaaaaaa": state("aaaaaaaaaa", "failed", "PublishFailed", "store down"), **failed}))
    assert (none["Ready"].status, none["Ready"].reason) == (False, "WarmupFailed")
    assert none["Degraded"].reason == "WarmupFailed" and "store down" in none["Ready"].message


def test_merge_keeps_transition_time_until_the_status_changes() -> None:
    first = merge_conditions([], builders.failure_conditions(builders.Failure("InvalidSpec", "spec.image: x")),
                             generation=1, now="2025-01-01T00:00:00Z")
    again = merge_conditions(first, builders.failure_conditions(builders.Failure("SecretNotFound", "y")),
                             generation=2, now="2025-01-02T00:00:00Z")
    ready = {c["type"]: c for c in again}["Ready"]
    assert ready["lastTransitionTime"] == "2025-01-01T00:00:00Z" and ready["reason"] == "SecretNotFound"
    assert ready["observedGeneration"] == 2
    healed = merge_conditions(again, builders.warmup_conditions(VARIANTS[:1], [BundleRecord("aaaaaaaaaa", "k")], {}),
                              generation=2, now="2025-01-03T00:00:00Z")
    assert {c["type"]: c for c in healed}["Ready"]["lastTransitionTime"] == "2025-01-03T00:00:00Z"
    assert [c["type"] for c in healed] == ["Ready", "Warming", "Degraded"]


def test_build_status_counts_bundles_and_masks_the_store_password() -> None:
    bundles = [BundleRecord(variant="aaaaaaaaaa", key="k", bytes=5)]
    status = builders.build_status({}, generation=4, conditions=builders.warmup_conditions(VARIANTS[:1], bundles, {}),
                                   bundles=bundles, planned_gpus=["cpu"], storage_url="redis://:pw@r:6379/0",
                                   now="2025-01-01T00:00:00Z")
    assert status["observedGeneration"] == 4 and status["bundleCount"] == 1
    assert status["bundles"][0]["bytes"] == 5 and status["plannedGPUs"] == "cpu"
    assert status["storage"] == "redis://***@r:6379/0"
    assert not builders.status_changed(status, status)
    kept = builders.build_status(status, generation=5, conditions=[], bundles=None, planned_gpus=None,
                                 storage_url=None, now="2025-01-02T00:00:00Z")
    assert kept["bundles"] == status["bundles"] and kept["plannedGPUs"] == "cpu"
    assert builders.status_changed(status, kept)


def test_status_never_carries_empty_strings() -> None:
    bundles = [BundleRecord(variant="aaaaaaaaaa", key="k", created="", job_id="")]
    status = builders.build_status({}, generation=1, conditions=builders.warmup_conditions(VARIANTS[:1], bundles, {}),
                                   bundles=bundles, planned_gpus=[], storage_url=None, now="2025-01-01T00:00:00Z")
    assert "plannedGPUs" not in status
    assert "created" not in status["bundles"][0] and "jobId" not in status["bundles"][0]
    assert all(c["message"] for c in status["conditions"])


def test_harness_copy_brings_the_builtin_targets_along(tmp_path: Path) -> None:
    """The copy command of the ``harness`` init container, run for real: harness.py, targets.py,
    warmstart.py, precheck.py, factors.py, masking.py, the byte-code and Triton-module parts and the pod contract
    land side by side, so that short target names and --precompile (with its check) work in an image without
    cachelib."""
    subprocess.run([sys.executable, "-c", builders.COPY_HARNESS, str(tmp_path / "harness.py")], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bytecode.py", "compilekey.py", "factors.py", "harness.py", "masking.py", "podcontract.py", "precheck.py",
        "targets.py", "triton_modules.py", "warmstart.py",
    ]  # fmt: skip
    assert "def tiny_mlp" in (tmp_path / "targets.py").read_text()


# -- spec.model.precompile -----------------------------------------------------------------------------
def test_precompile_auto_reaches_the_harness_and_the_app_containers() -> None:
    compile_ = job_for(model={"target": "tiny_mlp", "precompile": "Auto"})["spec"]["template"]["spec"]
    command = compile_["initContainers"][1]["command"]
    assert command[-2:] == ["--precompile", "auto"]
    assert "warmstart" in compile_["initContainers"][0]["command"][2]  # copied beside harness.py
    p = pod()
    auto = view(model={"target": "tiny_mlp", "precompile": "Auto"}, precompile="Verified")
    out = apply_pod_patch(p, inject(p, auto))
    assert env_of(out["spec"]["containers"][0])["TORCH_CACHING_PRECOMPILE"] == "1"


@pytest.mark.parametrize("precompile", ["LeftOut", ""])
def test_precompile_env_only_for_bundles_whose_precompiled_part_was_verified(precompile: str) -> None:
    """A left-out part (or a bundle from before the check) gets no TORCH_CACHING_PRECOMPILE: torch
    would load its entries inside torch.compile, where no guard of ours runs."""
    p = pod()
    auto = view(model={"target": "tiny_mlp", "precompile": "Auto"}, precompile=precompile)
    out = apply_pod_patch(p, inject(p, auto))
    assert "TORCH_CACHING_PRECOMPILE" not in env_of(out["spec"]["containers"][0])


@pytest.mark.parametrize(
    ("container_env", "mode", "files", "expected"),
    [
        ([], "InitContainer", 2400, "/var/cache/compilecache/inductor/compilecache-pycache"),
        ([{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/models/cache"}], "InitContainer", 2400,
         "/models/cache/compilecache-pycache"),
        ([{"name": "PYTHONPYCACHEPREFIX", "value": "/own"}], "InitContainer", 2400, "/own"),
        ([], "InitContainer", 0, None),  # the image has its own byte code: a prefix would hide it
        ([], "Sidecar", 2400, None),  # the app starts while the preload runs: the tree is not there yet
    ],
)
def test_the_byte_code_part_reaches_the_app_only_when_it_is_there_in_time(
    container_env: list[dict[str, str]], mode: str, files: int, expected: str | None
) -> None:
    p = pod(containers=[{"name": "app", "image": "registry.example/workload:1", "env": container_env}])
    out = apply_pod_patch(p, inject(p, view(bytecode_files=files, preload={"mode": mode})))
    assert env_of(out["spec"]["containers"][0]).get("PYTHONPYCACHEPREFIX") == expected


def test_the_precompiled_condition_names_each_left_out_bundle() -> None:
    verified = BundleRecord(variant="a", key="k1", gpu="NVIDIA-H100", precompile="Verified")
    left = BundleRecord(variant="b", key="k2", gpu="NVIDIA-L4", precompile="LeftOut",
                        precompile_reason="the precompiled entry failed to load: install_failed: TypeError: x")
    assert builders.precompile_condition([BundleRecord(variant="c", key="k3")]) is None
    ok = builders.precompile_condition([verified])
    assert ok is not None and ok.status and ok.reason == "Verified"
    bad = builders.precompile_condition([verified, left])
    assert bad is not None and not bad.status and bad.reason == "PrecompileUnverified"
    assert "1 of 2" in bad.message and "NVIDIA-L4: the precompiled entry failed to load: install_failed" in bad.message


def test_precompile_off_changes_neither_the_harness_nor_the_app_containers() -> None:
    command = job_for()["spec"]["template"]["spec"]["initContainers"][1]["command"]
    assert "--precompile" not in command
    p = pod()
    out = apply_pod_patch(p, inject(p, view()))
    assert "TORCH_CACHING_PRECOMPILE" not in env_of(out["spec"]["containers"][0])
