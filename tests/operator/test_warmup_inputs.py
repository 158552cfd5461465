"""Warm-ups that take Secrets and volumes: `warmup.env[].valueFrom` reaches the Job (not pruned),
`warmup.volumes` + `volumeMounts` mount model weights and CA files into the compile container, and
what would break the warm-up or the "restricted" standard is refused with the field path — by the
operator's parser and by the CRD schema alike."""

from __future__ import annotations

from typing import Any

import pytest
from compilecache_operator.decisions import warmup_job
from compilecache_operator.decisions.plan import Variant
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.crdschema import validator
from tests.operator.restricted import restricted_violations
from tests.operator.samples import SETTINGS, owner

HF_TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}
REGION = {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "region", "optional": True}}}
VOLUMES = [
    {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-weights", "readOnly": True}},
    {"name": "ca", "secret": {"secretName": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.pem"}]}},
    {"name": "conf", "configMap": {"name": "site", "optional": True}},
    {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
]
MOUNTS = [
    {"name": "weights", "mountPath": "/models/llama", "readOnly": True},
    {"name": "ca", "mountPath": "/etc/redis-ca"},
    {"name": "conf", "mountPath": "/etc/site/site.yaml", "subPath": "site.yaml"},
    {"name": "scratch", "mountPath": "/scratch"},
]
WARMUP = {
    "env": [{"name": "HF_HOME", "value": "/tmp/hf"}, HF_TOKEN, REGION],
    "volumes": VOLUMES,
    "volumeMounts": MOUNTS,
}


def build(warmup: dict[str, Any]) -> dict[str, Any]:
    body = owner(warmup=warmup)
    spec = parse_spec(body["spec"], Defaults())
    variant = Variant(id="0123456789", gpu="", image=spec.image)
    job = warmup_job.build_job(body, spec, variant, name="cc-mlp-0123456789-g1", job_id="cc-abc", settings=SETTINGS)
    return dict(job["spec"]["template"]["spec"])


def test_env_from_secrets_and_config_maps_reaches_the_compile_container() -> None:
    pod = build(WARMUP)
    compile_ = pod["initContainers"][1]
    assert compile_["env"][-3:] == [{"name": "HF_HOME", "value": "/tmp/hf"}, HF_TOKEN, REGION]
    publish = pod["containers"][0]
    assert not any(e["name"] in ("HF_TOKEN", "REGION") for e in publish.get("env", []))  # only the compile step


def test_volumes_are_added_and_mounted_in_the_compile_container_only() -> None:
    pod = build(WARMUP)
    assert pod["volumes"][2:-1] == VOLUMES
    assert [v["name"] for v in (pod["volumes"][:2] + pod["volumes"][-1:])] == ["harness", "work", "compilecache-tmp"]
    compile_ = pod["initContainers"][1]
    assert compile_["volumeMounts"][2:] == [
        {"name": "weights", "mountPath": "/models/llama", "readOnly": True},
        {"name": "ca", "mountPath": "/etc/redis-ca", "readOnly": False},
        {"name": "conf", "mountPath": "/etc/site/site.yaml", "readOnly": False, "subPath": "site.yaml"},
        {"name": "scratch", "mountPath": "/scratch", "readOnly": False},
        {"name": "compilecache-tmp", "mountPath": "/tmp"},
    ]
    for container in (pod["initContainers"][0], pod["containers"][0]):
        assert {m["name"] for m in container["volumeMounts"]} <= {"harness", "work"}
    assert restricted_violations(pod) == []


def test_the_crd_schema_accepts_the_same_warmup() -> None:
    errors = list(validator().iter_errors(owner(warmup=WARMUP)))
    assert errors == []


BAD = [
    (
        {"env": [{"name": "T", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "spec.warmup.env[0]",
        "not both",
    ),
    (
        {"env": [{"name": "T", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
        "spec.warmup.env[0].valueFrom",
        "exactly one of secretKeyRef, configMapKeyRef",
    ),
    (
        {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}]},
        "spec.warmup.env[0].valueFrom.secretKeyRef.name",
        "not a Secret name",
    ),
    (
        {"env": [{"name": "T", "valueFrom": {"configMapKeyRef": {"name": "c"}}}]},
        "spec.warmup.env[0].valueFrom.configMapKeyRef.key",
        "required",
    ),
    (
        {"volumes": [{"name": "w", "hostPath": {"path": "/etc"}}]},
        "spec.warmup.volumes[0].hostPath",
        "not a volume type a warm-up may use",
    ),
    (
        {"volumes": [{"name": "w", "secret": {"secretName": "s"}, "emptyDir": {}}]},
        "spec.warmup.volumes[0]",
        "exactly one of",
    ),
    ({"volumes": [{"name": "work", "emptyDir": {}}]}, "spec.warmup.volumes[0].name", "the warm-up's own volume"),
    (
        {"volumes": [{"name": "w", "emptyDir": {}}, {"name": "w", "emptyDir": {}}]},
        "spec.warmup.volumes[1].name",
        "given twice",
    ),
    (
        {"volumes": [{"name": "w", "secret": {"secretName": "s", "items": [{"key": "k", "path": "../x"}]}}]},
        "spec.warmup.volumes[0].secret.items[0].path",
        "relative path",
    ),
    (
        {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
        "spec.warmup.volumeMounts[0].name",
        "not a volume in spec.warmup.volumes",
    ),
    (
        {"volumes": [{"name": "w", "emptyDir": {}}], "volumeMounts": [{"name": "w", "mountPath": "/work/out"}]},
        "spec.warmup.volumeMounts[0].mountPath",
        "overlaps the warm-up's own directory /work",
    ),
    (
        {"volumes": [{"name": "w", "emptyDir": {}}], "volumeMounts": [{"name": "w", "mountPath": "/opt"}]},
        "spec.warmup.volumeMounts[0].mountPath",
        "overlaps the warm-up's own directory /opt/compilecache-harness",
    ),
    (
        {"volumes": [{"name": "w", "emptyDir": {}}], "volumeMounts": [{"name": "w", "mountPath": "models"}]},
        "spec.warmup.volumeMounts[0].mountPath",
        "absolute path",
    ),
]


@pytest.mark.parametrize(("warmup", "field", "fragment"), BAD, ids=[case[1] + ":" + case[2] for case in BAD])
def test_bad_inputs_are_refused_with_the_field_path(warmup: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(owner(warmup=warmup)["spec"], Defaults())
    found = {e.path: e.message for e in caught.value.errors}
    assert field in found and fragment in found[field], found
