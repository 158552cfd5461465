"""The CRD's conversion webhook: every object goes through the hub (the storage version) and back without
losing a field, for generated objects and renames; a version it does not know is a failure naming the object."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from compilecache_operator.model import conversion
from compilecache_operator.model.conversion import Version
from hypothesis import given
from hypothesis import strategies as st

from tests.operator.example_files import EXAMPLES_DIR

HUB = "compilecache.io/v1alpha1"
NEXT = "compilecache.io/v1beta9"
RENAMES = (("spec.image", "spec.containerImage"), ("spec.warmup.resources", "spec.warmup.compute.resources"))
VERSIONS = {"v1alpha1": Version(), "v1beta9": Version(renames=RENAMES)}
KEYS = st.from_regex(r"[a-z][a-zA-Z]{0,8}", fullmatch=True)
LEAVES = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
JSON = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
                    max_leaves=12)


def cache(spec: dict[str, Any], api: str = HUB) -> dict[str, Any]:
    return {"apiVersion": api, "kind": "CompileCache", "metadata": {"name": "mlp", "namespace": "ml"}, "spec": spec}


def test_the_renamed_fields_move_and_the_rest_stays() -> None:
    hub = cache({"image": "img:1", "warmup": {"resources": {"limits": {"cpu": "2"}}, "backoffLimit": 1},
                 "model": {"target": "tiny_mlp"}})
    converted = conversion.convert(hub, NEXT, VERSIONS)
    assert converted["apiVersion"] == NEXT
    assert converted["spec"] == {"containerImage": "img:1", "model": {"target": "tiny_mlp"},
                                 "warmup": {"backoffLimit": 1, "compute": {"resources": {"limits": {"cpu": "2"}}}}}
    assert conversion.convert(converted, HUB, VERSIONS) == hub
    assert hub["spec"]["image"] == "img:1", "the input is left as it was"


@given(spec=st.dictionaries(KEYS, JSON, max_size=6), image=st.none() | st.text(max_size=10))
def test_a_round_trip_through_any_version_loses_nothing(spec: dict[str, Any], image: str | None) -> None:
    spec = {k: v for k, v in spec.items() if k not in ("image", "containerImage", "warmup")}
    if image is not None:
        spec["image"] = image
        spec["warmup"] = {"resources": {"limits": {"cpu": image}}, "backoffLimit": 2}
    hub = cache(spec)
    there = conversion.convert(hub, NEXT, VERSIONS)
    assert conversion.convert(there, HUB, VERSIONS) == hub
    assert conversion.convert(hub, HUB, VERSIONS) == hub


def test_every_example_converts_to_itself_between_the_served_versions_of_today() -> None:
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "CompileCache":
                assert conversion.convert(copy.deepcopy(doc), doc["apiVersion"]) == doc


def test_the_review_answers_each_object_or_fails_naming_one() -> None:
    request = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
               "request": {"uid": "u-1", "desiredAPIVersion": NEXT, "objects": [cache({"image": "a"}),
                                                                              cache({"containerImage": "b"}, NEXT)]}}
    answer = conversion.review(request, VERSIONS)
    assert answer["response"]["uid"] == "u-1" and answer["response"]["result"] == {"status": "Success"}
    assert [o["spec"] for o in answer["response"]["convertedObjects"]] == [{"containerImage": "a"},
                                                                           {"containerImage": "b"}]
    request["request"]["desiredAPIVersion"] = "compilecache.io/v9"
    failed = conversion.review(request, VERSIONS)["response"]
    assert failed["result"]["status"] == "Failure" and failed["convertedObjects"] == []
    assert "ml/mlp" in failed["result"]["message"] and "compilecache.io/v9" in failed["result"]["message"]
