"""The API server itself refuses bad CompileCaches, with the field path, through the CRD's schema and CEL rules.

Each case is also handed to the operator's parser, which must refuse it at the same field: the operator
validates again for objects stored before a rule existed, and the two must agree.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec
from hypothesis import HealthCheck, given, settings

from tests.chart.crd_files import fields
from tests.operator.example_files import QUICK_START_STORE
from tests.operator.specgen import Case, dotted, last_bad_specs
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CC_API, CRD_NAME, install_crd
from testsupport.kube.rest import KubeAPIError, KubeClient

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
CRDS_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def crd(kube_client: KubeClient) -> dict[str, Any]:
    """The canonical CRD, installed: the API server compiles its CEL rules and refuses it when they cost too much."""
    install_crd(kube_client)
    return kube_client.get(f"{CRDS_API}/{CRD_NAME}")


def compile_cache(name: str = "mlp", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "image": "registry.example/workload:1",
        "model": {"target": "tiny_mlp"},
        "storage": {"url": "redis://redis.cache:6379/0"},
    }
    body.update(spec)
    return {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": name},
            "spec": body}


def create(client: KubeClient, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return client.post(f"{CC_API}/namespaces/{namespace}/compilecaches", obj)


def refusal(client: KubeClient, namespace: str, obj: dict[str, Any]) -> dict[str, str]:
    """Create ``obj``, which must be refused as Invalid; returns field -> message of every cause."""
    with pytest.raises(KubeAPIError) as caught:
        create(client, namespace, obj)
    error = caught.value
    assert error.status == 422 and error.reason == "Invalid", str(error)
    causes = json.loads(error.body)["details"]["causes"]
    return {cause.get("field", ""): cause.get("message", "") for cause in causes}


def operator_refusal(obj: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(obj["spec"], name=obj["metadata"]["name"])
    return {e.path: e.message for e in caught.value.errors}


def test_the_crd_installs_with_its_rules(crd: dict[str, Any]) -> None:
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["x-kubernetes-validations"][0]["fieldPath"] == ".metadata.name"


def test_the_examples_are_accepted(crd: dict[str, Any], kube_client: KubeClient, kube_namespace: str) -> None:
    created = 0
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CompileCache":
                stored = create(kube_client, kube_namespace, doc)
                assert "deadlineSeconds" in stored["spec"]["preload"], f"{path.name}: the defaults were not applied"
                # examples/minimal.yaml leaves the store to the operator's default (the chart's storage.url)
                parse_spec(stored["spec"], Defaults(storage_url=QUICK_START_STORE), name=stored["metadata"]["name"])
                created += 1
    assert created >= 3


def test_defaults_and_the_longest_name_are_accepted(
    crd: dict[str, Any], kube_client: KubeClient, kube_namespace: str
) -> None:
    name = "c" * 200
    stored = create(kube_client, kube_namespace, compile_cache(
        name, preload={"sizeLimit": "2Gi", "maxBytes": 2 * 2**30, "deadlineSeconds": 600},
        warmup={"securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000},
                "resources": {"limits": {"cpu": 2, "memory": "8Gi"}},
                "tolerations": [{"operator": "Exists"}, {"key": "k", "effect": "NoExecute", "tolerationSeconds": 5}]},
        model={"target": "my_pkg.models:build"}))
    assert stored["metadata"]["name"] == name
    preload = stored["spec"]["preload"]
    assert (preload["mode"], preload["strict"], preload["deadlineSeconds"]) == ("InitContainer", False, 600)
    parse_spec(stored["spec"], name=name)
    defaulted = create(kube_client, kube_namespace, compile_cache("defaults"))["spec"]["preload"]
    assert (defaulted["deadlineSeconds"], defaulted["sizeLimit"]) == (30, "16Gi")


# (id, the object, the API server's field, a fragment of its message, the operator's field)
BAD: list[tuple[str, dict[str, Any], str, str, str]] = [
    # the name: one segment of every cache key
    ("name-too-long", compile_cache("n" * 201), "metadata.name", "at most 200 characters", "metadata.name"),
    # the model
    ("model-target-and-command", compile_cache(model={"target": "tiny_mlp", "command": "python x.py"}),
     "spec.model", "exactly one of target, command or vllm", "spec.model"),
    ("model-neither", compile_cache(model={"backward": True}), "spec.model", "exactly one of target, command or vllm",
     "spec.model"),
    ("model-target-not-builtin", compile_cache(model={"target": "mymodel"}), "spec.model.target",
     "module:function", "spec.model.target"),
    ("model-target-syntax", compile_cache(model={"target": "my-pkg:build"}), "spec.model.target",
     "built-in target name", "spec.model.target"),
    # the store
    ("storage-password-in-url", compile_cache(storage={"url": "redis://:hunter2@redis.cache:6379/0"}),
     "spec.storage.url", "must not carry user info", "spec.storage.url"),
    ("storage-token-as-user", compile_cache(storage={"url": "redis://TOKEN@redis.cache:6379/0"}),
     "spec.storage.url", "must not carry user info", "spec.storage.url"),
    ("storage-password-in-query", compile_cache(storage={"url": "redis://redis.cache:6379/0?password=PW"}),
     "spec.storage.url", "query parameter", "spec.storage.url"),
    ("storage-fragment", compile_cache(storage={"url": "redis://:pa#PW@h"}), "spec.storage.url", "must not",
     "spec.storage.url"),
    # the image
    ("image-shell", compile_cache(image="img:1; rm -rf /"), "spec.image", "should match", "spec.image"),
    ("image-leading-space", compile_cache(image=" registry.example/app:1"), "spec.image", "should match",
     "spec.image"),
    ("storage-file-credentials", compile_cache(storage={"url": "file:///srv/cache", "secretRef": {"name": "s"}}),
     "spec.storage.secretRef", "file://", "spec.storage.secretRef"),
    ("storage-foreign-credential",
     compile_cache(storage={"url": "redis://r:6379/0", "secretRef": {"name": "s", "keys": {"accessKeyId": "id"}}}),
     "spec.storage.secretRef.keys", "password is for redis://", "spec.storage.secretRef.keys.accessKeyId"),
    # the warm-up
    ("warmup-root", compile_cache(warmup={"securityContext": {"runAsUser": 0}}),
     "spec.warmup.securityContext.runAsUser", "greater than or equal to 1", "spec.warmup.securityContext.runAsUser"),
    ("warmup-quantity", compile_cache(warmup={"resources": {"limits": {"memory": "lots"}}}),
     "spec.warmup.resources.limits.memory", "should match", "spec.warmup.resources.limits.memory"),
    ("warmup-toleration-value", compile_cache(warmup={"tolerations": [{"operator": "Exists", "value": "x"}]}),
     "spec.warmup.tolerations[0].value", "unset when operator is Exists", "spec.warmup.tolerations[0].value"),
    ("warmup-toleration-seconds",
     compile_cache(warmup={"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 9}]}),
     "spec.warmup.tolerations[0].tolerationSeconds", "NoExecute", "spec.warmup.tolerations[0].tolerationSeconds"),
    ("warmup-toleration-key", compile_cache(warmup={"tolerations": [{"key": "$(id);x", "operator": "Exists"}]}),
     "spec.warmup.tolerations[0].key", "should match", "spec.warmup.tolerations[0].key"),
    ("warmup-node-selector-key", compile_cache(warmup={"nodeSelector": {"bad key!": "v"}}),
     "spec.warmup.nodeSelector", "label key", "spec.warmup.nodeSelector"),
    ("warmup-node-selector-value", compile_cache(warmup={"nodeSelector": {"pool": "v" * 10_240}}),
     "spec.warmup.nodeSelector.pool", "may not be more than 63", "spec.warmup.nodeSelector.pool"),
    ("warmup-resource-name", compile_cache(warmup={"resources": {"limits": {"gpü": "1"}}}),
     "spec.warmup.resources.limits", "container resource", "spec.warmup.resources.limits"),
    ("warmup-deadline", compile_cache(warmup={"activeDeadlineSeconds": 4611686018427387904}),
     "spec.warmup.activeDeadlineSeconds", "less than or equal to 604800", "spec.warmup.activeDeadlineSeconds"),
    ("remote-cache-host", compile_cache(remoteCache={"host": "bad value"}), "spec.remoteCache.host", "should match",
     "spec.remoteCache.host"),
    # the preload
    ("preload-host-path-root", compile_cache(preload={"nodeCache": {"hostPath": "/"}}),
     "spec.preload.nodeCache.hostPath", "should match", "spec.preload.nodeCache.hostPath"),
    ("preload-host-path-etc", compile_cache(preload={"nodeCache": {"hostPath": "/etc"}}),
     "spec.preload.nodeCache.hostPath", "system directory", "spec.preload.nodeCache.hostPath"),
    ("preload-host-path-kubelet", compile_cache(preload={"nodeCache": {"hostPath": "/var/lib/kubelet/x"}}),
     "spec.preload.nodeCache.hostPath", "system directory", "spec.preload.nodeCache.hostPath"),
    ("preload-sidecar-strict", compile_cache(preload={"mode": "Sidecar", "strict": True}), "spec.preload.strict",
     "must be false with spec.preload.mode Sidecar", "spec.preload.strict"),
    ("preload-max-bytes-over-size-limit", compile_cache(preload={"sizeLimit": "1Gi", "maxBytes": 2**30 + 1}),
     "spec.preload.maxBytes", "spec.preload.sizeLimit", "spec.preload.maxBytes"),
    ("preload-size-limit", compile_cache(preload={"sizeLimit": "16GB"}), "spec.preload.sizeLimit",
     "positive quantity", "spec.preload.sizeLimit"),
    ("preload-deadline", compile_cache(preload={"deadlineSeconds": 601}), "spec.preload.deadlineSeconds",
     "less than or equal to 600", "spec.preload.deadlineSeconds"),
    ("preload-host-path", compile_cache(preload={"nodeCache": {"hostPath": "/var/cache/../../etc"}}),
     "spec.preload.nodeCache.hostPath", "without '..'", "spec.preload.nodeCache.hostPath"),
    # plain schema keywords
    ("gpu-types-duplicate", compile_cache(gpuTypes=["NVIDIA-H100", "NVIDIA-H100"]), "spec.gpuTypes[1]",
     "Duplicate value", "spec.gpuTypes[1]"),
    ("deletion-policy", compile_cache(deletionPolicy="Purge"), "spec.deletionPolicy", "supported values",
     "spec.deletionPolicy"),
]


@pytest.mark.parametrize(("obj", "field", "fragment", "operator_field"), [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_a_bad_object_is_refused_with_its_field_path(
    crd: dict[str, Any], kube_client: KubeClient, kube_namespace: str,
    obj: dict[str, Any], field: str, fragment: str, operator_field: str,
) -> None:
    causes = refusal(kube_client, kube_namespace, copy.deepcopy(obj))
    assert field in causes, causes
    assert fragment in causes[field], causes
    assert operator_field in operator_refusal(obj)


LAST_BAD = itertools.count()


@settings(max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=last_bad_specs())
def test_the_last_bad_specs_are_refused_at_their_field_by_the_api_server_and_the_operator(
    crd: dict[str, Any], kube_client: KubeClient, kube_namespace: str, case: Case,
) -> None:
    """Generated relatives of what a sweep found accepted: a NUL byte in text a container gets (patterns), a GPU
    resource that is not an extended resource, a resource no node offers, a store port outside 1..65535 (CEL)."""
    obj = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
           "metadata": {"name": f"last-bad-{next(LAST_BAD)}"}, "spec": case.spec}
    causes = refusal(kube_client, kube_namespace, copy.deepcopy(obj))
    field = dotted(case.path)
    assert any(cause == field or cause.startswith(f"{field}.") for cause in causes), (field, causes)
    assert field in operator_refusal(obj)


def test_an_update_is_judged_by_the_same_rules(
    crd: dict[str, Any], kube_client: KubeClient, kube_namespace: str
) -> None:
    create(kube_client, kube_namespace, compile_cache("updated", preload={"mode": "Sidecar"}))
    path = f"{CC_API}/namespaces/{kube_namespace}/compilecaches/updated"
    with pytest.raises(KubeAPIError) as caught:
        kube_client.merge_patch(path, {"spec": {"preload": {"strict": True}}})
    assert caught.value.status == 422 and "spec.preload.strict" in str(caught.value)
    kube_client.merge_patch(path, {"spec": {"preload": {"mode": "InitContainer", "strict": True}}})
    assert kube_client.get(path)["spec"]["preload"]["strict"] is True


def test_kubectl_explain_describes_every_field(
    crd: dict[str, Any], kube_cluster: LocalCluster, kubectl_bin: Path
) -> None:
    """`kubectl explain compilecache.<field>` against the real API server shows each field's
    description (served from the CRD through OpenAPI v3)."""
    def explain(field: str) -> subprocess.CompletedProcess[str]:
        argv = [str(kubectl_bin), "--kubeconfig", str(kube_cluster.kubeconfig), "--cache-dir", str(cache), "explain"]
        return subprocess.run([*argv, f"compilecache.{field}"], capture_output=True, text=True, timeout=60, check=False)

    cache = kube_cluster.workdir / "kubectl-cache"
    for _ in range(60):  # the API server publishes a new CRD's OpenAPI a few seconds after it is established
        if explain("spec").returncode == 0:
            break
        shutil.rmtree(cache, ignore_errors=True)
        time.sleep(1)
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for top in ("spec", "status"):
        for path, schema in [(top, root[top]), *fields(root[top], top)]:
            proc = explain(path)
            assert proc.returncode == 0, proc.stderr
            explained = " ".join(proc.stdout.split("DESCRIPTION:")[1].split("FIELDS:")[0].split())
            assert explained.startswith(" ".join(schema["description"].split())[:60]), (path, proc.stdout)
