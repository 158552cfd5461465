"""Every write of a reconcile can fail; each failure ends in Ready=False naming what failed and why, and a
Warning event, and the cache is looked at again. No failure is swallowed, none leaves the cache without a
status (unless the status write itself fails: then the event and the log say so).

The API here is :class:`ScriptedAPI`, a stand-in (a mock) for the API server at the reconcile's writes: a
real API server cannot be made to conflict, time out or fail with a 500 on a chosen write. The real API
server's own refusal of a Job is in tests/e2e/test_operator_failures.py."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, cast

import pytest
from compilecache_operator.controller import reconcile, reconcile_failures, scheduling
from compilecache_operator.controller.state import Indexes, Settings, State
from compilecache_operator.decisions import warmup_job
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model.names import FINALIZER, RECORDED_ANNOTATION, VARIANT_LABEL, WARMUP_LABEL
from compilecache_operator.model.spec import Defaults
from compilecache_operator.model.store_ca import STORE_CA_FILE

from tests.operator.samples import owner
from testsupport.servers import free_port

KEY = ("team-a", "mlp")
SETTINGS = Settings(defaults=Defaults(), jobs=warmup_job.JobSettings(preloader_image="p"), retry_seconds=30)
SECRET = "hunter2-secret"
TLS_URL = f"rediss://redis.cache:6379/0?ca={STORE_CA_FILE}"


def refused(*causes: tuple[str, str]) -> KubeError:
    """What the API server answers to a Job it refuses (HTTP 422 with the fields in details.causes)."""
    import json

    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
              "message": 'Job.batch "mlp-x" is invalid: ' + "; ".join(f"{f}: {m}" for f, m in causes),
              "details": {"causes": [{"field": f, "message": m, "reason": "FieldValueInvalid"} for f, m in causes]}}
    return KubeError("POST", "/apis/batch/v1/namespaces/team-a/jobs", 422, json.dumps(status))


class ScriptedAPI:
    """A stand-in for :class:`KubeAPI` at the calls a reconcile makes (a mock, see the module's docstring).
    ``fail`` maps a method to the errors its next calls raise, one per call; every call is recorded."""

    def __init__(self, fail: dict[str, list[BaseException]] | None = None) -> None:
        self.fail = {name: list(errors) for name, errors in (fail or {}).items()}
        self.calls: list[str] = []
        self.statuses: list[dict[str, Any]] = []

    async def _call(self, name: str) -> None:
        self.calls.append(name)
        errors = self.fail.get(name)
        if errors:
            raise errors.pop(0)

    async def set_finalizers(self, namespace: str, name: str, current: Any, new: Any) -> dict[str, Any]:
        await self._call("set_finalizers")
        return {}

    async def create_job(self, namespace: str, job: Any) -> bool:
        await self._call("create_job")
        return True

    async def delete_job(self, namespace: str, name: str) -> bool:
        await self._call("delete_job")
        return True

    async def annotate_job(self, namespace: str, name: str, annotations: Any) -> None:
        await self._call("annotate_job")

    async def patch_cache_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        await self._call("patch_cache_status")
        self.statuses.append(status)
        return {}

    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        await self._call("read_secret")
        return None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        await self._call("list_pods")
        return []


def run(body: dict[str, Any], api: ScriptedAPI, jobs: tuple[dict[str, Any], ...] = ()) -> tuple[
        State, reconcile.Outcome | None, list[tuple[str, str, str]]]:
    """One ``handle`` of the cache: the state after it, the reconcile's outcome and the events posted."""
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs={"uid-1234": list(jobs)})
    events: list[tuple[str, str, str]] = []

    def emit(_body: Any, type_: str, reason: str, message: str) -> None:
        events.append((type_, reason, message))

    async def go() -> reconcile.Outcome | None:
        return await scheduling.reconcile(state, *KEY, emit=emit)

    return state, asyncio.run(go()), events


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def cache(**spec: Any) -> dict[str, Any]:
    body = owner(**spec)
    body["metadata"]["resourceVersion"] = "100"
    return body


def superseded_job(body: dict[str, Any]) -> dict[str, Any]:
    """A finished, counted Job of a variant the plan no longer has: the reconcile deletes it."""
    return {"metadata": {"name": "mlp-old", "namespace": "team-a", "uid": "job-old", "resourceVersion": "7",
                         "labels": {WARMUP_LABEL: "mlp", VARIANT_LABEL: "gone", "compilecache.io/generation": "1"},
                         "annotations": {RECORDED_ANNOTATION: "failed"},
                         "ownerReferences": [{"kind": "CompileCache", "uid": "uid-1234", "name": "mlp"}]},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}


