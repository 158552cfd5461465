"""The reconcile as read → decide → apply: the decisions from snapshots (pure), the status they lead
to, and what the resync skips. The store a prune talks to is a real loopback port nothing listens on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from compilecache_operator.controller import reconcile, scheduling
from compilecache_operator.controller.reconcile import Actions, Snapshot
from compilecache_operator.controller.state import KeyedLocks
from compilecache_operator.decisions import cache_status
from compilecache_operator.decisions.job_reports import PUBLISH_CONTAINER
from compilecache_operator.decisions.plan import BundleRecord, job_name
from compilecache_operator.edge.storeops import DeleteReport
from compilecache_operator.model.names import RECORDED_ANNOTATION

from tests.operator.reconcile_samples import SETTINGS, cache, conditions, job, state_with, variant_of
from tests.operator.samples import KEY
from testsupport.servers import free_port

NOW = "2026-01-01T00:00:00Z"


def publish_pod(message: str) -> dict[str, Any]:
    return {"metadata": {"name": "warm-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"name": PUBLISH_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": message}}}]}}


def decided(snapshot: Snapshot, kept: Any = None, note: str = "") -> tuple[Actions, dict[str, Any]]:
    actions = reconcile.decide_actions(snapshot, SETTINGS)
    status = reconcile.final_status(snapshot, actions, actions.bundles if kept is None else kept, note, NOW)
    return actions, status


# -- decisions ---------------------------------------------------------------------------------------------
def test_no_gpu_nodes_is_a_problem_that_is_looked_at_again() -> None:
    body = cache(gpuDiscovery={"auto": True})
    actions, status = decided(Snapshot(body, gpus=frozenset()))
    assert actions.failure is not None and actions.failure.reason == "NoGPUNodes"
    assert "nvidia.com/gpu.product" in actions.failure.message and not actions.create
    assert conditions(status)["Ready"] == ("False", "NoGPUNodes")
    result = reconcile.outcome(actions, status, SETTINGS.retry_seconds)
    assert result.problem == actions.failure.message and result.retry_after == 7
    with_node = reconcile.decide_actions(Snapshot(body, gpus=frozenset({"NVIDIA-L4"})), SETTINGS)
    assert with_node.failure is None and [j.variant.gpu_label for j in with_node.create] == ["NVIDIA-L4"]


def test_an_invalid_spec_is_not_retried_and_a_missing_secret_is() -> None:
    actions, status = decided(Snapshot(cache(image="")))
    assert actions.failure is not None and actions.failure.reason == "InvalidSpec"
    assert reconcile.outcome(actions, status, 7).invalid == actions.failure.message
    with_secret = cache(storage={"url": "redis://r:6379/0", "secretRef": {"name": "creds"}})
    actions, status = decided(Snapshot(with_secret, secret=None))
    assert actions.failure is not None and actions.failure.reason == "SecretNotFound"
    assert status["storage"] == "redis://r:6379/0" and reconcile.outcome(actions, status, 7).problem


def test_a_new_cache_creates_one_job_and_its_status_does_not_change_when_the_job_shows_up() -> None:
    """The status written after creating a Job already says what the Job's first sighting says:
    no second write for the same news."""
    body = cache()
    actions, status = decided(Snapshot(body))
    assert [j.name for j in actions.create] == [job_name("mlp", variant_of(body), 3)]
    assert conditions(status)["Warming"] == ("True", "WarmupInProgress") and actions.warming
    later = Snapshot({**body, "status": status}, jobs=(job(body, phase="active"),), pods={"job-uid": []})
    again, status_again = decided(later)
    assert not again.create and not cache_status.status_changed(status, status_again)


def test_a_succeeded_job_with_an_unreadable_publish_result_fails_the_variant() -> None:
    body = cache()
    snapshot = Snapshot(body, jobs=(job(body, phase="succeeded"),), pods={"job-uid": [publish_pod("Killed")]})
    actions, status = decided(snapshot)
    assert not actions.records and not actions.create
    state = actions.job_states[variant_of(body).id]
    assert (state.phase, state.reason) == ("failed", "PublishResultUnreadable")
    assert [(c.name, c.phase, c.reason) for c in actions.count] == [(state.name, "failed", "PublishResultUnreadable")]
    assert conditions(status)["Ready"] == ("False", "WarmupFailed")
    assert conditions(status)["Degraded"] == ("True", "PublishResultUnreadable")


def test_a_succeeded_job_is_recorded_counted_and_the_cache_ready() -> None:
    body = cache()
    variant = variant_of(body)
    message = json.dumps({"result": "published", "key": KEY.format(gpu=variant.gpu_slug, cap="cpu"), "bytes": 10})
    snapshot = Snapshot(body, jobs=(job(body, phase="succeeded"),), pods={"job-uid": [publish_pod(message)]})
    actions, status = decided(snapshot)
    assert [r.variant for r in actions.records] == [variant.id] and len(actions.count) == 1
    assert conditions(status)["Ready"] == ("True", "BundlesAvailable") and status["bundleCount"] == 1


def old_bundles(body: dict[str, Any]) -> list[dict[str, Any]]:
    variant = variant_of(body)
    ids = {1: "oldplan001", 2: "oldplan002", 3: variant.id}
    return [BundleRecord(variant=ids[g], key=KEY.format(gpu=variant.gpu_slug, cap=f"g{g}"), gpu=variant.gpu_label,
                         image=variant.image, generation=g).to_status() for g in (1, 2, 3)]


def test_a_failed_prune_keeps_the_bundles_and_degrades_the_cache() -> None:
    body = cache(retention={"keepGenerations": 1})
    body["status"] = {"bundles": old_bundles(body)}
    actions = reconcile.decide_actions(Snapshot(body), SETTINGS)
    assert [b.generation for b in actions.prune] == [2, 1]
    kept, note = reconcile.pruned(actions.bundles, DeleteReport(deleted=(actions.prune[1].key,),
                                                                 failed=((actions.prune[0].key, "timeout"),)))
    assert [b.generation for b in kept] == [3, 2] and note == f"pruning failed: {actions.prune[0].key}: timeout"
    status = reconcile.final_status(Snapshot(body), actions, kept, note, NOW)
    assert conditions(status)["Ready"] == ("True", "BundlesAvailable")
    assert conditions(status)["Degraded"] == ("True", "StorePruneFailed") and status["bundleCount"] == 2


def test_a_store_that_cannot_be_reached_prunes_nothing() -> None:
    body = cache(retention={"keepGenerations": 1}, storage={"url": f"redis://127.0.0.1:{free_port()}/0"})
    body["status"] = {"bundles": old_bundles(body)}
    actions = reconcile.decide_actions(Snapshot(body), SETTINGS)
    kept, note = asyncio.run(reconcile.prune_bundles(actions, None))
    assert len(kept) == 3 and note.startswith("pruning failed: ") and "Connection refused" in note


def test_only_jobs_whose_outcome_is_still_to_be_read_need_their_pods() -> None:
    body = cache()
    variant = variant_of(body)
    done = job(body, phase="succeeded", recorded=True)
    assert reconcile.needs_pods(job(body, phase="active"), set())
    assert reconcile.needs_pods(done, set()), "recorded, but its bundle is not in status"
    assert not reconcile.needs_pods(done, {variant.id})


# -- state kept between reconciles ----------------------------------------------------------------------


def test_the_resync_skips_a_settled_cache_until_something_it_reads_changes() -> None:
    body = cache()
    state = state_with(body)
    assert scheduling.unsettled(state) == [("team-a", "mlp")]
    state.scheduler.settled[("team-a", "mlp")] = scheduling.fingerprint(state, ("team-a", "mlp"))
    assert scheduling.unsettled(state) == []
    state.cluster.indexes.jobs = {"uid-1234": [job(body, phase="failed")]}
    assert scheduling.unsettled(state) == [("team-a", "mlp")], "a Job appeared"
    state.scheduler.settled[("team-a", "mlp")] = scheduling.fingerprint(state, ("team-a", "mlp"))
    changed = {**body, "metadata": {**body["metadata"], "resourceVersion": "101"}}
    state.cluster.indexes.caches = {("team-a", "mlp"): [changed]}
    assert scheduling.unsettled(state) == [("team-a", "mlp")], "the cache changed"


def test_a_status_just_written_is_read_until_the_index_catches_up() -> None:
    body = cache()
    state = state_with(body)
    written = {**body, "metadata": {**body["metadata"], "resourceVersion": "105"}, "status": {"bundleCount": 0}}
    state.cluster.written[("team-a", "mlp")] = ("100", written)
    assert state.cluster.cache(("team-a", "mlp")) is written
    caught_up = {**written, "status": {"bundleCount": 0}}
    state.cluster.indexes.caches = {("team-a", "mlp"): [caught_up]}
    assert state.cluster.cache(("team-a", "mlp")) is caught_up and not state.cluster.written


def test_a_job_just_counted_reads_as_counted_until_the_index_shows_it() -> None:
    body = cache()
    state = state_with(body, (job(body, phase="failed"),))
    state.cluster.counted_jobs.add(("team-a", job(body, phase="failed")["metadata"]["name"]))
    assert RECORDED_ANNOTATION in state.cluster.jobs(body)[0]["metadata"]["annotations"]
    state.cluster.indexes.jobs = {"uid-1234": [job(body, phase="failed", recorded=True)]}
    state.cluster.jobs(body)
    assert not state.cluster.counted_jobs


def test_keyed_locks_leave_nothing_behind() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def hold(tag: str) -> None:
        async with locks.hold(("team-a", "mlp")):
            order.append(f"{tag}+")
            await asyncio.sleep(0.01)
            order.append(f"{tag}-")

    async def both() -> None:
        await asyncio.gather(hold("a"), hold("b"))

    asyncio.run(both())
    assert order == ["a+", "a-", "b+", "b-"] and len(locks) == 0


@pytest.mark.parametrize(("policy", "current", "new"), [
    ("Delete", [], ("compilecache.io/bundles",)),
    ("Delete", ["other", "compilecache.io/bundles"], None),
    ("Keep", ["other", "compilecache.io/bundles"], ("other",)),
    ("Keep", [], None),
])
def test_the_finalizer_follows_the_deletion_policy(policy: str, current: list[str], new: Any) -> None:
    body = cache(deletionPolicy=policy)
    body["metadata"]["finalizers"] = current
    assert reconcile.decide_actions(Snapshot(body), SETTINGS).finalizers == new
    assert reconcile.decide_actions(Snapshot(cache(image="", deletionPolicy=policy)), SETTINGS).finalizers is None


def test_the_webhook_is_ready_once_it_answers_as_it_will_when_it_knows_every_cache() -> None:
    state = state_with(cache())
    assert not state.serving(), "nothing listed yet"
    state.cluster.admitting = True
    assert state.serving(), "the namespaces listed: a cache not listed yet is read when its pod asks"
    state.cluster.ready = True
    assert state.serving(), "every watch has listed"
    state.lifecycle.draining = True
    assert not state.serving(), "shutting down"
