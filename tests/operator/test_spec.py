"""Spec parsing and validation, and the CRD schema agreeing with it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from compilecache_operator.model.spec import MAX_NAME_LENGTH, Defaults, InvalidSpec
from compilecache_operator.model.spec_fields import quantity_bytes
from compilecache_operator.model.spec_parse import parse_spec

from cachelib.in_image.compilekey import BUILTIN_TARGETS, dynamic_text, is_target
from cachelib.keyformat import CacheKey
from cachelib.stores.base import MAX_SEGMENT_LENGTH, InvalidObjectKey, check_key
from tests.operator.crdschema import CRD, crd_version, validator
from tests.operator.samples import parsed, raw_spec


def errors_of(spec: Any, defaults: Defaults | None = None) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(spec, defaults or Defaults())
    return {e.path: e.message for e in caught.value.errors}


def errors_of_named(spec: Any, name: str) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(spec, Defaults(), name=name)
    return {e.path: e.message for e in caught.value.errors}


def test_minimal_spec_gets_the_documented_defaults() -> None:
    spec = parsed()
    assert spec.image == "registry.example/workload:1"
    assert spec.model.target == "tiny_mlp" and spec.model.command is None
    assert spec.model.compile.mode == "default" and dynamic_text(spec.model.compile.dynamic) == "auto"
    assert spec.model.compile.backend == "inductor" and not spec.model.compile.fullgraph
    assert spec.gpu_types == () and not spec.gpu_discovery.auto
    assert spec.gpu_discovery.label_key == "nvidia.com/gpu.product"
    assert spec.warmup.backoff_limit == 2 and spec.warmup.active_deadline_seconds == 3600
    assert spec.warmup.gpus_per_job == 1 and spec.warmup.gpu_resource_name == "nvidia.com/gpu"
    assert spec.keep_generations == 2 and spec.deletion_policy == "Keep"
    assert spec.remote_cache is None and not spec.preload.strict and spec.preload.node_cache_path is None
    assert spec.preload.mode == "InitContainer"
    assert spec.storage.secret_name is None and spec.storage.secret_keys == ()
    assert spec.preload.deadline_seconds == 30
    assert spec.preload.size_limit == "16Gi" and spec.preload.size_limit_bytes == 16 * 2**30
    assert spec.preload.max_bytes is None and spec.preload.byte_budget == 16 * 2**30
    assert (spec.warmup.run_as_user, spec.warmup.run_as_group, spec.warmup.fs_group) == (65532, 65532, 65532)


def test_preload_deadline_size_limit_and_warmup_ids_parse() -> None:
    spec = parsed(preload={"deadlineSeconds": 600, "sizeLimit": "2G", "maxBytes": 10**9},
                  warmup={"securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 3000}})
    assert spec.preload.deadline_seconds == 600
    assert spec.preload.size_limit == "2G" and spec.preload.size_limit_bytes == 2 * 10**9
    assert spec.preload.byte_budget == 10**9
    assert (spec.warmup.run_as_user, spec.warmup.run_as_group, spec.warmup.fs_group) == (1000, 2000, 3000)
    only_user = parsed(warmup={"securityContext": {"runAsUser": 1001}}).warmup
    assert (only_user.run_as_user, only_user.run_as_group, only_user.fs_group) == (1001, 65532, 65532)
    assert parsed(preload={"sizeLimit": "512Mi", "maxBytes": 512 * 2**20}).preload.byte_budget == 512 * 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [("16Gi", 16 * 2**30), ("500M", 500 * 10**6), ("1e9", 10**9), ("1.5Ki", 1536), ("1", 1), ("2k", 2000),
     ("1500m", 2), (".5Mi", 2**19), ("+3Ti", 3 * 2**40), ("1E", 10**18), ("2Ei", 2 * 2**60),
     ("16GB", None), ("1K", None), ("-1Gi", None), ("lots", None), ("", None), ("1e99999999", None)],
)
def test_quantity_bytes_reads_kubernetes_quantities(text: str, expected: int | None) -> None:
    assert quantity_bytes(text) == expected


def test_full_spec_parses() -> None:
    spec = parsed(
        model={"command": "python serve.py --warmup", "compile": {"mode": "max-autotune", "dynamic": "false",
               "fullgraph": True, "compiledAutograd": True}, "backward": True},
        gpuTypes=["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"],
        gpuDiscovery={"auto": True, "labelKey": "example.com/gpu"},
        storage={"url": "s3://bucket/caches?endpoint=http://127.0.0.1:9000", "secretRef": {"name": "s3-creds"}},
        warmup={"resources": {"limits": {"memory": "16Gi", "cpu": 4}}, "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "gpusPerJob": 0, "env": [{"name": "HF_HOME", "value": "/tmp/hf"}]},
        retention={"keepGenerations": 5},
        deletionPolicy="Delete",
        remoteCache={"host": "redis.fleet", "autotune": False},
        preload={"strict": True, "maxBytes": 1 << 30, "nodeCache": {"hostPath": "/var/cache/cc"}},
    )
    assert spec.model.command == "python serve.py --warmup" and spec.model.backward
    assert spec.model.compile.harness_args() == [
        "--mode", "max-autotune", "--dynamic", "false", "--backend", "inductor", "--fullgraph", "--compiled-autograd",
    ]
    assert spec.gpu_discovery.label_key == "example.com/gpu"
    assert [(k.env, k.key, k.optional) for k in spec.storage.secret_keys] == [
        ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID", False),
        ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY", False),
        ("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN", True),
    ]
    assert spec.warmup.resources.limits == {"memory": "16Gi", "cpu": "4"}
    assert spec.warmup.env == ({"name": "HF_HOME", "value": "/tmp/hf"},)
    assert spec.remote_cache is not None and spec.remote_cache.env() == {
        "TORCHINDUCTOR_REDIS_HOST": "redis.fleet", "TORCHINDUCTOR_REDIS_PORT": "6379",
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
    }
    assert spec.preload.node_cache_path == "/var/cache/cc" and spec.preload.max_bytes == 1 << 30


@pytest.mark.parametrize(
    ("overrides", "path", "fragment"),
    [
        ({"image": None}, "spec.image", "required"),
        ({"model": {}}, "spec.model", "one of target, command or vllm"),
        ({"model": {"target": "tiny_mlp", "command": "x"}}, "spec.model", "only one"),
        ({"model": {"target": "not a target"}}, "spec.model.target", "module:function"),
        ({"model": {"target": "mymodel"}}, "spec.model.target",
         "is not module:function (mypkg.models:build) or a built-in target name (tiny_mlp, transformer_block, "
         "small_convnet)"),
        ({"model": {"target": "pkg.mod:"}}, "spec.model.target", "module:function"),
        ({"model": {"target": ":build"}}, "spec.model.target", "module:function"),
        ({"model": {"target": "m:f", "compile": {"mode": "fast"}}}, "spec.model.compile.mode", "not one of"),
        ({"model": {"target": "m:f", "compile": {"dynamic": "maybe"}}}, "spec.model.compile.dynamic", "not one of"),
        ({"storage": {"url": "ftp://host/x"}}, "spec.storage.url", "scheme"),
        ({"storage": {"url": "redis://127.0.0.1:notaport/0"}}, "spec.storage.url", "port"),
        ({"storage": {"url": "redis://:hunter2@redis:6379/0"}}, "spec.storage.url", "password"),
        ({"storage": {"url": "file:///srv/c", "secretRef": {"name": "s"}}}, "spec.storage.secretRef", "no credentials"),
        ({"storage": {"url": "redis://r/0", "secretRef": {"name": "s", "keys": {"accessKeyId": "a"}}}},
         "spec.storage.secretRef.keys.accessKeyId", "not a credential"),
        ({"storage": {"url": "redis://r/0", "secretRef": {"name": "Bad_Name"}}}, "spec.storage.secretRef.name",
         "not a Secret name"),
        ({"gpuTypes": ["NVIDIA-H100", "nvidia-h100"]}, "spec.gpuTypes[1]", "same GPU type"),
        ({"gpuTypes": ["NVIDIA H100"]}, "spec.gpuTypes[0]", "label value"),
        ({"warmup": {"resources": {"limits": {"memory": "lots"}}}}, "spec.warmup.resources.limits.memory",
         "quantity"),
        ({"warmup": {"backoffLimit": 11}}, "spec.warmup.backoffLimit", "from 0 to 10"),
        ({"warmup": {"tolerations": [{"operator": "Exists", "value": "x"}]}}, "spec.warmup.tolerations[0].value",
         "must be unset when operator is Exists"),
        ({"warmup": {"tolerations": [{"operator": "Equal", "value": "x"}]}}, "spec.warmup.tolerations[0].key",
         "required unless operator is Exists"),
        ({"warmup": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule",
                                      "tolerationSeconds": 30}]}},
         "spec.warmup.tolerations[0].tolerationSeconds", "only allowed with effect NoExecute"),
        ({"warmup": {"imagePullSecrets": [{"name": "Registry_Creds"}]}}, "spec.warmup.imagePullSecrets[0].name",
         "not a Secret name"),
        ({"storage": {"url": "s3://bucket/p", "secretRef": {"name": "s", "keys": {"accessKeyId": "key id"}}}},
         "spec.storage.secretRef.keys.accessKeyId", "not a Secret key"),
        ({"retention": {"keepGenerations": 0}}, "spec.retention.keepGenerations", "from 1 to 100"),
        ({"deletionPolicy": "Purge"}, "spec.deletionPolicy", "not one of"),
        ({"remoteCache": {"port": 6379}}, "spec.remoteCache.host", "required"),
        ({"preload": {"nodeCache": {"hostPath": "relative/dir"}}}, "spec.preload.nodeCache.hostPath", "absolute"),
        ({"preload": {"strict": "yes"}}, "spec.preload.strict", "true or false"),
        ({"preload": {"mode": "sidecar"}}, "spec.preload.mode", "not one of InitContainer, Sidecar"),
        ({"preload": {"deadlineSeconds": 0}}, "spec.preload.deadlineSeconds", "from 1 to 600"),
        ({"preload": {"deadlineSeconds": 601}}, "spec.preload.deadlineSeconds", "from 1 to 600"),
        ({"preload": {"deadlineSeconds": "30s"}}, "spec.preload.deadlineSeconds", "whole number"),
        ({"preload": {"sizeLimit": "16GB"}}, "spec.preload.sizeLimit", "not a positive quantity"),
        ({"preload": {"sizeLimit": "0"}}, "spec.preload.sizeLimit", "not a positive quantity"),
        ({"preload": {"sizeLimit": 17179869184}}, "spec.preload.sizeLimit", "must be a string"),
        ({"warmup": {"securityContext": {"runAsUser": 0}}}, "spec.warmup.securityContext.runAsUser",
         "from 1 to 2147483647"),
        ({"warmup": {"securityContext": {"runAsGroup": 0}}}, "spec.warmup.securityContext.runAsGroup",
         "from 1 to 2147483647"),
        ({"warmup": {"securityContext": {"fsGroup": -5}}}, "spec.warmup.securityContext.fsGroup",
         "from 1 to 2147483647"),
        ({"warmup": {"securityContext": "root"}}, "spec.warmup.securityContext", "must be an object"),
    ],
)
def test_invalid_specs_name_the_field(overrides: dict[str, Any], path: str, fragment: str) -> None:
    errors = errors_of(raw_spec(**overrides))
    assert path in errors, errors
    assert fragment in errors[path]


def test_sidecar_mode_parses_and_refuses_strict() -> None:
    assert parsed(preload={"mode": "Sidecar"}).preload.mode == "Sidecar"
    assert parsed(preload={"mode": "Sidecar", "strict": False}).preload.mode == "Sidecar"
    errors = errors_of(raw_spec(preload={"mode": "Sidecar", "strict": True}))
    assert list(errors) == ["spec.preload.strict"]
    assert errors["spec.preload.strict"].startswith("must be false with spec.preload.mode Sidecar: a sidecar runs "
                                                    "beside the workload and cannot hold the pod's start")
    with pytest.raises(InvalidSpec, match=r"spec\.preload\.strict: .* \(set spec\.preload\.mode InitContainer"):
        parse_spec(raw_spec(preload={"mode": "Sidecar", "strict": True}))


def test_the_name_must_fit_one_key_segment() -> None:
    assert MAX_NAME_LENGTH == MAX_SEGMENT_LENGTH == 200
    parse_spec(raw_spec(), name="a" * 200)
    parse_spec(raw_spec(), name="a" * 100 + "." + "b" * 99)
    errors = errors_of_named(raw_spec(), "a" * 201)
    assert list(errors) == ["metadata.name"]
    assert errors["metadata.name"].startswith("at most 200 characters, got 201: the name is one segment of every "
                                              "cache key")
    # with the spec's own problems, all at once
    errors = errors_of_named(raw_spec(deletionPolicy="Purge"), "n" * 253)
    assert set(errors) == {"metadata.name", "spec.deletionPolicy"}


def test_the_longest_name_makes_keys_every_store_accepts() -> None:
    """The limit is the real one: a key of a name of MAX_NAME_LENGTH passes the stores' key check, one more fails."""
    key = CacheKey(namespace="n" * 63, name="c" * MAX_NAME_LENGTH, model="0" * 16, options="1" * 16,
                   gpu="nvidia-h100-80gb-hbm3", capability="sm90", torch="2.13.0+cu130", triton="3.7.0",
                   cuda="13.0", py="3.12.11")
    check_key(str(key))
    longer = CacheKey(**{**key.to_dict(), "name": "c" * (MAX_NAME_LENGTH + 1)})
    with pytest.raises(InvalidObjectKey, match="segment"):
        check_key(str(longer))


