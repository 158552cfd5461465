"""The webhook's direct answer: the JSON patch built from the pod patch does what Kopf's generic
path (deep copy, merge, diff) does, and the webhook fails open."""

from __future__ import annotations

from typing import Any

import jsonpatch
import kopf
from compilecache_operator.admission import webhook
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions.podpatch import patched_pod
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.names import CACHE_LABEL, SKIPPED_ANNOTATION
from compilecache_operator.model.spec import Defaults
from hypothesis import given
from hypothesis import strategies as st

from tests.operator.admission_samples import patched, review
from tests.operator.samples import pod, view

STATE = State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics())
VIEWS = {("team-a", "mlp"): [view()]}


def kopf_patched(obj: dict[str, Any]) -> dict[str, Any]:
    result = webhook.pod_patch(STATE, VIEWS, obj)
    assert result is not None
    patch = kopf.Patch(body=kopf.Body(obj))  # type: ignore[arg-type]
    for name, value in result.pod_fields().items():
        patch[name] = value
    applied: dict[str, Any] = jsonpatch.apply_patch(obj, patch.as_json_patch())
    return applied


def test_the_direct_patch_equals_kopfs() -> None:
    shapes = [
        pod(),
        pod(initContainers=[{"name": "setup", "image": "busybox"}], volumes=[{"name": "data", "emptyDir": {}}]),
        pod(containers=[{"name": "app", "image": "other:1"}]),  # skipped: image mismatch, annotations only
    ]
    for shape in shapes:
        shape["metadata"]["annotations"] = {"a/b~c": "kept"} if shape is shapes[1] else None
        if shape["metadata"]["annotations"] is None:
            del shape["metadata"]["annotations"]
        answer = webhook.review_pod(STATE, VIEWS, review(shape))
        assert answer["response"]["allowed"] is True and answer["response"]["uid"] == "u-1"
        assert patched(shape, answer) == kopf_patched(shape)
        assert patched(shape, answer) == patched_pod(shape, webhook.pod_patch(STATE, VIEWS, shape))


def test_a_skipped_pod_carries_the_reason_and_a_warning() -> None:
    shape = pod(containers=[{"name": "app", "image": "other:1"}])
    answer = webhook.review_pod(STATE, VIEWS, review(shape))
    assert patched(shape, answer)["metadata"]["annotations"][SKIPPED_ANNOTATION] == "image-mismatch"
    assert answer["response"]["warnings"][0].startswith("compilecache: pod starts without a preloaded cache")


def test_only_labelled_pods_being_created_are_patched() -> None:
    unlabelled = pod()
    del unlabelled["metadata"]["labels"][CACHE_LABEL]
    assert "patch" not in webhook.review_pod(STATE, VIEWS, review(unlabelled))["response"]
    assert "patch" not in webhook.review_pod(STATE, VIEWS, review(pod(), operation="UPDATE"))["response"]


def test_the_webhook_fails_open() -> None:
    broken = pod(containers="not a list")
    answer = webhook.review_pod(STATE, VIEWS, review(broken))
    assert answer["response"] == {"uid": "u-1", "allowed": True}


def test_the_webhook_reads_the_namespaces_level_from_the_index_and_the_default() -> None:
    """A node cache is injected where the namespace's enforce label (the operator's watch of the namespaces), or the
    operator's default for an unlabelled one, is privileged; elsewhere the pod gets its own emptyDir, warned."""
    views = {("team-a", "mlp"): [view(preload={"nodeCache": {"hostPath": "/var/cache/cc"}})]}

    def volume_kinds(labels: dict[str, list[str]], default: str) -> tuple[set[str], list[str]]:
        state = State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p"),
                                        pod_security_default=default), metrics=Metrics())
        state.injection.namespace_levels = labels
        answer = webhook.review_pod(state, views, review(pod()))
        out = patched(pod(), answer)
        (cache,) = [v for v in out["spec"]["volumes"] if v["name"] == "compilecache-cache"]
        return set(cache) - {"name"}, answer["response"].get("warnings", [])

    assert volume_kinds({}, "privileged") == ({"hostPath"}, [])
    assert volume_kinds({"team-a": [""]}, "privileged")[0] == {"hostPath"}
    assert volume_kinds({"team-a": ["privileged"]}, "restricted")[0] == {"hostPath"}
    for labels, default in (({"team-a": ["restricted"]}, "privileged"), ({"team-a": ["baseline"]}, "privileged"),
                            ({}, "baseline"), ({"team-b": ["privileged"]}, "restricted")):
        kinds, warnings = volume_kinds(labels, default)
        assert kinds == {"emptyDir"}, (labels, default)
        assert any("node cache is left out" in w for w in warnings), warnings


@given(
    labels=st.dictionaries(st.sampled_from([CACHE_LABEL, "app"]), st.sampled_from(["", "mlp", "x"]), max_size=2),
    in_pod=st.sampled_from([None, "", "team-b"]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]),
)
def test_the_cache_a_review_asks_for_is_the_labelled_pods_own(
    labels: dict[str, str], in_pod: str | None, operation: str
) -> None:
    """What a restarted operator reads before its list: only the cache an opted-in pod being created names, in
    the pod's namespace (else the request's)."""
    shape = pod()
    shape["metadata"]["labels"] = labels
    answer = review(shape, operation=operation)
    if in_pod is not None:
        answer["request"]["object"]["metadata"]["namespace"] = in_pod
    asked = webhook.asked_cache(answer)
    if operation != "CREATE" or not labels.get(CACHE_LABEL):
        assert asked is None
    else:
        assert asked == (in_pod or "team-a", labels[CACHE_LABEL])
    labelled = operation == "CREATE" and CACHE_LABEL in labels
    assert asked is None or labelled, "never a cache for a pod the webhook leaves alone"