def test_a_job_the_api_server_refuses_names_the_spec_field_in_the_status_and_an_event() -> None:
    api = ScriptedAPI({"create_job": [refused(("spec.template.spec.tolerations[0].key", "Invalid value: \"$(id)\""))]})
    state, result, events = run(cache(), api)
    assert result is not None and result.problem and result.until_changed and result.retry_after is None
    condition = ready(api.statuses[-1])
    assert (condition["status"], condition["reason"]) == ("False", reconcile_failures.JOB_REFUSED)
    assert condition["message"].startswith("spec.warmup.tolerations: creating warm-up Job cc-mlp-")
    assert "HTTP 422 Invalid" in condition["message"] and "$(id)" in condition["message"]
    assert ("Warning", reconcile_failures.JOB_REFUSED, condition["message"]) in events
    assert KEY in state.scheduler.warnings and KEY in state.scheduler.settled, "settled until the cache changes"


def test_a_job_refused_for_good_is_said_once_and_tried_again_only_when_the_cache_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """HTTP 422 on the Job: one Warning event and one warning line, no look again scheduled, the resync and the
    cache's own events (its status write) pass it by; a new version of the cache (its spec changed) tries once
    more. A 403 (a quota: it may pass) is looked at again instead."""
    body = cache()
    api = ScriptedAPI({"create_job": [refused(("spec.template.spec.tolerations[0].key", "Invalid value")) for _ in
                                      range(3)]})
    state = State(settings=replace(SETTINGS, retry_seconds=0.01), metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs={})
    events: list[str] = []

    def emit(_body: Any, _type: str, reason: str, _message: str) -> None:
        events.append(reason)

    async def go() -> None:
        await scheduling.handle(state, KEY, emit)
        assert KEY not in state.scheduler.retries, "no look again scheduled"
        for _ in range(5):  # the resync and the events of its own status write
            await scheduling.resync(state, emit)
            await scheduling.handle(state, KEY, emit)
            await asyncio.sleep(0.02)
        assert api.calls.count("create_job") == 1
        changed = {**body, "metadata": {**body["metadata"], "resourceVersion": "101", "generation": 2}}
        state.cluster.indexes = Indexes(caches={KEY: [changed]}, jobs={})
        await scheduling.handle(state, KEY, emit)
        assert api.calls.count("create_job") == 2, "a new version of the cache tries again"

    with caplog.at_level(logging.INFO, logger="compilecache_operator.controller.scheduling"):
        asyncio.run(go())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, "one line for each version of the cache refused"
    assert all("not tried again until the CompileCache changes" in w for w in warnings)
    assert "-g3 refused" in warnings[0] and "-g2 refused" in warnings[1]
    assert events.count(reconcile_failures.JOB_REFUSED) == 2
    quota = KubeError("POST", "/x", 403, '{"reason": "Forbidden", "message": "exceeded quota: no-jobs"}')
    _, result, _ = run(cache(), ScriptedAPI({"create_job": [quota]}))
    assert result is not None and not result.until_changed and result.retry_after == SETTINGS.retry_seconds


def test_a_lasting_problem_is_looked_at_again_less_and_less_often() -> None:
    """Each reconcile that ends in a problem doubles the pause before the next look, up to BACKOFF_LIMIT times
    retry_seconds; one that ends without a problem starts again from retry_seconds."""
    from compilecache_operator.controller.state import BACKOFF_LIMIT

    api = ScriptedAPI({"create_job": [RuntimeError("down") for _ in range(6)]})
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [cache()]}, jobs={})

    async def pauses(times: int) -> list[float | None]:
        out = []
        for _ in range(times):
            result = await scheduling.reconcile(state, *KEY)
            out.append(result.retry_after if result else None)
        return out

    seen = asyncio.run(pauses(6))
    base = SETTINGS.retry_seconds
    assert seen == [base, 2 * base, 4 * base, 8 * base, BACKOFF_LIMIT * base, BACKOFF_LIMIT * base], seen
    assert asyncio.run(pauses(1)) == [None] and KEY not in state.scheduler.failures, "healthy again"