@pytest.mark.parametrize("target", ["tiny_mlp", "transformer_block", "small_convnet", "models:build",
                                    "my_pkg.models.v2:build_model", "_private:_f"])
def test_targets_the_harness_runs_are_accepted(target: str) -> None:
    assert is_target(target) and parsed(model={"target": target}).model.target == target


def test_max_bytes_larger_than_the_size_limit_names_both_fields() -> None:
    errors = errors_of(raw_spec(preload={"sizeLimit": "1Gi", "maxBytes": 2**30 + 1}))
    assert list(errors) == ["spec.preload.maxBytes"]
    assert "spec.preload.sizeLimit 1Gi (1073741824 bytes)" in errors["spec.preload.maxBytes"]
    errors = errors_of(raw_spec(preload={"maxBytes": 16 * 2**30 + 1}))  # the default sizeLimit counts too
    assert "spec.preload.sizeLimit 16Gi" in errors["spec.preload.maxBytes"]


def test_every_problem_is_reported_at_once() -> None:
    errors = errors_of(raw_spec(image=None, deletionPolicy="Purge", gpuTypes=["a", "A"]))
    assert set(errors) == {"spec.image", "spec.deletionPolicy", "spec.gpuTypes[1]"}
    with pytest.raises(InvalidSpec, match=r"spec\.image: required; "):
        parse_spec(raw_spec(image=None, deletionPolicy="Purge"))


