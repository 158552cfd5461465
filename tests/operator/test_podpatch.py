"""The webhook's pod patch: the preload container, the cache volume and environment, or the reason
to leave a pod alone; the index's view of a CompileCache."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from compilecache_operator.decisions import cacheview, podpatch
from compilecache_operator.decisions.plan import BundleRecord, plan_variants
from compilecache_operator.decisions.podpatch import patched_pod
from compilecache_operator.model import names
from compilecache_operator.model.sidecars import SidecarSupport
from compilecache_operator.model.spec import Defaults

from tests.operator.samples import (
    BUDGET,
    KEY,
    WITH_SIDECARS,
    env_of,
    flag,
    inject,
    job_for,
    owner,
    parsed,
    pod,
    raw_spec,
    view,
)

DONE = "/var/cache/compilecache/inductor/.compilecache-preload.json"
WITHOUT_SIDECARS = SidecarSupport(False, "the API server is v1.20.2")
WARM = {names.PREDICTED_ANNOTATION: "warm",
        names.PREDICTED_DETAIL_ANNOTATION: "every key factor matches the warm-up (image, env)"}
"""The prediction of the sample pod against the sample cache (same image, no variable on either side)."""


def test_pod_gets_volume_preload_first_and_cache_env() -> None:
    p = pod(initContainers=[{"name": "setup", "image": "busybox"}])
    result = inject(p, view(storage={"url": "redis://redis:6379/0", "secretRef": {"name": "creds"}}))
    assert result.skipped is None
    out = patched_pod(p, result)
    init = out["spec"]["initContainers"]
    assert [c["name"] for c in init] == [names.PRELOAD_CONTAINER, "setup"]
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
    assert out["metadata"]["annotations"] == {names.INJECTED_ANNOTATION: "mlp",
                                              names.PRELOAD_MODE_ANNOTATION: "InitContainer",
                                              names.PRELOAD_SHARE_ANNOTATION: "all", **WARM}
    assert result.warnings == ()


def test_injection_is_idempotent() -> None:
    v = view()
    once = patched_pod(pod(), inject(pod(), v))
    second = inject(once, v)
    assert second.skipped == "already-injected" and not second.changes
    assert patched_pod(once, second) == once


def test_existing_cache_dir_is_respected_and_mounted_there() -> None:
    p = pod(containers=[
        {"name": "app", "image": "registry.example/workload:1",
         "env": [{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/data/inductor/"},
                 {"name": "TORCH_COMPILE_JOB_ID", "value": "mine"}],
         "volumeMounts": [{"name": "data", "mountPath": "/datasets"}]},
    ])
    out = patched_pod(p, inject(p, view()))
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
    out = patched_pod(p, inject(p, view(preload={"mode": "Sidecar", "maxBytes": 10})))
    preload, setup = out["spec"]["initContainers"]
    assert preload["name"] == names.PRELOAD_CONTAINER and setup["name"] == "setup", "the sidecar starts first"
    assert preload["restartPolicy"] == "Always"
    command = preload["command"]
    assert flag(command, "--done-file") == DONE and "--sidecar" in command
    assert "--strict" not in command and flag(command, "--max-bytes") == "10"
    app, own = out["spec"]["containers"]
    assert env_of(app)["COMPILECACHE_PRELOAD_DONE"] == DONE
    assert env_of(own)["COMPILECACHE_PRELOAD_DONE"] == "/data/inductor/.compilecache-preload.json"
    assert out["metadata"]["annotations"] == {names.INJECTED_ANNOTATION: "mlp",
                                              names.PRELOAD_MODE_ANNOTATION: "Sidecar",
                                              names.PRELOAD_SHARE_ANNOTATION: "all", **WARM}
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": "16Gi"}}]
    again = inject(out, view(preload={"mode": "Sidecar"}))
    assert again.skipped == "already-injected" and not again.changes


def test_the_sidecar_command_is_one_the_preloader_accepts() -> None:
    """The flags the webhook writes, read by the preloader's own command line (cachelib.cli)."""
    from cachelib.cli.parser import build_parser

    for mode, sidecars in (("Sidecar", WITH_SIDECARS), ("Sidecar", WITHOUT_SIDECARS), ("InitContainer", WITH_SIDECARS)):
        out = patched_pod(pod(), inject(pod(), view(preload={"mode": mode}), sidecars))
        args = build_parser().parse_args(out["spec"]["initContainers"][0]["command"][1:])
        assert args.done_file == DONE and args.target == "/var/cache/compilecache/inductor"
        assert args.sidecar is (mode == "Sidecar" and sidecars.available)
        assert (args.max_bytes, args.deadline, args.share, args.owner) == (16 * 2**30, 30.0, "all", None)
    node = view(preload={"nodeCache": {"hostPath": "/var/cache/cc"}, "deadlineSeconds": 5, "maxBytes": 99})
    p = pod(securityContext={"runAsUser": 1000, "runAsGroup": 100})
    args = build_parser().parse_args(patched_pod(p, inject(p, node))["spec"]["initContainers"][0]
                                     ["command"][1:])
    assert (args.max_bytes, args.deadline, args.share, args.owner) == (99, 5.0, "all", (1000, 100))