@pytest.mark.parametrize(("method", "error", "what", "spec", "jobs"), [
    ("set_finalizers", KubeError("PATCH", "/x", 422, '{"reason": "Invalid", "message": "test failed"}'),
     "setting the finalizers", {"deletionPolicy": "Delete"}, ()),
    ("set_finalizers", KubeError("PATCH", "/x", 409, '{"reason": "Conflict", "message": "changed"}'),
     "setting the finalizers", {"deletionPolicy": "Delete"}, ()),
    ("create_job", KubeError("POST", "/x", 0, "TimeoutError: "), "creating warm-up Job", {}, ()),
    ("create_job", KubeError("POST", "/x", 500, '{"reason": "InternalError", "message": "etcd"}'),
     "creating warm-up Job", {}, ()),
    ("create_job", RuntimeError("anything at all"), "creating warm-up Job", {}, ()),
    ("delete_job", KubeError("DELETE", "/x", 0, "ServerDisconnectedError"), "deleting superseded warm-up Job mlp-old",
     {}, "superseded"),
    ("patch_cache_status", KubeError("PATCH", "/x", 409, '{"reason": "Conflict", "message": "changed"}'),
     "writing the status", {}, ()),
    ("patch_cache_status", KubeError("PATCH", "/x", 422, '{"reason": "Invalid", "message": "bad status"}'),
     "writing the status", {"image": ""}, ()),
])
def test_each_write_that_fails_ends_in_a_condition_and_an_event(
    method: str, error: BaseException, what: str, spec: dict[str, Any], jobs: Any
) -> None:
    body = cache(**spec)
    api = ScriptedAPI({method: [error]})
    _, result, events = run(body, api, (superseded_job(body),) if jobs else ())
    assert method in api.calls
    assert result is not None and result.problem and what in result.problem
    condition = ready(api.statuses[-1])
    assert (condition["status"], condition["reason"]) == ("False", reconcile_failures.APPLY_FAILED)
    assert condition["message"].startswith(what), condition
    warnings = [e for e in events if e[0] == "Warning"]
    assert warnings == [("Warning", reconcile_failures.APPLY_FAILED, condition["message"])]


def test_a_failure_before_any_write_is_a_reconcile_failure_with_a_status() -> None:
    api = ScriptedAPI({"read_secret": [KubeError("GET", "/api/v1/namespaces/team-a/secrets/s", 500,
                                                 '{"reason": "InternalError", "message": "etcd timeout"}')]})
    _, result, events = run(cache(storage={"url": "redis://r:6379/0", "secretRef": {"name": "s"}}), api)
    assert result is not None and result.problem
    condition = ready(api.statuses[-1])
    assert condition["reason"] == reconcile_failures.RECONCILE_FAILED
    assert "HTTP 500 InternalError" in condition["message"]
    assert events and events[-1][:2] == ("Warning", reconcile_failures.RECONCILE_FAILED)


def test_a_storage_secret_the_operator_may_not_read_is_said_with_how_to_allow_it() -> None:
    """HTTP 403 on the storage Secret: SecretForbidden on the status and in one Warning event, looked at again
    (a RoleBinding made later is seen at the next look), nothing created."""
    api = ScriptedAPI({"read_secret": [KubeError("GET", "/api/v1/namespaces/team-a/secrets/s", 403,
                                                 '{"reason": "Forbidden", "message": "no"}')]})
    _, result, events = run(cache(storage={"url": "redis://r:6379/0", "secretRef": {"name": "s"}}), api)
    assert result is not None and result.problem and result.retry_after
    condition = ready(api.statuses[-1])
    assert (condition["status"], condition["reason"]) == ("False", "SecretForbidden")
    assert "may not read Secret 's' in namespace 'team-a'" in condition["message"]
    assert [e[:2] for e in events if e[0] == "Warning"] == [("Warning", "SecretForbidden")]
    assert "create_job" not in api.calls


def test_a_status_that_cannot_be_written_is_said_in_the_event_and_the_log(caplog: pytest.LogCaptureFixture) -> None:
    down = [KubeError("PATCH", "/x", 0, "ClientConnectorError") for _ in range(4)]
    api = ScriptedAPI({"patch_cache_status": down})
    with caplog.at_level(logging.WARNING, logger="compilecache_operator.controller.scheduling"):
        _, result, events = run(cache(), api)
    assert result is not None and result.problem and not api.statuses
    (warning,) = [e for e in events if e[0] == "Warning"]
    assert warning[1] == reconcile_failures.APPLY_FAILED and "the status could not be written" in warning[2]
    assert "could not be written either" in caplog.text


def test_credentials_in_an_error_reach_neither_the_status_nor_the_event(caplog: pytest.LogCaptureFixture) -> None:
    error = KubeError("POST", "/x", 500, f'{{"message": "dial redis://admin:{SECRET}@r:6379/0?token={SECRET}"}}')
    api = ScriptedAPI({"create_job": [error]})
    with caplog.at_level(logging.WARNING):
        _, _, events = run(cache(), api)
    shown = [ready(api.statuses[-1])["message"], *(e[2] for e in events)]
    assert "redis://***@r:6379/0?token=***" in shown[0]
    assert not [text for text in shown if SECRET in text]