def test_a_missing_spec_and_a_missing_store_are_errors() -> None:
    assert errors_of(None) == {
        "spec": "required", "spec.image": "required", "spec.model": "required",
        "spec.storage.url": "required (the operator has no default store)",
    }


def test_operator_defaults_fill_what_the_spec_leaves_out() -> None:
    defaults = Defaults(gpu_label_key="example.com/gpu", storage_url="redis://shared:6379/1",
                        storage_secret="cache-creds", node_cache_path="/mnt/cc")
    spec = parse_spec({k: v for k, v in raw_spec().items() if k != "storage"}, defaults)
    assert spec.storage.url == "redis://shared:6379/1" and spec.storage.secret_name == "cache-creds"
    assert spec.gpu_discovery.label_key == "example.com/gpu"
    assert spec.preload.node_cache_path == "/mnt/cc"


@pytest.mark.parametrize("url", ["redis-cluster://node-0.cache:6379", "rediss-cluster://cfg.cache:6379?ca=/ca.pem"])
def test_a_redis_cluster_store_takes_the_redis_password(url: str) -> None:
    spec = parsed(storage={"url": url, "secretRef": {"name": "creds"}})
    assert [(k.env, k.key) for k in spec.storage.secret_keys] == [("COMPILECACHE_REDIS_PASSWORD", "password")]


