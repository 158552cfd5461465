"""Requests and limits of every container the operator creates: the warm-up's harness, compile and publish
containers and the injected preload, from the operator's settings and each CompileCache's spec.

What a namespace with a ``limits.*`` ResourceQuota or a require-limits policy demands: every container names
a cpu and a memory limit, and no request exceeds its limit. The real quota and policy are applied in
tests/e2e/test_quota_policy.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from compilecache_operator import main
from compilecache_operator.decisions import cacheview, job_reports, warmup_job
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.model import names
from compilecache_operator.model import spec as spec_model
from compilecache_operator.model.spec_fields import quantity_value
from compilecache_operator.model.spec_parse import parse_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.example_files import EXAMPLES, EXAMPLES_DIR, QUICK_START_STORE
from tests.operator.samples import SETTINGS, inject, owner, pod, raw_spec

CPUS = st.sampled_from(["50m", "100m", "250m", "1", "2", "1500m"])
MEMORY = st.sampled_from(["64Mi", "128Mi", "256Mi", "1Gi", "512M", "2Gi"])


@st.composite
def resources(draw: st.DrawFn) -> dict[str, dict[str, str]]:
    """A container's requests and limits with both cpu and memory limits, each request at most its limit."""
    limits = {"cpu": draw(CPUS), "memory": draw(MEMORY)}
    requests = {}
    for name, limit in limits.items():
        choice = draw(CPUS if name == "cpu" else MEMORY)
        if draw(st.booleans()) and quantity_value(choice) <= quantity_value(limit):  # type: ignore[operator]
            requests[name] = choice
    return {"limits": limits, **({"requests": requests} if requests else {})}


def created_containers(spec: dict[str, Any], defaults: spec_model.Defaults, gpu: str = "") -> list[dict[str, Any]]:
    """Every container the operator makes for a CompileCache with ``spec``: the warm-up Job's and the preload."""
    body = owner(**spec)
    parsed = parse_spec(body["spec"], defaults)
    variant = Variant(id="0123456789", gpu=gpu, image=parsed.image)
    job = warmup_job.build_job(body, parsed, variant, name="cc-mlp-0123456789-g3", job_id="cc-abc", settings=SETTINGS)
    pod_spec = job["spec"]["template"]["spec"]
    bundle = BundleRecord(variant=variant.id, key="k", gpu=variant.gpu, image=parsed.image, job_id="cc-abc")
    view = cacheview.CacheView(namespace="team-a", name="mlp", ready=True, spec=parsed, bundles=(bundle,),
                               current_variants=frozenset({variant.id}), job_id="cc-abc")
    app = {"name": "app", "image": parsed.image, "command": ["python", "app.py"]}
    patch = inject(pod(containers=[app]), view)
    preload = [c for c in [*(patch.init_containers or []), *(patch.containers or [])]
               if c.get("name") == names.PRELOAD_CONTAINER]
    assert len(preload) == 1, patch
    return [*pod_spec["initContainers"], *pod_spec["containers"], *preload]


def assert_quota_ready(container: dict[str, Any]) -> None:
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    assert {"cpu", "memory"} <= set(limits), (container["name"], res)
    for name, request in requests.items():
        if name in limits:
            assert quantity_value(request) <= quantity_value(limits[name]), (container["name"], res)  # type: ignore[operator]


@pytest.mark.parametrize("gpu", ["", "NVIDIA-L4"])
def test_by_default_every_created_container_has_cpu_and_memory_limits(gpu: str) -> None:
    spec = {"gpuTypes": [gpu]} if gpu else {}
    made = created_containers(spec, spec_model.Defaults(), gpu)
    assert [c["name"] for c in made] == [job_reports.HARNESS_CONTAINER, job_reports.COMPILE_CONTAINER,
                                         job_reports.PUBLISH_CONTAINER, names.PRELOAD_CONTAINER]
    for container in made:
        assert_quota_ready(container)
    by_name = {c["name"]: c["resources"] for c in made}
    assert by_name[names.PRELOAD_CONTAINER] == spec_model.DEFAULT_PRELOAD_RESOURCES.to_dict()
    helpers = spec_model.DEFAULT_HELPER_RESOURCES.to_dict()
    assert by_name[job_reports.PUBLISH_CONTAINER] == by_name[job_reports.HARNESS_CONTAINER] == helpers
    compile_limits = by_name[job_reports.COMPILE_CONTAINER]["limits"]
    assert compile_limits.get("nvidia.com/gpu") == ("1" if gpu else None)
    assert {k: v for k, v in compile_limits.items() if "/" not in k} == spec_model.DEFAULT_WARMUP_RESOURCES.limits


