"""The operator's memory from its own watches: what one change does to it (pure), and what it queues.

Generated event streams are checked against the state they end in: whatever the order of creates, changes,
deletions, repeats and relists, the memory is what the server holds, and each index is the one made from
scratch. The list and watch themselves run against the real API server in tests/e2e/test_informer.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import kopf
from compilecache_operator import handlers as registered  # noqa: F401 (Kopf's handlers register at import)
from compilecache_operator.controller import reconcile, scheduling
from compilecache_operator.controller.state import Indexes, State, owner_uids
from compilecache_operator.controller.watches import CacheViews, Grouped, Singles
from compilecache_operator.edge.informer import (
    ADDED,
    DELETED,
    MODIFIED,
    Change,
    Resource,
    apply_event,
    count_labels,
    index_by,
    kept,
    replace_all,
)
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.confinement import Confinement
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.operator.reconcile_samples import SETTINGS, cache, job

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])
NAMESPACES = st.sampled_from(["team-a", "team-b"])
LABELS = st.dictionaries(st.sampled_from(["gpu", "zone", "pool"]), st.sampled_from(["x", "y", "z"]), max_size=3)
OWNERS = st.lists(st.sampled_from(["uid-1", "uid-2", "uid-3"]), max_size=2, unique=True)


def obj(namespace: str, name: str, version: int, labels: dict[str, str], owners: list[str]) -> dict[str, Any]:
    refs = [{"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "name": f"c-{u}", "uid": u}
            for u in owners]
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": str(version), "labels": labels,
                         "ownerReferences": refs}}


# A server's history: each step creates or changes an object (a new version), deletes one, or relists.
STEPS = st.lists(st.tuples(st.sampled_from(["put", "put", "delete", "relist", "repeat"]), NAMESPACES, NAMES, LABELS,
                           OWNERS), max_size=40)


def replay(steps: list[tuple[str, str, str, dict[str, str], list[str]]]) -> tuple[dict[Any, Any], list[Change],
                                                                                  dict[Any, Any]]:
    """Apply a history event by event (a relist skips the events since the last one and lists instead)
    to a store; return the store, every change it reported, and what the server holds."""
    server: dict[tuple[str, str], dict[str, Any]] = {}
    store: dict[Any, Any] = {}
    changes: list[Change] = []
    missed: list[tuple[str, dict[str, Any]]] = []
    last: tuple[str, dict[str, Any]] | None = None
    for version, (what, namespace, name, labels, owners) in enumerate(steps, start=1):
        key = (namespace, name)
        if what == "put":
            last = (ADDED if key not in server else MODIFIED, obj(namespace, name, version, labels, owners))
            server[key] = last[1]
            missed.append(last)
        elif what == "delete" and key in server:
            last = (DELETED, server.pop(key))
            missed.append(last)
        elif what == "repeat" and last is not None:  # a watch started again from an older version
            missed.append(last)
        elif what == "relist":
            changes += replace_all(store, list(server.values()))
            missed = []
            continue
        for type_, body in missed:
            change = apply_event(store, type_, body)
            changes += [change] if change is not None else []
        missed = []
    return store, changes, server


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_the_store_ends_as_the_server_holds_whatever_the_events_and_relists(steps: list[Any]) -> None:
    store, changes, server = replay(steps)
    assert store == server
    replayed: dict[Any, Any] = {}
    for change in changes:  # the changes alone tell the same story
        assert (change.old is None) == (change.type == ADDED) and (change.new is None) == (change.type == DELETED)
        assert replayed.get(change.key) == change.old
        if change.new is None:
            del replayed[change.key]
        else:
            replayed[change.key] = change.new
    assert replayed == server


@settings(max_examples=300, deadline=None)
@given(steps=STEPS)
def test_the_indexes_kept_by_changes_are_those_made_from_scratch(steps: list[Any]) -> None:
    _, changes, server = replay(steps)
    by_owner: dict[str, dict[Any, Any]] = {}
    labels: dict[str, Counter[str]] = {}
    for change in changes:
        index_by(by_owner, change, owner_uids)
        count_labels(labels, change)
    expected_owners: dict[str, dict[Any, Any]] = {}
    expected_labels: dict[str, Counter[str]] = {}
    for key, body in server.items():
        for uid in owner_uids(body):
            expected_owners.setdefault(uid, {})[key] = body
        for label, value in body["metadata"]["labels"].items():
            expected_labels.setdefault(label, Counter())[value] += 1
    assert by_owner == expected_owners and labels == expected_labels


def test_an_event_of_a_version_already_held_changes_nothing() -> None:
    store: dict[Any, Any] = {}
    first = obj("team-a", "a", 5, {}, [])
    assert apply_event(store, ADDED, first) == Change(ADDED, ("team-a", "a"), None, first)
    assert apply_event(store, MODIFIED, dict(first)) is None
    assert replace_all(store, [dict(first)]) == [] and store[("team-a", "a")] is first, "the same object is kept"
    assert apply_event(store, DELETED, obj("team-a", "gone", 6, {}, [])) is None


def test_a_listed_item_gets_its_kind_and_loses_its_managed_fields() -> None:
    item = {"metadata": {"name": "n", "managedFields": [{"manager": "kubectl"}], "resourceVersion": "3"}}
    held = kept(item, Resource("v1", "Node", "nodes"))
    assert held == {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "resourceVersion": "3"}}
    assert Resource("batch/v1", "Job", "jobs").path("team-a") == "/apis/batch/v1/namespaces/team-a/jobs"
    assert Resource("v1", "Node", "nodes").path() == "/api/v1/nodes"


def test_the_indexes_read_as_the_reconcile_reads_them() -> None:
    body = cache()
    caches = Singles({("team-a", "mlp"): body})
    assert caches[("team-a", "mlp")] == (body,) and list(caches) == [("team-a", "mlp")] and len(caches) == 1
    warmup = job(body, phase="active")
    jobs = Grouped({"uid-1234": {("team-a", "j"): warmup}})
    assert list(jobs.get("uid-1234", ())) == [warmup] and list(jobs.get("other", ())) == [] and len(jobs) == 1


def test_the_webhooks_view_is_made_once_per_object_and_settings() -> None:
    body = cache()
    caches: dict[Any, Any] = {("team-a", "mlp"): body}
    state = State(settings=SETTINGS, metrics=Metrics())
    views = CacheViews(caches, lambda: state.settings)
    (first,) = views[("team-a", "mlp")]
    assert views[("team-a", "mlp")][0] is first and views.get(("team-a", "other")) is None
    assert first.spec is not None
    state.settings = dataclasses.replace(SETTINGS, confinement=Confinement(store_hosts=("elsewhere.example",)))
    (confined,) = views[("team-a", "mlp")]
    assert confined is not first and confined.spec is None, "a store outside the allow-list: no pod gets it"
    caches[("team-a", "mlp")] = {**body, "metadata": {**body["metadata"], "resourceVersion": "200"}}
    assert views[("team-a", "mlp")][0] is not confined


def warmup_job(owner: str, phase: str = "", recorded: bool = False) -> dict[str, Any]:
    conditions = {"Complete": [{"type": "Complete", "status": "True"}],
                  "Failed": [{"type": "Failed", "status": "True"}]}.get(phase, [])
    return {"metadata": {"namespace": "team-a", "name": f"{owner}-warm", "resourceVersion": "7",
                         "annotations": {"compilecache.io/recorded": "succeeded"} if recorded else {},
                         "ownerReferences": [{"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                                              "name": owner, "uid": f"uid-{owner}"}]},
            "status": {"conditions": conditions}}


def test_changes_queue_a_reconcile_only_where_this_replica_acts_and_once_listed() -> None:
    body = cache()
    key = ("team-a", "mlp")
    state = State(settings=SETTINGS, metrics=Metrics())
    created = Change(ADDED, key, None, body)

    def ready_gauge() -> float | None:
        return state.metrics.registry.get_sample_value("compilecache_cache_ready",
                                                       {"namespace": "team-a", "cache": "mlp"})

    async def run() -> None:
        scheduling.cache_changed(state, created)
        assert not state.scheduler.queued and ready_gauge() is None, "before every watch has listed: nothing"
        state.cluster.ready = True
        state.lifecycle.leading = False
        scheduling.cache_changed(state, created)
        assert not state.scheduler.queued, "a standby replica only keeps its memory"
        assert ready_gauge() == 0, "every replica exports the Ready gauge"
        state.lifecycle.leading = True
        scheduling.cache_changed(state, created)
        scheduling.cache_changed(state, created)
        assert state.scheduler.queued == {key: scheduling.RECONCILE} and state.scheduler.queue.qsize() == 1
        for new in (warmup_job("other"), warmup_job("other", "Failed", recorded=True),
                    warmup_job("third", "Complete"), warmup_job("third", "Failed")):
            scheduling.job_changed(state, Change(MODIFIED, ("team-a", "j"), None, new))
        assert state.scheduler.queued == {key: scheduling.RECONCILE, ("team-a", "third"): scheduling.JOBS}, \
            "only a finished Job whose result is not recorded, once"
        state.scheduler.settled[key] = ("fingerprint",)
        scheduling.cache_changed(state, Change(DELETED, key, body, None))
        assert key not in state.scheduler.settled and ready_gauge() is None, "a deleted cache is forgotten"

    asyncio.run(run())


def test_the_workers_handle_each_queued_cache_under_the_handler_that_asked() -> None:
    state = State(settings=SETTINGS, metrics=Metrics())
    state.cluster.ready = True

    async def run() -> None:
        workers = [asyncio.create_task(scheduling.work(state, None)) for _ in range(2)]
        scheduling.enqueue(state, ("team-a", "gone"), scheduling.JOBS)  # not in the memory: nothing to do
        scheduling.enqueue(state, ("team-a", "also-gone"))
        while state.scheduler.queued or not state.scheduler.queue.empty():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    asyncio.run(run())
    count = "compilecache_handler_duration_seconds_count"
    assert state.metrics.registry.get_sample_value(count, {"handler": "jobs"}) == 1
    assert state.metrics.registry.get_sample_value(count, {"handler": "reconcile"}) == 1


def test_kopf_keeps_no_index_and_handles_no_cache_job_or_node() -> None:
    """Kopf holds every handler of every object until each index is loaded, through one toggle per object that
    each new object wakes: work beyond the square of the number of CompileCaches. The operator keeps its own
    watches instead (watches.py); Kopf watches only opted-in pods, which it never indexes."""
    registry = kopf.get_default_registry()  # the handlers register at import (compilecache_operator.handlers)
    assert not registry._indexing.get_all_handlers()
    handlers = [*registry._watching.get_all_handlers(), *registry._changing.get_all_handlers(),
                *registry._spawning.get_all_handlers()]
    assert {h.selector.any_name for h in handlers if h.selector is not None} == {"pods"}


def test_a_spec_is_parsed_once_whatever_its_status_does() -> None:
    """Every status the operator writes comes back as a new object: its spec is not parsed again for it."""
    body = cache()
    state = State(settings=SETTINGS, metrics=Metrics())
    first = reconcile.cache_spec(state, body)
    with_status = {**body, "metadata": {**body["metadata"], "resourceVersion": "101"}, "status": {"bundleCount": 0}}
    assert reconcile.cache_spec(state, with_status) is first
    changed = {**body, "spec": {**body["spec"], "image": "registry.example/other:2"}}
    assert reconcile.cache_spec(state, changed) is not first
    state.settings = dataclasses.replace(SETTINGS, retry_seconds=8)
    again = reconcile.cache_spec(state, changed)
    assert again is not first and reconcile.cache_spec(state, changed) is again


def test_a_resync_of_many_caches_lets_the_event_loop_run() -> None:
    """A resync that finds nothing to do makes no request: over thousands of caches it must still let the
    webhook's answers and the probes through, cache by cache."""
    state = State(settings=SETTINGS, metrics=Metrics())
    bodies = {}
    for i in range(300):
        body = cache()
        body["metadata"]["name"] = f"c{i}"
        bodies[("team-a", f"c{i}")] = body
    state.cluster.indexes = Indexes(caches=Singles(bodies))
    for key in bodies:
        state.scheduler.settled[key] = scheduling.fingerprint(state, key)
    ticks = 0

    async def run() -> int:
        nonlocal ticks
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        beside = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        handled = await scheduling.resync(state, None)
        done.set()
        await beside
        return handled

    assert asyncio.run(run()) == 0
    assert ticks >= 300 // SETTINGS.concurrency, "the loop ran between the caches looked at"


@given(st.lists(st.tuples(st.sampled_from(["team-a", "team-b"]), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
                          st.sampled_from([None, "", "privileged", "baseline", "restricted"])), max_size=12))
@settings(max_examples=60, deadline=None)
def test_the_namespaces_levels_follow_their_enforce_label(steps: list[tuple[str, str, str | None]]) -> None:
    """Each namespace's Pod Security enforce label as the webhook reads it: "" when unlabelled, gone when deleted."""
    from compilecache_operator.controller.watches import Watches

    watches = Watches.__new__(Watches)
    watches.namespace_levels = {}
    store: dict[Any, Any] = {}
    expected: dict[str, tuple[str]] = {}
    for version, (name, kind, label) in enumerate(steps, start=1):
        labels = {} if label is None else {"pod-security.kubernetes.io/enforce": label}
        change = apply_event(store, kind, {"metadata": {"name": name, "resourceVersion": str(version),
                                                        "labels": labels}})
        if change is not None:
            watches.namespace_changed(change)
        if kind == "DELETED":
            expected.pop(name, None)
        else:
            expected[name] = (label or "",)
    assert watches.namespace_levels == expected