def test_a_failed_reconcile_is_looked_at_again() -> None:
    api = ScriptedAPI({"create_job": [RuntimeError("down")]})
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [cache()]})

    async def go() -> bool:
        await scheduling.handle(state, KEY, None)
        scheduled = KEY in state.scheduler.retries
        for handle in state.scheduler.retries.values():
            handle.cancel()
        return scheduled

    assert asyncio.run(go())
    assert ready(api.statuses[-1])["reason"] == reconcile_failures.APPLY_FAILED


def test_the_job_fields_map_to_the_spec_fields_they_come_from() -> None:
    assert reconcile_failures.cache_field("spec.template.spec.nodeSelector") == "spec.warmup.nodeSelector"
    assert reconcile_failures.cache_field("spec.template.spec.containers[0].image") == "spec.image"
    field = "spec.template.spec.containers[1].resources.limits[x]"
    assert reconcile_failures.cache_field(field) == "spec.warmup.resources"
    assert reconcile_failures.cache_field("spec.activeDeadlineSeconds") == "spec.warmup.activeDeadlineSeconds"
    assert reconcile_failures.cache_field("metadata.labels") is None


@pytest.mark.parametrize("spec", [{}, {"image": ""}, {"storage": {"url": TLS_URL, "ca": {"secretName": "ca"}}}],
                         ids=["valid", "invalid", "private-ca"])
def test_one_reconcile_parses_the_spec_and_its_store_url_once(spec: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec is parsed and checked once per reconcile (the fingerprint, the snapshot and the decisions
    share it), and the store URL once within that parse (the allow-list check and the store CA's check read
    the parsed one)."""
    from compilecache_operator.model import confinement, store_ca
    from compilecache_operator.model import spec_parse as spec_module
    from compilecache_operator.model.confinement import Confinement

    counts = {"spec": 0, "url": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(reconcile, "parse_spec", counted("spec", reconcile.parse_spec))
    monkeypatch.setattr(spec_module, "parse_store_url", counted("url", spec_module.parse_store_url))
    monkeypatch.setattr(confinement, "parse_store_url", counted("url", confinement.parse_store_url))
    monkeypatch.setattr(store_ca, "parse_store_url", counted("url", spec_module.parse_store_url), raising=False)
    settings = Settings(defaults=Defaults(), jobs=warmup_job.JobSettings(preloader_image="p"), retry_seconds=30,
                        confinement=Confinement(store_hosts=("redis.cache:6379",)))
    api = ScriptedAPI()
    state = State(settings=settings, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [cache(**spec)]}, jobs={})
    asyncio.run(scheduling.reconcile(state, *KEY))
    assert "patch_cache_status" in api.calls, "the reconcile ran to its status"
    assert counts == {"spec": 1, "url": 1}, counts


@pytest.mark.parametrize("deleting", [False, True], ids=["reconciled", "deleted"])
def test_a_resync_parses_each_spec_once(deleting: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resync's fingerprint and the reconcile, or the deletion, that follows share one parse of the spec:
    the cluster view keeps it with the object and the settings it was checked from, and a new version of
    either is parsed again."""
    counts = {"spec": 0}
    real = reconcile.parse_spec

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts["spec"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(reconcile, "parse_spec", counted)
    body = cache(storage={"url": f"file://{tmp_path}"}, deletionPolicy="Delete")
    body["metadata"]["finalizers"] = [FINALIZER]
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    api = ScriptedAPI()
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs={})
    events: list[str] = []
    assert asyncio.run(scheduling.resync(state, lambda _body, _type, reason, _message: events.append(reason))) == 1
    assert counts["spec"] == 1, counts
    if deleting:
        assert "BundlesDeleted" in events and api.calls[-1] == "set_finalizers", (events, api.calls)
    else:
        assert "patch_cache_status" in api.calls
    scheduling.fingerprint(state, KEY)
    assert counts["spec"] == 1, "the same object, the same settings: the spec already checked"
    state.settings = replace(state.settings, retry_seconds=31)
    scheduling.fingerprint(state, KEY)
    assert counts["spec"] == 2, "new settings (a grant, a signing key): checked again"
    state.cluster.indexes = Indexes(caches={KEY: [cache(storage={"url": f"file://{tmp_path}"})]}, jobs={})
    scheduling.fingerprint(state, KEY)
    assert counts["spec"] == 3, "a new version of the object: checked again"


def test_a_deletion_opens_only_a_store_within_the_allow_lists() -> None:
    """A cache whose store left the allow-lists after it got its finalizer (its spec changed, or a grant was
    withdrawn) is deleted without the operator opening that store: its bundles are left in place and said so.
    The store here is a loopback port nothing listens on: opening it would fail and keep the finalizer."""
    from compilecache_operator.model.confinement import Confinement

    body = cache(storage={"url": f"redis://127.0.0.1:{free_port()}/0"}, deletionPolicy="Delete")
    body["metadata"]["finalizers"] = [FINALIZER]
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    settings = replace(SETTINGS, confinement=Confinement(store_hosts=("redis.cache:6379",)))
    api = ScriptedAPI()
    state = State(settings=settings, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs={})
    events: list[tuple[str, str]] = []
    asyncio.run(scheduling.handle(state, KEY, lambda _body, _type, reason, message: events.append((reason, message))))
    (reason, message), = events
    assert reason == "BundlesDeleted" and message.startswith("spec is invalid, bundles left in place: spec.storage.url")
    assert api.calls[-1] == "set_finalizers" and KEY not in state.scheduler.retries


def test_a_deletion_whose_storage_secret_may_not_be_read_says_so_once_and_keeps_the_finalizer() -> None:
    """HTTP 403 on the storage Secret of a cache being deleted: the bundles cannot be deleted yet; one Warning
    event SecretForbidden with the command that lets the operator in, the finalizer kept, looked at again."""
    body = cache(storage={"url": "redis://redis.cache:6379/0", "secretRef": {"name": "s"}}, deletionPolicy="Delete")
    body["metadata"]["finalizers"] = [FINALIZER]
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    forbidden = KubeError("GET", "/api/v1/namespaces/team-a/secrets/s", 403, '{"reason": "Forbidden"}')
    api = ScriptedAPI({"read_secret": [forbidden, forbidden]})
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs={})
    events: list[tuple[str, str]] = []
    for _ in range(2):
        asyncio.run(scheduling.handle(state, KEY, lambda _b, _t, reason, message: events.append((reason, message))))
    assert [reason for reason, _ in events] == ["SecretForbidden"], events
    assert "may not read Secret 's' in namespace 'team-a'" in events[0][1]
    assert api.calls.count("read_secret") == 2 and "set_finalizers" not in api.calls