@settings(max_examples=60, deadline=None)
@given(operator=st.tuples(resources(), resources(), resources()),
       spec=st.tuples(st.none() | resources(), st.none() | resources(), st.none() | resources()))
def test_a_spec_section_replaces_the_operator_setting_whole(
    operator: tuple[dict[str, Any], ...], spec: tuple[dict[str, Any] | None, ...]
) -> None:
    defaults = spec_model.Defaults(**{field: spec_model.Resources(limits=r["limits"], requests=r.get("requests", {}))
                           for field, r in zip(("warmup_resources", "helper_resources", "preload_resources"),
                                               operator, strict=True)})
    compile_, helpers, preload = spec
    raw: dict[str, Any] = {"warmup": {k: v for k, v in (("resources", compile_), ("helperResources", helpers)) if v},
                           **({"preload": {"resources": preload}} if preload else {})}
    made = {c["name"]: c["resources"] for c in created_containers(raw, defaults)}
    for container, chosen, setting in ((job_reports.COMPILE_CONTAINER, compile_, operator[0]),
                                       (job_reports.HARNESS_CONTAINER, helpers, operator[1]),
                                       (job_reports.PUBLISH_CONTAINER, helpers, operator[1]),
                                       (names.PRELOAD_CONTAINER, preload, operator[2])):
        assert made[container] == (chosen or setting), container


@pytest.mark.parametrize(("section", "field"), [
    ({"warmup": {"helperResources": {"limits": {"memory": "lots"}}}}, "spec.warmup.helperResources.limits.memory"),
    ({"warmup": {"helperResources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}},
     "spec.warmup.helperResources.requests.cpu"),
    ({"warmup": {"helperResources": {"limits": ["cpu"]}}}, "spec.warmup.helperResources.limits"),
    ({"preload": {"resources": {"limits": {"cpu": "-1"}}}}, "spec.preload.resources.limits.cpu"),
])
def test_a_bad_quantity_is_invalid_spec_naming_the_field(section: dict[str, Any], field: str) -> None:
    with pytest.raises(spec_model.InvalidSpec) as caught:
        parse_spec(raw_spec(**section), spec_model.Defaults())
    assert any(e.path.startswith(field) for e in caught.value.errors), caught.value.errors


def test_the_operator_flags_set_the_defaults_and_refuse_a_bad_quantity(capsys: pytest.CaptureFixture[str]) -> None:
    options = main.parse_args(["--warmup-helper-resources", '{"limits": {"cpu": "2", "memory": "2Gi"}}',
                               "--webhook-config", "off"])
    defaults = main.settings_from(options).defaults
    assert defaults.helper_resources == spec_model.Resources(limits={"cpu": "2", "memory": "2Gi"})
    assert defaults.preload_resources == spec_model.DEFAULT_PRELOAD_RESOURCES
    for bad, said in (('{"limits": {"memory": "lots"}}', "--preload-resources.limits.memory"),
                      ("{limits", "--preload-resources: not JSON")):
        with pytest.raises(SystemExit):
            main.parse_args(["--preload-resources", bad, "--webhook-config", "off"])
        assert said in capsys.readouterr().err


@pytest.mark.parametrize(("name", "doc"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_every_example_makes_containers_a_limits_quota_admits(name: str, doc: dict[str, Any]) -> None:
    """A spec section replaces the operator's setting whole, so an example that sets resources must set both
    limits itself: copied into a namespace with a limits quota or a require-limits policy, it must still run."""
    spec = doc["spec"]
    gpu = (spec.get("gpuTypes") or [""])[0]
    for container in created_containers(spec, spec_model.Defaults(storage_url=QUICK_START_STORE), gpu):
        assert_quota_ready(container)


def workload_containers() -> list[tuple[str, dict[str, Any]]]:
    """(file:name/container, container) of every Pod and pod template among the examples."""
    import yaml

    out = []
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("Pod", "Deployment", "StatefulSet", "Job"):
                continue
            spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
            out += [(f"{path.name}:{doc['metadata']['name']}/{c['name']}", c)
                    for c in [*spec.get("initContainers", []), *spec["containers"]]]
    return out


WORKLOADS = workload_containers()


@pytest.mark.parametrize(("name", "container"), WORKLOADS, ids=[name for name, _ in WORKLOADS])
def test_every_example_workload_container_has_cpu_and_memory_limits(name: str, container: dict[str, Any]) -> None:
    """The opted-in Pod and Deployment of the examples run where the warm-ups and preloads do: a namespace with
    a limits quota or a require-limits policy."""
    assert_quota_ready(container)
