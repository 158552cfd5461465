"""The CompileCache validating webhook's answer: it refuses exactly what the operator would mark InvalidSpec, with
the same message (every field path, no credential), and a store outside the allow-lists is admitted when a grant
read at that moment allows it."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from compilecache_operator.admission.validation import Regrant, review_cache, to_check
from compilecache_operator.controller import reconcile, state
from compilecache_operator.model.confinement import Confinement, Grant, grants_from
from compilecache_operator.model.spec import InvalidSpec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.specgen import BASES, SECRET, SETTINGS, Case, body_of, cases

CONFINED = dataclasses.replace(SETTINGS, confinement=Confinement(
    store_hosts=("redis.cache:6379", "s3://bucket"), store_secrets=("s3-creds",), warmup_service_accounts=()))
NAMES = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)


def review(body: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"uid": "u-7", "operation": operation, "namespace": body["metadata"]["namespace"],
                               "object": body}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(settings_: state.Settings, body: dict[str, Any], regrant: Regrant | None = None,
           operation: str = "CREATE", old: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = asyncio.run(review_cache(settings_, regrant, review(body, operation, old)))["response"]
    assert response["uid"] == "u-7"
    return response


def granting(grants: Sequence[Grant]) -> tuple[Regrant, list[int]]:
    """A re-read of the grant ConfigMaps that finds ``grants``, and how often it was asked."""
    calls: list[int] = []

    async def regrant() -> tuple[Grant, ...]:
        calls.append(1)
        return tuple(grants)

    return regrant, calls


@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_the_answer_refuses_what_the_operator_marks_invalid_with_the_same_message(case: Case) -> None:
    body = body_of(case.spec)
    checked = reconcile.spec_of(body, CONFINED, "prop")
    response = answer(CONFINED, copy.deepcopy(body))
    assert response["allowed"] == (not isinstance(checked, InvalidSpec)), (case, checked)
    if isinstance(checked, InvalidSpec):
        message = response["status"]["message"]
        assert response["status"]["code"] == 422 and str(checked) in message
        assert all(error.path in message for error in checked.errors)
        assert SECRET not in message


@settings(max_examples=60, deadline=None)
@given(team=NAMES, other=NAMES, host=NAMES)
def test_a_store_granted_a_second_ago_is_admitted_and_only_in_the_granted_namespace(team: str, other: str,
                                                                                    host: str) -> None:
    if team == other:
        return
    spec = {**copy.deepcopy(BASES[0]), "storage": {"url": f"redis://{host}.team.svc:6380/0"}}
    body = body_of(spec)
    body["metadata"]["namespace"] = team
    (grant,), refused = grants_from([{"metadata": {"name": "g", "namespace": "ops"},
                                      "data": {"namespaces": team, "storeHosts": f"{host}.team.svc:6380"}}])
    assert not refused
    regrant, calls = granting([grant])
    assert answer(CONFINED, body, regrant)["allowed"], "granted in the API, not yet in the replica's copy"
    assert calls == [1]
    known = dataclasses.replace(CONFINED, confinement=dataclasses.replace(CONFINED.confinement, grants=(grant,)))
    assert answer(known, body)["allowed"], "granted in the replica's copy"

    body["metadata"]["namespace"] = other
    for settings_, regrant_ in ((CONFINED, granting([grant])[0]), (known, None), (CONFINED, granting([])[0])):
        response = answer(settings_, body, regrant_)
        assert not response["allowed"]
        message = response["status"]["message"]
        assert message.startswith("CompileCache spec refused: spec.storage.url: ")
        assert f"store {host}.team.svc:6380 is not on the operator's allow-list" in message


def test_the_grants_are_read_again_only_for_a_refusal_by_the_allow_lists() -> None:
    regrant, calls = granting([])
    assert answer(CONFINED, body_of(copy.deepcopy(BASES[0])), regrant)["allowed"]
    bad = {**copy.deepcopy(BASES[0]), "image": "$(id)"}
    response = answer(CONFINED, body_of(bad), regrant)
    assert not response["allowed"] and "spec.image" in response["status"]["message"]
    assert calls == [], "a spec that does not parse, or one allowed, needs no grant"


def test_a_failed_re_read_leaves_the_replicas_own_grants_to_decide() -> None:
    async def unreachable() -> tuple[Grant, ...]:
        raise OSError("connection refused")

    body = body_of({**copy.deepcopy(BASES[0]), "storage": {"url": f"redis://:{SECRET}@elsewhere:6379/0"}})
    response = answer(CONFINED, body, unreachable)
    assert not response["allowed"] and "spec.storage.url" in response["status"]["message"]
    assert SECRET not in str(response)


def test_status_writes_finalizer_removals_and_unchanged_specs_are_never_refused() -> None:
    bad = body_of({**copy.deepcopy(BASES[0]), "storage": {"url": "redis://elsewhere:6379/0"}})
    assert not answer(CONFINED, bad)["allowed"]
    deleting = copy.deepcopy(bad)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-25T08:00:00Z"
    changed = copy.deepcopy(bad)
    changed["spec"]["image"] = "registry.example/workload:2"
    assert answer(CONFINED, bad, operation="UPDATE", old=copy.deepcopy(bad))["allowed"]
    assert answer(CONFINED, deleting, operation="UPDATE", old=bad)["allowed"]
    assert not answer(CONFINED, changed, operation="UPDATE", old=bad)["allowed"]
    assert not to_check({"operation": "DELETE", "oldObject": bad})


def test_namespaces_the_operator_does_not_watch_are_not_its_to_refuse() -> None:
    elsewhere = dataclasses.replace(CONFINED, namespaces=("team-b",))
    bad = body_of({**copy.deepcopy(BASES[0]), "storage": {"url": "redis://elsewhere:6379/0"}})
    assert answer(elsewhere, bad)["allowed"]
