"""Leader election decisions (pure): who takes the Lease when, judged by each replica's own clock."""

from __future__ import annotations

from typing import Any

from compilecache_operator.edge import leader


def lease(holder: str | None, renewed: str = "t1") -> dict[str, Any]:
    return {"metadata": {"name": "l", "resourceVersion": "5"},
            "spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": 15}}


def test_a_missing_lease_is_created_and_a_free_one_taken() -> None:
    assert leader.step(None, "me", None, 0.0, 15) == "create"
    assert leader.step(lease(None), "me", None, 0.0, 15) == "take"
    assert leader.step(lease("me"), "me", None, 0.0, 15) == "renew"


def test_another_holder_is_waited_for_until_its_lease_stands_still_that_long() -> None:
    held = lease("other")
    seen = leader.observe(held, None, 100.0)
    assert leader.step(held, "me", None, 100.0, 15) == "wait", "first sight"
    assert leader.step(held, "me", seen, 114.0, 15) == "wait"
    assert leader.step(held, "me", seen, 115.0, 15) == "take"
    renewed = lease("other", "t2")
    assert leader.step(renewed, "me", seen, 130.0, 15) == "wait", "renewed meanwhile"
    assert leader.observe(renewed, seen, 130.0) == leader.Seen("other", "t2", 130.0)
    assert leader.observe(held, seen, 140.0) is seen


def test_holding_counts_transitions_only_on_take_over() -> None:
    taken = leader.held_by("me", lease("other"), 15, take=True)["spec"]
    assert taken["holderIdentity"] == "me" and taken["leaseTransitions"] == 1 and "acquireTime" in taken
    renewed = leader.held_by("me", {"spec": {**taken, "acquireTime": "a"}}, 15, take=False)["spec"]
    assert renewed["leaseTransitions"] == 1 and renewed["acquireTime"] == "a"
    created = leader.held_by("me", None, 15, take=False)["spec"]
    assert created["leaseTransitions"] == 0 and created["leaseDurationSeconds"] == 15
