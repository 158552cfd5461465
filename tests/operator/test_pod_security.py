"""Everything the operator creates or injects passes the "restricted" Pod Security Standard, and the
preload runs as a user that leaves a cache the app's uid can write into."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from compilecache_operator import cacheview, podpatch, security, warmup_job
from compilecache_operator.names import PRELOAD_CONTAINER, PRELOAD_SHARE_ANNOTATION
from compilecache_operator.plan import BundleRecord, Variant
from compilecache_operator.podpatch import patched_pod
from compilecache_operator.spec import Defaults
from compilecache_operator.spec_parse import parse_spec

from tests.operator.restricted import restricted_violations
from tests.operator.samples import SETTINGS, env_of, flag, inject, owner, pod, view
from tests.operator.test_examples import EXAMPLES_DIR

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


def test_only_the_compile_container_keeps_a_writable_root() -> None:
    """harness and publish run the preloader image and write only into volumes (publish packs in
    TMPDIR=/work); compile runs the user's image, where torch writes temporary files anywhere."""
    spec = job_pod()
    harness, compile_ = spec["initContainers"]
    (publish,) = spec["containers"]
    assert harness["securityContext"]["readOnlyRootFilesystem"] is True
    assert publish["securityContext"]["readOnlyRootFilesystem"] is True
    assert "readOnlyRootFilesystem" not in compile_["securityContext"]
    assert env_of(publish)["TMPDIR"] == "/work"
    assert {m["mountPath"] for m in publish["volumeMounts"]} == {"/work"}


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
