"""Everything the operator creates or injects passes the "restricted" Pod Security Standard, and the
preload runs as a user that leaves a cache the app's uid can write into."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from compilecache_operator.decisions import cacheview, podpatch, warmup_job
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.decisions.podpatch import patched_pod
from compilecache_operator.model import podsecurity, security
from compilecache_operator.model.names import PRELOAD_CONTAINER, PRELOAD_SHARE_ANNOTATION
from compilecache_operator.model.spec import Defaults
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.example_files import EXAMPLES_DIR
from tests.operator.restricted import restricted_violations
from tests.operator.samples import SETTINGS, env_of, flag, inject, owner, pod, view

RESTRICTED_APP: dict[str, Any] = {
    "name": "app",
    "image": "registry.example/workload:1",
    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
}
RESTRICTED_POD = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}}


def job_pod(**spec: Any) -> dict[str, Any]:
    body = owner(**spec)
    parsed_spec = parse_spec(body["spec"], Defaults())
    variant = Variant(id="0123456789", gpu="NVIDIA-L4", image=parsed_spec.image)
    job = warmup_job.build_job(body, parsed_spec, variant, name="cc-mlp-0123456789-g3", job_id="cc-abc",
                               settings=SETTINGS)
    pod_spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod_spec


def injected(p: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return patched_pod(p, inject(p, view(**spec)))


def preload_of(p: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = next(c for c in p["spec"]["initContainers"] if c["name"] == PRELOAD_CONTAINER)
    return container


# -- the checker itself -------------------------------------------------------------------------------
def test_the_restricted_checker_names_what_is_wrong() -> None:
    assert restricted_violations({"containers": [{"name": "app"}]}) == [
        "containers[app]: allowPrivilegeEscalation must be false",
        "containers[app]: capabilities must drop ALL",
        "containers[app]: runAsNonRoot must be true",
        "containers[app]: seccompProfile must be RuntimeDefault or Localhost",
    ]
    compliant = {**RESTRICTED_POD, "containers": [RESTRICTED_APP], "volumes": [{"name": "v", "emptyDir": {}}]}
    assert restricted_violations(compliant) == []
    bad = {**compliant, "volumes": [{"name": "h", "hostPath": {"path": "/x"}}],
           "initContainers": [{**RESTRICTED_APP, "name": "root", "securityContext": {
               **RESTRICTED_APP["securityContext"], "runAsUser": 0,
               "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}}]}
    assert restricted_violations(bad) == [
        "volume h: type ['hostPath'] not allowed",
        "initContainers[root]: capabilities add ['CHOWN']",
        "initContainers[root]: runAsUser 0",
    ]


# -- the warm-up Job ----------------------------------------------------------------------------------
def test_the_warmup_pod_is_restricted() -> None:
    assert restricted_violations(job_pod()) == []
    assert restricted_violations(job_pod(warmup={"securityContext": {"runAsUser": 1000, "runAsGroup": 100,
                                                                     "fsGroup": 2000}})) == []


def test_the_warmup_pod_runs_as_its_security_context() -> None:
    default = job_pod()
    assert default["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                          "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
    chosen = job_pod(warmup={"securityContext": {"runAsUser": 1000, "runAsGroup": 100,
                                                 "fsGroup": 2000}})["securityContext"]
    assert (chosen["runAsUser"], chosen["runAsGroup"], chosen["fsGroup"]) == (1000, 100, 2000)


def test_every_warmup_container_has_a_read_only_root_by_default() -> None:
    """harness and publish run the preloader image and write only into volumes (publish packs in
    TMPDIR=/work); compile runs the user's image with an emptyDir on /tmp for its temporary files and
    Triton's home (a policy engine's read-only-root rule admits the Job); ``readOnlyRootFilesystem: false``
    gives compile a writable root and no /tmp volume."""
    spec = job_pod()
    harness, compile_ = spec["initContainers"]
    (publish,) = spec["containers"]
    for container in (harness, compile_, publish):
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, container["name"]
    assert env_of(publish)["TMPDIR"] == "/work"
    assert {m["mountPath"] for m in publish["volumeMounts"]} == {"/work"}
    mounts = {m["mountPath"]: m["name"] for m in compile_["volumeMounts"]}
    assert mounts["/tmp"] == "compilecache-tmp" and {"name": "compilecache-tmp", "emptyDir": {}} in spec["volumes"]
    assert env_of(compile_)["TMPDIR"] == "/tmp" and env_of(compile_)["TRITON_HOME"] == "/tmp"

    writable = job_pod(warmup={"readOnlyRootFilesystem": False})
    compile_ = writable["initContainers"][1]
    assert "readOnlyRootFilesystem" not in compile_["securityContext"]
    assert "/tmp" not in {m["mountPath"] for m in compile_["volumeMounts"]}
    assert not any(v["name"] == "compilecache-tmp" for v in writable["volumes"])
    assert "TRITON_HOME" not in env_of(compile_)


def test_the_users_own_tmp_volume_and_variables_win() -> None:
    spec = job_pod(warmup={"volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
                           "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
                           "env": [{"name": "TMPDIR", "value": "/tmp/mine"}]})
    compile_ = spec["initContainers"][1]
    assert [m["name"] for m in compile_["volumeMounts"] if m["mountPath"] == "/tmp"] == ["scratch"]
    assert [e["value"] for e in compile_["env"] if e["name"] == "TMPDIR"] == ["/tmp/mine"]
    assert compile_["securityContext"]["readOnlyRootFilesystem"] is True


# -- the injected preload -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["InitContainer", "Sidecar"])
def test_a_restricted_pod_stays_restricted_once_injected(mode: str) -> None:
    p = pod(containers=[RESTRICTED_APP], **RESTRICTED_POD)
    assert restricted_violations(p["spec"]) == []
    out = injected(p, preload={"mode": mode})
    assert restricted_violations(out["spec"]) == []
    assert out["spec"]["securityContext"] == RESTRICTED_POD["securityContext"], "pod-level fields stay the user's"
    assert out["spec"]["containers"][0]["securityContext"] == RESTRICTED_APP["securityContext"]


def test_the_preload_container_is_restricted_on_its_own() -> None:
    """Whatever the pod level says (nothing here), the injected container passes by itself."""
    out = injected(pod())
    only_preload = {"initContainers": [preload_of(out)], "volumes": out["spec"]["volumes"]}
    assert restricted_violations(only_preload) == []
    context = preload_of(out)["securityContext"]
    assert context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                       "seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 65532, "runAsGroup": 65532,
                       "readOnlyRootFilesystem": True}
    assert env_of(preload_of(out))["TMPDIR"] == "/var/cache/compilecache", "its temporary files go to its volume"


def test_the_app_containers_are_not_given_a_security_context() -> None:
    out = injected(pod())
    assert "securityContext" not in out["spec"]["containers"][0] and "securityContext" not in out["spec"]


@pytest.mark.parametrize(
    ("pod_context", "app_context", "user", "group", "share"),
    [
        # the app's uid is stated: the preload runs as the app and the app owns the tree
        ({}, {"runAsUser": 1000}, 1000, None, "owner"),
        ({}, {"runAsUser": 1000, "runAsGroup": 1001}, 1000, 1001, "owner"),
        ({"runAsUser": 2000, "runAsGroup": 2001}, {}, 2000, 2001, "owner"),
        ({"runAsUser": 2000, "fsGroup": 3000}, {"runAsUser": 1000}, 1000, None, "owner"),
        # no usable uid: 65532, group-writable under the pod's fsGroup, else writable by all
        ({"fsGroup": 3000}, {}, 65532, 3000, "group"),
        ({"fsGroup": 3000}, {"runAsUser": 0}, 65532, 3000, "group"),
        ({}, {}, 65532, 65532, "all"),
        ({"runAsGroup": 5}, {}, 65532, 65532, "all"),
    ],
)
def test_the_preload_runs_as_the_app_or_shares_the_tree(pod_context: dict[str, int], app_context: dict[str, int],
                                                       user: int, group: int | None, share: str) -> None:
    app: dict[str, Any] = {"name": "app", "image": "registry.example/workload:1"}
    if app_context:
        app["securityContext"] = app_context
    p = pod(containers=[app], **({"securityContext": pod_context} if pod_context else {}))
    out = injected(p)
    preload = preload_of(out)
    context = preload["securityContext"]
    assert context["runAsUser"] == user and context.get("runAsGroup") == group
    assert context["runAsNonRoot"] is True and context["capabilities"] == {"drop": ["ALL"]}
    assert flag(preload["command"], "--share") == share and "--owner" not in preload["command"]
    assert out["metadata"]["annotations"][PRELOAD_SHARE_ANNOTATION] == share


def test_app_containers_with_different_uids_get_a_shared_tree() -> None:
    p = pod(containers=[
        {"name": "a", "image": "registry.example/workload:1", "securityContext": {"runAsUser": 1000}},
        {"name": "b", "image": "registry.example/workload:1", "securityContext": {"runAsUser": 1001}},
    ], securityContext={"fsGroup": 4000})
    preload = preload_of(injected(p))
    assert flag(preload["command"], "--share") == "group" and preload["securityContext"]["runAsGroup"] == 4000
    same = pod(containers=[
        {"name": "a", "image": "registry.example/workload:1", "securityContext": {"runAsUser": 1000}},
        {"name": "b", "image": "registry.example/workload:1"},
    ], securityContext={"runAsUser": 1000})
    assert flag(preload_of(injected(same))["command"], "--share") == "owner"


@pytest.mark.parametrize(
    ("pod_context", "app_context", "owner_ids"),
    [
        ({}, {"runAsUser": 1000, "runAsGroup": 1001}, "1000:1001"),
        ({"fsGroup": 3000}, {"runAsUser": 1000}, "1000:3000"),
        ({}, {"runAsUser": 1000}, "1000:1000"),
        ({"fsGroup": 3000}, {}, "65532:3000"),
        ({}, {}, "65532:65532"),
    ],
)
def test_a_node_cache_is_written_as_root_with_three_capabilities(pod_context: dict[str, int],
                                                                 app_context: dict[str, int], owner_ids: str) -> None:
    """The kubelet makes the hostPath directory root's 0755: the preload runs as uid 0 with only
    CHOWN, DAC_OVERRIDE and FOWNER, shares the tree with all and hands it to the app's uid."""
    app: dict[str, Any] = {"name": "app", "image": "registry.example/workload:1", "securityContext": app_context}
    p = pod(containers=[app], **({"securityContext": pod_context} if pod_context else {}))
    out = injected(p, preload={"nodeCache": {"hostPath": "/var/cache/cc"}})
    preload = preload_of(out)
    assert preload["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert preload["command"][-4:] == ["--share", "all", "--owner", owner_ids]
    # hostPath needs the "privileged" level anyway; the preload breaks only what it must
    assert restricted_violations({"initContainers": [preload], "volumes": out["spec"]["volumes"]}) == [
        "volume compilecache-cache: type ['hostPath'] not allowed",
        "initContainers[compilecache-preload]: capabilities add ['CHOWN', 'DAC_OVERRIDE', 'FOWNER']",
        "initContainers[compilecache-preload]: runAsNonRoot must be true",
        "initContainers[compilecache-preload]: runAsUser 0",
    ]


def test_stated_identity_takes_the_container_over_the_pod() -> None:
    spec = {"securityContext": {"runAsUser": 1, "runAsGroup": 2}}
    assert security.stated_identity(spec, {"securityContext": {"runAsUser": 3}}) == security.Identity(3, 2)
    assert security.stated_identity({}, {}) == security.Identity(None, None)
    assert security.stated_identity({"securityContext": {"runAsUser": True}}, {}) == security.Identity(None, None)
    assert security.app_identity({}, []) is None


def test_the_example_deployment_stays_restricted_once_injected() -> None:
    """examples/deployment-opt-in.yaml's pod, injected for examples/s3-multi-gpu.yaml's cache."""
    cache = yaml.safe_load((EXAMPLES_DIR / "s3-multi-gpu.yaml").read_text())
    deployment = yaml.safe_load((EXAMPLES_DIR / "deployment-opt-in.yaml").read_text())
    spec = parse_spec(cache["spec"], Defaults())
    bundles = tuple(BundleRecord(variant=f"v{i}", key=f"k{i}", gpu=g, image=spec.image)
                    for i, g in enumerate(spec.gpu_types))
    cache_view = cacheview.CacheView(namespace="ml", name="llama-serve", ready=True, spec=spec, bundles=bundles)
    template = deployment["spec"]["template"]
    p = {"metadata": {**template["metadata"], "namespace": "ml"}, "spec": template["spec"]}
    assert restricted_violations(p["spec"]) == []
    out = patched_pod(p, podpatch.build_pod_patch(p, cache_view, preloader_image="p"))
    assert restricted_violations(out["spec"]) == []
    preload = preload_of(out)
    assert (preload["securityContext"]["runAsUser"], preload["securityContext"]["runAsGroup"]) == (1000, 1000)
    assert flag(preload["command"], "--share") == "owner" and flag(preload["command"], "--deadline") == "20"
    assert out["spec"]["volumes"] == [{"name": "compilecache-cache", "emptyDir": {"sizeLimit": "8Gi"}}]


# -- a node cache where the namespace's Pod Security level refuses it ----------------------------------
BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    """The rules of the "baseline" profile a node cache could break: hostPath volumes, capabilities beyond the
    baseline set (the rest of baseline is in :func:`restricted_violations`, which no injected field breaks)."""
    out = [f"volume {v['name']}: hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        added = set(((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
        out += [f"{container['name']}: capability {c}" for c in sorted(added - BASELINE_CAPABILITIES)]
    return out


@pytest.mark.parametrize("mode", ["InitContainer", "Sidecar"])
@pytest.mark.parametrize(
    ("level", "checks", "reason"),
    [("restricted", restricted_violations, "pod-security-restricted"),
     ("baseline", baseline_violations, "pod-security-baseline")],
)
def test_a_node_cache_the_namespace_refuses_becomes_the_pods_own_empty_dir(
    mode: str, level: str, checks: Any, reason: str
) -> None:
    """A pod that passes its namespace's level still passes once injected for a cache with a node cache: the
    hostPath and the root preload are left out, the pod preloads into its emptyDir, and the annotation and the
    warning say why."""
    p = pod(containers=[RESTRICTED_APP], **RESTRICTED_POD)
    cache = view(preload={"mode": mode, "nodeCache": {"hostPath": "/var/cache/cc"}})
    patch = podpatch.build_pod_patch(p, cache, preloader_image="p", pod_security=level)
    out = patched_pod(p, patch)
    assert checks(out["spec"]) == []
    volume = next(v for v in out["spec"]["volumes"] if v["name"] == "compilecache-cache")
    assert volume == {"name": "compilecache-cache", "emptyDir": {"sizeLimit": cache.spec.preload.size_limit}}
    assert out["metadata"]["annotations"]["compilecache.io/node-cache-fallback"] == reason
    (warning,) = [w for w in patch.warnings if "node cache" in w]
    assert f"enforces Pod Security {level!r}" in warning and "emptyDir" in warning and "team-a/mlp" in warning
    assert "--owner" not in preload_of(out)["command"]
    # the same pod and cache where the level allows it: the node cache, no fallback
    shared = patched_pod(p, podpatch.build_pod_patch(p, cache, preloader_image="p", pod_security="privileged"))
    assert any("hostPath" in v for v in shared["spec"]["volumes"])
    assert "compilecache.io/node-cache-fallback" not in shared["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("labels", "default", "level"),
    [
        ({}, "privileged", "privileged"),
        ({}, "baseline", "baseline"),
        ({"pod-security.kubernetes.io/enforce": "baseline"}, "privileged", "baseline"),
        ({"pod-security.kubernetes.io/enforce": "privileged"}, "restricted", "privileged"),
        ({"pod-security.kubernetes.io/warn": "restricted"}, "privileged", "privileged"),  # warn refuses nothing
        ({"pod-security.kubernetes.io/enforce": "Restricted!"}, "privileged", "restricted"),  # as the API server
    ],
)
def test_the_enforced_level_of_a_namespace(labels: dict[str, str], default: str, level: str) -> None:
    assert podsecurity.enforced_level(labels, default) == level
    assert (podsecurity.node_cache_fallback(level) is None) == (level == "privileged")