def test_sidecar_mode_without_native_sidecars_falls_back_to_an_init_container() -> None:
    out = patched_pod(pod(), inject(pod(), view(preload={"mode": "Sidecar"}), WITHOUT_SIDECARS))
    (preload,) = out["spec"]["initContainers"]
    assert "restartPolicy" not in preload, "an API server without native sidecars must never see the field"
    assert "--sidecar" not in preload["command"] and "--done-file" in preload["command"]
    assert env_of(out["spec"]["containers"][0])["COMPILECACHE_PRELOAD_DONE"] == DONE
    assert out["metadata"]["annotations"] == {
        names.INJECTED_ANNOTATION: "mlp",
        names.PRELOAD_MODE_ANNOTATION: "InitContainer",
        names.PRELOAD_MODE_REASON_ANNOTATION:
            "Sidecar needs Kubernetes 1.29+ native sidecars; the API server is v1.20.2",
        names.PRELOAD_SHARE_ANNOTATION: "all",
        **WARM,
    }
    plain = patched_pod(pod(), inject(pod(), view(), WITHOUT_SIDECARS))
    assert names.PRELOAD_MODE_REASON_ANNOTATION not in plain["metadata"]["annotations"], "nothing asked for a sidecar"


def test_a_sidecar_into_a_node_cache_hands_off_through_a_pod_volume() -> None:
    """The node's cache directory keeps an earlier pod's done file: a sidecar (which the app does not
    wait for) writes this pod's into an emptyDir of its own. An init container needs none."""
    handoff = "/run/compilecache/.compilecache-preload.json"
    v = view(preload={"mode": "Sidecar", "nodeCache": {"hostPath": "/var/cache/cc"}})
    out = patched_pod(pod(), inject(pod(), v))
    assert out["spec"]["volumes"][1] == {"name": "compilecache-handoff", "emptyDir": {}}
    preload, app = out["spec"]["initContainers"][0], out["spec"]["containers"][0]
    command = preload["command"]
    assert flag(command, "--done-file") == handoff
    handoff_mount = {"name": "compilecache-handoff", "mountPath": "/run/compilecache"}
    assert handoff_mount in preload["volumeMounts"] and handoff_mount in app["volumeMounts"]
    assert env_of(app)["COMPILECACHE_PRELOAD_DONE"] == handoff
    fallback = patched_pod(pod(), inject(pod(), v, WITHOUT_SIDECARS))
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
    assert podpatch.done_file_seen_by(mounts) == done


def test_a_done_file_variable_of_the_container_is_kept() -> None:
    p = pod(containers=[{"name": "app", "image": "registry.example/workload:1",
                         "env": [{"name": "COMPILECACHE_PRELOAD_DONE", "value": "/elsewhere/done.json"}]}])
    out = patched_pod(p, inject(p, view(preload={"mode": "Sidecar"})))
    env = out["spec"]["containers"][0]["env"]
    assert [e for e in env if e["name"] == "COMPILECACHE_PRELOAD_DONE"] == [
        {"name": "COMPILECACHE_PRELOAD_DONE", "value": "/elsewhere/done.json"}]


def test_not_ready_and_unknown_caches_are_skipped_with_a_reason() -> None:
    for v, reason, detail in ((view(ready=False), "not-ready", "CompileCache team-a/mlp is not Ready"),
                              (None, "unknown-cache", "no CompileCache 'mlp' in namespace 'team-a'")):
        result = inject(pod(), v)
        assert result.skipped == reason
        out = patched_pod(pod(), result)
        assert out["spec"] == pod()["spec"]
        annotations = {names.SKIPPED_ANNOTATION: reason, names.SKIPPED_DETAIL_ANNOTATION: detail}
        assert out["metadata"]["annotations"] == annotations
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
    assert podpatch.pinned_gpu(p, "nvidia.com/gpu.product") == gpu
    command = patched_pod(p, inject(p, view()))["spec"]["initContainers"][0]["command"]
    assert flag(command, "--gpu") == (gpu.lower() if gpu else None)