def test_a_deletion_deletes_every_job_while_the_watch_removes_them_from_the_index(tmp_path: Any) -> None:
    """A cache being deleted with three warm-up Jobs: the operator deletes them one by one, and the watch's
    DELETED event of each arrives while it waits for the next answer (the index's group of that cache shrinks
    under the loop). Every Job is deleted, the bundles after them, and no "dictionary changed size during
    iteration" ends the deletion in CleanupFailed."""
    from compilecache_operator.controller.state import owner_uids
    from compilecache_operator.controller.watches import Grouped
    from compilecache_operator.edge.informer import DELETED, Change, index_by

    body = cache(storage={"url": f"file://{tmp_path}"}, deletionPolicy="Delete")
    body["metadata"]["finalizers"] = [FINALIZER]
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    groups: dict[str, dict[Any, Any]] = {}
    for i in range(3):
        job = {**superseded_job(body)}
        job["metadata"] = {**job["metadata"], "name": f"mlp-{i}", "uid": f"job-{i}"}
        index_by(groups, Change("ADDED", ("team-a", f"mlp-{i}"), None, job), owner_uids)

    class WatchedAPI(ScriptedAPI):
        async def delete_job(self, namespace: str, name: str) -> bool:
            await super().delete_job(namespace, name)
            gone = groups["uid-1234"][(namespace, name)]
            index_by(groups, Change(DELETED, (namespace, name), gone, None), owner_uids)  # the watch, meanwhile
            await asyncio.sleep(0)
            return True

    api = WatchedAPI()
    state = State(settings=SETTINGS, metrics=Metrics(), api=cast(KubeAPI, api))
    state.cluster.indexes = Indexes(caches={KEY: [body]}, jobs=Grouped(groups))
    events: list[tuple[str, str]] = []
    asyncio.run(scheduling.handle(state, KEY, lambda _body, _type, reason, message: events.append((reason, message))))
    assert api.calls.count("delete_job") == 3, api.calls
    assert [reason for reason, _ in events] == ["BundlesDeleted"], events
    assert api.calls[-1] == "set_finalizers"