def test_yaml_booleans_for_dynamic_are_understood() -> None:
    assert dynamic_text(parsed(model={"target": "m:f", "compile": {"dynamic": True}}).model.compile.dynamic) == "true"


# -- the CRD ---------------------------------------------------------------------------------------


def test_crd_identity_and_printer_columns() -> None:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "compilecaches.compilecache.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["singular"]) == ("CompileCache", "compilecaches", "compilecache")
    # A short name no other well-known API uses (Cluster API's ClusterClass is "cc"); categories are groups,
    # never the resource's own name.
    assert names["shortNames"] == ["ccache"]
    assert names["categories"] and names["singular"] not in names["categories"]
    version = crd_version()
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Bundles"]["jsonPath"] == ".status.bundleCount"
    assert all(columns[n].get("priority") == 1 for n in ("Reason", "Storage", "GPUs"))
    # AGE last, in the default and the wide output alike, as built-in resources show it.
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_crd_schema_is_structural_without_preserve_unknown_fields() -> None:
    def keys(node: Any) -> set[str]:
        if isinstance(node, dict):
            return set(node) | {k for v in node.values() for k in keys(v)}
        if isinstance(node, list):
            return {k for v in node for k in keys(v)}
        return set()

    used = keys(crd_version()["schema"])
    assert "x-kubernetes-preserve-unknown-fields" not in used

    def walk(node: dict[str, Any], path: str) -> None:
        if "anyOf" in node and node.get("x-kubernetes-int-or-string"):
            return
        if "oneOf" not in node and "anyOf" not in node:
            assert "type" in node, f"{path} has no type"
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")
        for branch in node.get("oneOf", []):
            assert set(branch) == {"required"}, f"{path}: oneOf branches may only require fields"

    walk(crd_version()["schema"]["openAPIV3Schema"], "")