def test_keys_follow_the_pods_image() -> None:
    v = view(gpuTypes=["NVIDIA-L4", "NVIDIA-A10"])
    old = BundleRecord(variant="oldvariant", key=KEY.format(gpu="nvidia-l4", cap="sm89"), image="img:old")
    v2 = cacheview.CacheView(namespace=v.namespace, name=v.name, ready=True, spec=v.spec, bundles=(*v.bundles, old),
                             current_variants=v.current_variants, job_id=v.job_id)
    current = podpatch.keys_for_pod_images(pod(), v2)
    assert len(current) == 2 and old.key not in current
    assert podpatch.keys_for_pod_images(pod(containers=[{"name": "a", "image": "img:old"}]), v2) == [old.key]


def test_node_cache_remote_cache_strict_and_max_bytes() -> None:
    v = view(preload={"strict": True, "maxBytes": 1000, "nodeCache": {"hostPath": "/var/cache/cc/"},
                      "resources": {"limits": {"memory": "1Gi"}}},
             remoteCache={"host": "fleet-redis"})
    out = patched_pod(pod(), inject(pod(), v))
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
    out = patched_pod(pod(), inject(pod(), view(preload=preload)))
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": size_limit}}]
    command = out["spec"]["initContainers"][0]["command"]
    assert flag(command, "--max-bytes") == max_bytes and flag(command, "--deadline") == deadline


def test_a_node_cache_has_no_size_limit_but_the_same_budget() -> None:
    out = patched_pod(pod(), inject(pod(), view(preload={"nodeCache": {"hostPath": "/var/cache/cc"},
                                                         "sizeLimit": "1Gi"})))
    assert "emptyDir" not in out["spec"]["volumes"][0]
    assert flag(out["spec"]["initContainers"][0]["command"], "--max-bytes") == str(2**30)


def test_apply_does_not_modify_the_input() -> None:
    p = pod()
    before = copy.deepcopy(p)
    patched_pod(p, inject(p, view()))
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
    v = cacheview.cache_view(body, Defaults())
    assert v.ready and v.current_variants == {variant.id} and v.job_id == "cc-j" and len(v.bundles) == 1
    body["spec"] = raw_spec(image=None)
    assert not cacheview.cache_view(body, Defaults()).ready


# -- spec.model.precompile and the byte-code part ------------------------------------------------
def test_precompile_auto_reaches_the_harness_and_the_companions() -> None:
    compile_ = job_for(model={"target": "tiny_mlp", "precompile": "Auto"})["spec"]["template"]["spec"]
    command = compile_["initContainers"][1]["command"]
    assert command[-2:] == ["--precompile", "auto"]
    assert "warmstart" in compile_["initContainers"][0]["command"][2]  # copied beside harness.py
    assert "precompileguard" in compile_["initContainers"][0]["command"][2]


@pytest.mark.parametrize("precompile", ["Verified", "LeftOut", ""])
def test_the_webhook_never_turns_caching_precompile_on(precompile: str) -> None:
    """Not even for a verified part: with TORCH_CACHING_PRECOMPILE alone torch loads the entries inside
    torch.compile where no guard of ours runs, and a pod whose global state differs from the warm-up's
    (OMP_NUM_THREADS=1 as torchrun sets it) crashed on torch 2.11-2.14. ``warm_start()`` turns it on
    behind its guard; every other pod gets Off's entries, which the bundle always carries."""
    p = pod()
    auto = view(model={"target": "tiny_mlp", "precompile": "Auto"}, precompile=precompile)
    out = patched_pod(p, inject(p, auto))
    assert "TORCH_CACHING_PRECOMPILE" not in env_of(out["spec"]["containers"][0])
    assert env_of(out["spec"]["containers"][0])["TORCHINDUCTOR_CACHE_DIR"]


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
    out = patched_pod(p, inject(p, view(bytecode_files=files, preload={"mode": mode})))
    assert env_of(out["spec"]["containers"][0]).get("PYTHONPYCACHEPREFIX") == expected


def test_precompile_off_changes_neither_the_harness_nor_the_app_containers() -> None:
    command = job_for()["spec"]["template"]["spec"]["initContainers"][1]["command"]
    assert "--precompile" not in command
    p = pod()
    out = patched_pod(p, inject(p, view()))
    assert "TORCH_CACHING_PRECOMPILE" not in env_of(out["spec"]["containers"][0])
