"""CompileCache specs for property tests: valid ones, and one-field corruptions of them drawn from the CRD's
schema (wrong type, out of range, bad format, unicode, 10 KB strings, shell metacharacters, credentials
in URLs); and the checks every outcome must pass (no Job from an invalid value, no blank status, no secret)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from compilecache_operator.controller.state import Settings
from compilecache_operator.decisions import warmup_job
from compilecache_operator.model import formats
from compilecache_operator.model.spec import Defaults
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "compilecache.io_compilecaches.yaml"
SECRET = "Zq7SECRETpw"
"""The credential every credential-carrying corruption holds: it must never be shown."""
PRELOADER = "ghcr.io/compilecache/preloader:1"
SETTINGS = Settings(defaults=Defaults(), jobs=warmup_job.JobSettings(preloader_image=PRELOADER))

Step = str | int
"""A property name, or 0 for a list's item, or ``{}`` for any key of a map."""
ANY_KEY = "{}"


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


Leaf = tuple[tuple[Step, ...], Mapping[str, Any]]


def leaves(node: Mapping[str, Any], path: tuple[Step, ...] = ()) -> Iterator[Leaf]:
    """Every field of the schema with its node: objects, lists and maps too (a whole one can be wrong)."""
    if path:
        yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from leaves(child, (*path, name))
    if isinstance(node.get("items"), dict):
        yield from leaves(node["items"], (*path, 0))
    if isinstance(node.get("additionalProperties"), dict):
        yield from leaves(node["additionalProperties"], (*path, ANY_KEY))


LEAVES = list(leaves(spec_schema()))
HOT = ("image", "url", "host", "hostPath", "key", "value", "tolerationSeconds", "activeDeadlineSeconds", "nodeSelector",
       "limits", "requests", "gpuResourceName")
"""The fields the sweeps found holes in: drawn as often as all the others together."""
HOT_LEAVES = [(path, node) for path, node in LEAVES if path[-1] in HOT or (path[-1] == ANY_KEY and path[-2] in HOT)]

BASES: list[dict[str, Any]] = [
    {"image": "registry.example/workload:1", "model": {"target": "tiny_mlp"},
     "storage": {"url": "redis://redis.cache:6379/0"}},
    {"image": "registry.example:5000/team/app:2.1", "model": {"command": "python train.py --steps 3",
                                                               "compile": {"mode": "max-autotune"}},
     "gpuTypes": ["NVIDIA-L4"],
     "storage": {"url": "s3://bucket/prefix?region=eu-west-1", "secretRef": {"name": "s3-creds"}},
     "warmup": {"nodeSelector": {"example.com/pool": "gpu"}, "resources": {"limits": {"cpu": "4", "memory": "8Gi"}},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "activeDeadlineSeconds": 7200, "gpuResourceName": "nvidia.com/gpu"},
     "remoteCache": {"host": "redis.cache"},
     "preload": {"nodeCache": {"hostPath": "/var/cache/compilecache"}, "resources": {"limits": {"memory": "1Gi"}}}},
]

URL_FORMS = [
    f"redis://{SECRET}@h:6379/0", f"redis://:{SECRET}@h:6379/0", f"redis://h:6379/0?password={SECRET}",
    f"redis://:pa#{SECRET}@h", f"redis://:pa/{SECRET}@h", f"redis://:pa?{SECRET}@h", f"s3://bucket/p?secret={SECRET}",
    f"rediss://user:{SECRET}@h:6380/0?ca=/etc/ca.pem", f"redis://h:6379/0#{SECRET}",
    f"s3://bucket/p?endpoint=http://admin:{SECRET}@minio:9000",
]
TEXTS = [
    "", " leading", "trailing ", "ünïcødé", "日本", "a\nb", "x" * 10_240, "$(id);`rm -rf /`|&>x", "../../etc",
    "/", "/etc", "/var/lib/kubelet", "UPPER_case", "-dash", "a" * 64, "a.b/c", "@", "null",
]