def test_crd_accepts_what_the_operator_accepts() -> None:
    v = validator()
    samples = [
        raw_spec(),
        raw_spec(model={"command": "python x.py", "compile": {"dynamic": "true", "mode": "reduce-overhead"},
                        "precompile": "Auto"},
                 gpuTypes=["NVIDIA-H100-80GB-HBM3"], gpuDiscovery={"auto": True},
                 storage={"url": "s3://bucket/p", "secretRef": {"name": "c", "keys": {"sessionToken": "t"}}},
                 warmup={"resources": {"limits": {"cpu": 2, "memory": "8Gi"}}, "backoffLimit": 0,
                         "tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]},
                 retention={"keepGenerations": 3}, deletionPolicy="Delete",
                 remoteCache={"host": "r", "port": 6380},
                 preload={"strict": True, "nodeCache": {"hostPath": "/var/cache/x"}}),
        raw_spec(preload={"mode": "Sidecar", "maxBytes": 1 << 30}),
        raw_spec(storage={"url": "rediss-cluster://clustercfg.cache:6379?prefix=cc", "secretRef": {"name": "c"}}),
        raw_spec(preload={"deadlineSeconds": 600, "sizeLimit": "1.5Gi"},
                 warmup={"securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}}),
    ]
    for spec in samples:
        parse_spec(spec)
        v.validate({"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {}, "spec": spec})


def rules(node: Any, path: str = "", bounded: bool = True) -> list[tuple[str, dict[str, Any], bool]]:
    """Every CEL rule of the schema as (path, the node it sits on, whether every list and map above it is bounded)."""
    found = [(path, node, bounded)] if node.get("x-kubernetes-validations") else []
    for name, child in (node.get("properties") or {}).items():
        found += rules(child, f"{path}.{name}", bounded)
    if isinstance(node.get("items"), dict):
        found += rules(node["items"], f"{path}[]", bounded and "maxItems" in node)
    if isinstance(node.get("additionalProperties"), dict):
        found += rules(node["additionalProperties"], f"{path}{{}}", bounded and "maxProperties" in node)
    return found


def root_schema() -> dict[str, Any]:
    return crd_version()["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def test_crd_rules_have_messages_and_bounded_inputs() -> None:
    """The API server refuses rules it cannot bound the cost of; unbounded lists, maps and strings are the cause."""
    found = rules(root_schema())
    assert len(found) >= 9, [p for p, _, _ in found]
    for path, node, bounded in found:
        assert bounded, f"{path}: a list or map above this rule has no maxItems/maxProperties"
        for rule in node["x-kubernetes-validations"]:
            assert rule.get("message"), f"{path}: rule {rule['rule']!r} has no message"
        if node.get("type") == "string":
            assert "maxLength" in node, f"{path}: a string read by a rule needs maxLength"
        if path in ("", ".spec.model"):
            continue  # these rules read only metadata.name's size and has() of fields
        for name, child in (node.get("properties") or {}).items():
            if child.get("type") == "string":
                assert "maxLength" in child or "enum" in child, f"{path}.{name}: a string read by a rule is unbounded"


def test_crd_name_rule_is_the_key_segment_limit() -> None:
    (rule,) = root_schema()["x-kubernetes-validations"]
    assert rule["rule"] == f"self.metadata.name.size() <= {MAX_NAME_LENGTH}"
    assert rule["fieldPath"] == ".metadata.name" and rule["message"].startswith("metadata.name must be at most 200")


def test_crd_target_rule_lists_the_builtin_targets() -> None:
    target = root_schema()["properties"]["spec"]["properties"]["model"]["properties"]["target"]
    (rule,) = target["x-kubernetes-validations"]
    listed = rule["rule"].split(" in ", 1)[1]
    assert yaml.safe_load(listed) == list(BUILTIN_TARGETS)
    assert all(name in rule["message"] for name in BUILTIN_TARGETS)


# The CEL rules themselves are evaluated by a real API server in tests/e2e/test_crd_validation.py;
# jsonschema here checks the structural part (types, enums, bounds, patterns).
@pytest.mark.parametrize(
    "overrides",
    [
        {"model": {"target": "m:f", "compile": {"dynamic": True}}},
        {"gpuTypes": ["NVIDIA H100"]},
        {"deletionPolicy": "Purge"},
        {"storage": {"url": "ftp://x"}},
        {"warmup": {"backoffLimit": -1}},
        {"retention": {"keepGenerations": 0}},
        {"preload": {"nodeCache": {}}},
        {"preload": {"mode": "sidecar"}},
        {"preload": {"deadlineSeconds": 0}},
        {"preload": {"deadlineSeconds": 601}},
        {"preload": {"sizeLimit": 17179869184}},
        {"gpuTypes": ["a" * 64]},
        {"warmup": {"tolerations": [{"key": "k"}] * 33}},
        {"warmup": {"serviceAccountName": "Builder"}},
        {"warmup": {"imagePullSecrets": [{"name": "Registry_Creds"}]}},
        {"storage": {"url": "s3://bucket/p", "secretRef": {"name": "s", "keys": {"accessKeyId": "key id"}}}},
        {"remoteCache": {"host": "   "}},
        {"warmup": {"resources": {"limits": {"memory": "lots"}}}},
        {"preload": {"resources": {"requests": {"cpu": "-1"}}}},
        {"warmup": {"securityContext": {"runAsUser": 0}}},
        {"warmup": {"securityContext": {"runAsGroup": 0}}},
        {"warmup": {"securityContext": {"fsGroup": 0}}},
        {"model": {"target": "tiny_mlp", "precompile": "auto"}},
    ],
)
def test_crd_rejects_what_the_operator_rejects(overrides: dict[str, Any]) -> None:
    spec = raw_spec(**overrides)
    obj = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {}, "spec": spec}
    assert list(validator().iter_errors(obj)), f"the CRD schema accepts {overrides}"


def test_crd_defaults_match_the_parser() -> None:
    props = crd_version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    compile_props = props["model"]["properties"]["compile"]["properties"]
    warm = props["warmup"]["properties"]
    remote = props["remoteCache"]["properties"]
    spec = parsed(remoteCache={"host": "r"})
    assert compile_props["mode"]["default"] == spec.model.compile.mode
    assert compile_props["dynamic"]["default"] == dynamic_text(spec.model.compile.dynamic)
    assert compile_props["backend"]["default"] == spec.model.compile.backend
    assert warm["backoffLimit"]["default"] == spec.warmup.backoff_limit
    assert warm["activeDeadlineSeconds"]["default"] == spec.warmup.active_deadline_seconds
    assert warm["gpusPerJob"]["default"] == spec.warmup.gpus_per_job
    assert warm["gpuResourceName"]["default"] == spec.warmup.gpu_resource_name
    assert props["retention"]["properties"]["keepGenerations"]["default"] == spec.keep_generations
    assert props["deletionPolicy"]["default"] == spec.deletion_policy
    assert spec.remote_cache is not None and remote["port"]["default"] == spec.remote_cache.port
    assert props["preload"]["properties"]["mode"]["default"] == spec.preload.mode
    assert props["preload"]["properties"]["strict"]["default"] == spec.preload.strict
    assert props["preload"]["properties"]["deadlineSeconds"]["default"] == spec.preload.deadline_seconds
    assert props["preload"]["properties"]["sizeLimit"]["default"] == spec.preload.size_limit
    assert props["model"]["properties"]["precompile"]["default"] == spec.model.precompile


def test_parse_does_not_modify_its_input() -> None:
    raw = raw_spec(gpuTypes=["NVIDIA-H100"], warmup={"resources": {"limits": {"cpu": 1}}})
    before = copy.deepcopy(raw)
    parse_spec(raw)
    assert raw == before


def test_precompile_is_off_unless_auto_and_only_auto_changes_the_identity() -> None:
    off = parsed()
    assert off.model.precompile == "Off"
    assert "precompile" not in off.model.identity()  # caches made before the option keep their ids
    auto = parsed(model={"target": "tiny_mlp", "precompile": "Auto"})
    assert auto.model.precompile == "Auto" and auto.model.identity()["precompile"] == "Auto"
    assert parsed(model={"target": "tiny_mlp", "precompile": "Off"}).model.identity() == off.model.identity()
    errors = errors_of(raw_spec(model={"target": "tiny_mlp", "precompile": "on"}))
    assert "not one of Auto, Off" in errors["spec.model.precompile"]