def with_nul(text: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    """Text with a NUL byte somewhere (and other control characters around it, which a runtime takes)."""
    around = text if text is not None else st.text(st.characters(max_codepoint=0x7F), max_size=12)
    return st.tuples(around, around).map(lambda t: f"{t[0]}\x00{t[1]}")


NATIVE_DOMAINS = st.sampled_from(["", "node.", "x.", "sub.example.", "k8s."])
NAME_PART = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
NOT_EXTENDED = st.one_of(
    st.sampled_from(["cpu", "memory", "ephemeral-storage", "pods", "hugepages-2Mi", "hugepages-1Gi", "storage",
                     "kubernetes.io/hostname", "requests.nvidia.com/gpu"]),
    NAME_PART,  # no domain: Kubernetes' own
    st.builds(lambda d, n: f"{d}kubernetes.io/{n}", NATIVE_DOMAINS, NAME_PART),
    st.builds(lambda d, n: f"requests.{d}example.com/{n}", NATIVE_DOMAINS, NAME_PART),
    st.builds(lambda n: f"{'a' * 241}.com/{n}", NAME_PART),  # requests.<domain> past 253 characters
)
"""Resource names that are not extended resources (Kubernetes' IsExtendedResourceName): no GPU, or no node."""
BAD_PORTS = st.one_of(st.integers(1, 5).map(lambda n: "0" * n), st.integers(65536, 10**9).map(str))
PORT_URLS = ["redis://redis.cache:{port}/0", "rediss://redis.cache:{port}/1?prefix=p",
             "redis-cluster://redis.cache:7000?nodes=a:7001,b:{port}", "s3://bucket/p?endpoint=http://minio:{port}",
             "s3://bucket/p?region=eu-west-1&endpoint=https://minio.storage.svc:{port}/"]


@dataclass(frozen=True)
class Case:
    """One generated spec: where it differs from a valid base (``path``), and how (``kind``)."""

    spec: dict[str, Any]
    path: tuple[Step, ...]
    kind: str
    value: Any


def wrong_values(path: tuple[Step, ...], node: Mapping[str, Any]) -> st.SearchStrategy[tuple[str, Any]]:
    """Values of the wrong type, range or format for the field at ``path``."""
    kind = node.get("type")
    options: list[st.SearchStrategy[tuple[str, Any]]] = [
        st.sampled_from([("type", v) for v in ([1, True, None] if kind == "string" else ["12", [], {}])]),
    ]
    if kind == "string" or node.get("x-kubernetes-int-or-string") or "anyOf" in node:
        options.append(st.sampled_from([("format", t) for t in TEXTS]))
        options.append(st.text(max_size=40).map(lambda t: ("unicode", t)))
        options.append(with_nul().map(lambda t: ("nul", t)))
        if path[-1] == "url":
            options.append(st.sampled_from([("credential", u) for u in URL_FORMS]))
    if kind == "integer":
        bounds = [node.get("minimum", 0) - 1, node.get("maximum", 2**31) + 1, 2**62, -(2**63), 4611686018427387904]
        options.append(st.sampled_from([("range", b) for b in bounds]))
        options.append(st.sampled_from([("type", 1.5), ("type", "1")]))
    if kind == "boolean":
        options.append(st.sampled_from([("type", "yes"), ("type", 1)]))
    if "enum" in node:
        options.append(st.sampled_from([("enum", "Nope"), ("enum", str(node["enum"][0]).lower() + " ")]))
    return st.one_of(options)


def schema_values(node: Mapping[str, Any]) -> st.SearchStrategy[tuple[str, Any]]:
    """Values the schema's own type, pattern, enum and bounds allow (from the schema, not from samples)."""
    kind = node.get("type")
    if "enum" in node:
        return st.sampled_from([("schema", v) for v in node["enum"]])
    if kind == "integer":
        return st.integers(node.get("minimum", -(2**31)), node.get("maximum", 2**31)).map(lambda v: ("schema", v))
    if kind == "boolean":
        return st.booleans().map(lambda v: ("schema", v))
    if kind == "string" and "pattern" in node:
        size = node.get("maxLength", 64)
        return st.from_regex(node["pattern"].replace("$", r"\Z"), fullmatch=False).filter(
            lambda v: len(v) <= size).map(lambda v: ("schema", v))
    if kind == "string":
        return st.text(alphabet=st.characters(codec="ascii"), min_size=node.get("minLength", 0),
                       max_size=min(node.get("maxLength", 64), 64)).map(lambda v: ("schema", v))
    return st.just(("schema", {} if kind == "object" else []))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A valid base spec with one field set: mostly to a wrong value, sometimes to a value from the schema,
    sometimes a map key made wrong."""
    base = copy.deepcopy(draw(st.sampled_from(BASES)))
    path, node = draw(st.one_of(st.sampled_from(LEAVES), st.sampled_from(HOT_LEAVES)))
    if ANY_KEY in path and draw(st.booleans()):
        key = draw(st.sampled_from(["bad key!", "ключ", "k" * 10_240, "$(id)", "a/b/c", "-x", "x" * 64]))
        cut = path.index(ANY_KEY)
        target = _container(base, path[:cut])
        if isinstance(target, dict):
            target[key] = draw(schema_values(node))[1] if cut == len(path) - 1 else {}
        return Case(base, path[:cut], "key", key)
    kind, value = draw(st.one_of(wrong_values(path, node), schema_values(node)))
    parent = _container(base, path[:-1])
    _set(parent, path[-1], value)
    return Case(base, path, kind, value)


@st.composite
def last_bad_specs(draw: st.DrawFn) -> Case:
    """One of the bad values a sweep found accepted (issue-level examples and their generated relatives): a NUL
    byte in text a container gets, a GPU resource that is not an extended resource, a container resource no
    node offers, a store port outside 1..65535. Each in an otherwise valid base spec."""
    spec = copy.deepcopy(draw(st.sampled_from(BASES)))
    kind = draw(st.sampled_from(["nul", "gpu-resource", "resource-name", "port"]))
    if kind == "nul":
        text = draw(with_nul())
        where = draw(st.sampled_from(["command", "inductorConfig", "env", "url"]))
        if where == "command":
            spec["model"] = {"command": text}
            return Case(spec, ("model", "command"), kind, text)
        if where == "inductorConfig":
            spec["model"]["compile"] = {**spec["model"].get("compile", {}), "inductorConfig": {"max_autotune": text}}
            return Case(spec, ("model", "compile", "inductorConfig", "max_autotune"), kind, text)
        if where == "env":
            spec.setdefault("warmup", {})["env"] = [{"name": "HF_HOME", "value": text}, {"name": "OK", "value": "1"}]
            return Case(spec, ("warmup", "env", 0, "value"), kind, text)
        url = f"{spec['storage']['url']}{'&' if '?' in spec['storage']['url'] else '?'}prefix={text}"
        spec["storage"]["url"] = url
        return Case(spec, ("storage", "url"), kind, url)
    if kind == "gpu-resource":
        name = draw(NOT_EXTENDED)
        spec.setdefault("warmup", {})["gpuResourceName"] = name
        return Case(spec, ("warmup", "gpuResourceName"), kind, name)
    if kind == "resource-name":
        name = draw(NOT_EXTENDED.filter(lambda n: "/" in n))
        part = draw(st.sampled_from(["limits", "requests"]))
        section = draw(st.sampled_from(["resources", "helperResources"]))
        resources = spec.setdefault("warmup", {}).setdefault(section, {})
        resources.setdefault("limits", {})[name] = "1"
        if part == "requests":
            resources.setdefault("requests", {})[name] = "1"
        return Case(spec, ("warmup", section, part), kind, name)
    url = draw(st.sampled_from(PORT_URLS)).format(port=draw(BAD_PORTS))
    spec["storage"] = {**spec["storage"], "url": url}
    if url.startswith("redis"):
        spec["storage"].pop("secretRef", None)  # the S3 base's Secret keys are no Redis credentials
    return Case(spec, ("storage", "url"), kind, url)


def spec_problems(spec: Mapping[str, Any]) -> list[str]:
    """What a spec that was given a Job must not say, though the Job itself is valid Kubernetes: a GPU resource
    that is not an extended resource (the warm-up would get no GPU: ``cpu: 1`` is a valid limit)."""
    warmup = spec.get("warmup")
    name = warmup.get("gpuResourceName") if isinstance(warmup, Mapping) else None
    reason = formats.extended_resource_problem(name) if isinstance(name, str) else None
    return [f"gpuResourceName {name[:80]!r}: {reason}"] if isinstance(name, str) and reason else []


def _container(spec: dict[str, Any], path: tuple[Step, ...]) -> Any:
    """The object or list at ``path``, made (as an empty object, or a list of one) where missing."""
    node: Any = spec
    for i, step in enumerate(path):
        nxt = path[i + 1] if i + 1 < len(path) else None
        fresh: Any = [{}] if nxt == 0 else {}
        if step == 0:
            if not isinstance(node, list):
                return node
            if not node:
                node.append(fresh)
            node = node[0]
            continue
        if step == ANY_KEY:
            if not isinstance(node, dict):
                return node
            key = next(iter(node), "example.com/key")
            node = node.setdefault(key, fresh)
            continue
        if not isinstance(node, dict):
            return node
        if not isinstance(node.get(step), dict | list):
            node[step] = fresh
        node = node[step]
    return node


def _set(parent: Any, step: Step, value: Any) -> None:
    if step == 0 and isinstance(parent, list):
        parent[:1] = [value]
    elif step == ANY_KEY and isinstance(parent, dict):
        parent[next(iter(parent), "example.com/key")] = value
    elif isinstance(parent, dict) and isinstance(step, str):
        parent[step] = value


def dotted(path: tuple[Step, ...]) -> str:
    """``spec.warmup.tolerations[0].key`` for a path; a map's key as ``.KEY``, cut there."""
    out = "spec"
    for step in path:
        if step == 0:
            out += "[0]"
        elif step == ANY_KEY:
            break
        else:
            out += f".{step}"
    return out


# -- what every outcome must pass ---------------------------------------------------------------------------
def job_problems(job: Mapping[str, Any]) -> list[str]:
    """What Kubernetes (or a registry, or a node) would refuse or regret in a warm-up Job the operator built:
    checked on the Job itself, independently of how the spec was parsed."""
    problems: list[str] = []
    pod = job["spec"]["template"]["spec"]

    def check(what: str, value: Any, problem: Any) -> None:
        reason = problem(value) if isinstance(value, str) else f"not a string: {value!r}"
        if reason:
            problems.append(f"{what} {str(value)[:80]!r}: {reason}")

    for meta in (job["metadata"], job["spec"]["template"].get("metadata") or {}):
        for key, value in (meta.get("labels") or {}).items():
            check("label key", key, formats.qualified_name_problem)
            check("label value", value, formats.label_value_problem)
    for key, value in (pod.get("nodeSelector") or {}).items():
        check("nodeSelector key", key, formats.qualified_name_problem)
        check("nodeSelector value", value, formats.label_value_problem)
    for toleration in pod.get("tolerations") or []:
        if "key" in toleration:
            check("toleration key", toleration["key"], formats.qualified_name_problem)
        if "value" in toleration:
            check("toleration value", toleration["value"], formats.label_value_problem)
        seconds = toleration.get("tolerationSeconds", 0)
        if not 0 <= seconds <= 365 * 24 * 3600:
            problems.append(f"tolerationSeconds {seconds}")
    for container in [*(pod.get("initContainers") or []), *pod["containers"]]:
        check("image", container["image"], formats.image_problem)
        for part in ("limits", "requests"):
            for name in (container.get("resources") or {}).get(part) or {}:
                check("resource name", name, formats.resource_name_problem)
        for env in container.get("env") or []:
            if env["name"] == "TORCHINDUCTOR_REDIS_HOST":
                check("remote cache host", env.get("value"), formats.host_problem)
            if isinstance(env.get("value"), str) and "\x00" in env["value"]:
                problems.append(f"env {env['name']}: a NUL byte, which no process environment can hold")
        if any("\x00" in str(arg) for arg in [*(container.get("command") or []), *(container.get("args") or [])]):
            problems.append(f"container {container['name']}: a NUL byte in its command, which execve refuses")
    deadline = job["spec"].get("activeDeadlineSeconds", 1)
    if not 1 <= deadline <= 7 * 24 * 3600:
        problems.append(f"activeDeadlineSeconds {deadline}")
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            check("hostPath", volume["hostPath"]["path"],
                  lambda p: formats.node_path_problem(p, formats.DEFAULT_NODE_CACHE_ROOTS))
    if SECRET in json.dumps(job):
        problems.append("the Job carries the secret")
    return problems


def body_of(spec: Mapping[str, Any], name: str = "prop") -> dict[str, Any]:
    return {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
            "metadata": {"name": name, "namespace": "team-a", "uid": "uid-prop", "generation": 1,
                         "resourceVersion": "1"},
            "spec": spec}
