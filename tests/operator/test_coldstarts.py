"""Why pods started cold, per fleet: the workload's verdict read from pod status, tallied into the
CompileCache's status, and the ColdStarts condition. The verdicts are the ones ``cachelib.in_image.factors``
writes (its own tests make them with real torch.compile); here they are generated."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any

import kopf
import pytest
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions import coldstarts
from compilecache_operator.decisions.cache_status import build_status
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.handlers import count_cold_start
from compilecache_operator.lifecycle import CountedPods
from compilecache_operator.model import names
from compilecache_operator.model.spec import Defaults
from hypothesis import given
from hypothesis import strategies as st

from cachelib.verdict import CAUSES, WHY_KEY
from testsupport.servers import free_port

MISSES = [c for c in CAUSES if c != "none"]


def message(result: str, cause: str, reason: str) -> str:
    verdict = {"result": result, "cause": cause, "reason": reason}
    return "some output of the app\n" + json.dumps({WHY_KEY: verdict})


def pod(*, state: dict[str, Any] | None = None, last: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {"name": "app", "state": state or {"running": {}}, "lastState": last or {}}
    return {"metadata": {"labels": {names.CACHE_LABEL: "mlp"}}, "status": {"containerStatuses": [status]}}


def test_the_verdict_is_read_from_the_app_containers_termination_message() -> None:
    said = message("miss", "inductor_config", "inductor config max_autotune: False → True")
    verdict = coldstarts.pod_verdict(pod(state={"terminated": {"exitCode": 0, "message": said}}))
    assert verdict == coldstarts.Verdict("app", "miss", "inductor_config", "inductor config max_autotune: False → True")
    restarted = pod(last={"terminated": {"exitCode": 137, "message": said}})  # the run before a restart
    assert coldstarts.pod_verdict(restarted) == verdict
    assert coldstarts.pod_verdict(pod()) is None
    assert coldstarts.pod_verdict(pod(state={"terminated": {"exitCode": 1, "message": "Traceback ..."}})) is None


def test_a_verdict_keeps_its_labels_bounded_and_its_reason_free_of_credentials() -> None:
    odd = coldstarts.parse_verdict(message("miss", "cosmic rays", "env X: redis://u:hunter2@h → y"))
    assert odd is not None and odd.cause == "unknown" and "hunter2" not in odd.reason
    hit = coldstarts.parse_verdict(message("hit", "inductor_config", "all 3 graphs hit"))
    assert hit is not None and hit.cause == "none"
    assert coldstarts.parse_verdict(message("maybe", "none", "")) is None
    long = coldstarts.parse_verdict(message("miss", "shape", "x" * 5000))
    assert long is not None and len(long.reason) == coldstarts.MAX_REASON


verdicts = st.lists(
    st.one_of(
        st.builds(coldstarts.Verdict, st.just("app"), st.just("hit"), st.just("none"), st.just("")),
        st.builds(coldstarts.Verdict, st.just("app"), st.just("miss"), st.sampled_from(MISSES), st.text(max_size=20)),
    ),
    min_size=1, max_size=40,
)  # fmt: skip


@given(verdicts)
def test_the_tally_counts_every_pod_once_and_ranks_the_causes(seen: list[coldstarts.Verdict]) -> None:
    cold: dict[str, Any] | None = None
    for verdict in seen:
        cold = coldstarts.tally(cold, verdict)
    assert cold is not None
    misses = Counter(v.cause for v in seen if v.result == "miss")
    assert cold["pods"] == len(seen) and cold["cold"] == sum(misses.values())
    ranked = [(c["cause"], c["pods"]) for c in cold["causes"]]
    assert len(ranked) == len(misses)
    assert [n for _, n in ranked] == sorted((n for _, n in ranked), reverse=True)
    assert all(misses[cause] == n for cause, n in ranked)
    if misses:
        assert ranked[0][1] == max(misses.values())
    condition = coldstarts.condition(cold)
    if len(seen) < coldstarts.MIN_PODS:
        assert condition is None
    else:
        assert condition is not None
        assert condition.status == (bool(ranked) and ranked[0][1] * 2 > len(seen))
        if condition.status:
            assert ranked[0][0] in condition.message


def test_the_reconcile_leaves_the_tally_to_its_writer() -> None:
    """The reconcile's status (a merge patch) has no ``coldStarts``: the server keeps the tally's, however old
    the reconcile's view of it (tests/e2e/test_status_writers.py interleaves the two writers)."""
    cold = coldstarts.tally(None, coldstarts.Verdict("app", "miss", "dtype", "dtype float32 → bfloat16"))
    status = build_status({"coldStarts": cold}, generation=1, conditions=[], bundles=None, planned_gpus=None,
                          storage_url=None, now="2026-01-01T00:00:00Z")  # fmt: skip
    assert "coldStarts" not in status


def new_state(api: KubeAPI | None = None) -> State:
    return State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics(),
                 api=api)  # fmt: skip


def test_a_pod_without_a_verdict_or_an_api_is_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    """The API server here is a loopback port nothing listens on: a pod with a verdict tries it (and
    the failure is logged), a pod without one never does."""
    ended = pod(state={"terminated": {"exitCode": 0, "message": message("miss", "shape", "shape of l_x_: [4] → [8]")}})

    async def events() -> None:
        api = KubeAPI(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"), timeout=5)
        counted = CountedPods()
        try:
            await count_cold_start(new_state(api), counted, "MODIFIED", pod(), "team-a", "p1", "u1")
            assert "could not tally" not in caplog.text
            await count_cold_start(new_state(api), counted, "MODIFIED", ended, "team-a", "p2", "u2")
            assert "could not tally the cold start of pod team-a/p2" in caplog.text
            await count_cold_start(new_state(None), CountedPods(), "MODIFIED", ended, "team-a", "p3", "u3")
        finally:
            await api.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(events())
    assert "p3" not in caplog.text


def test_a_cause_past_the_fifth_is_still_counted_when_it_comes_back() -> None:
    """Six different causes, then the sixth again: it leads with 2 pods (none of its counts lost)."""
    causes = ["torch_version", "triton_version", "python_version", "device", "inductor_config", "dynamo_config"]
    cold: dict[str, Any] | None = None
    for cause in [*causes, "dynamo_config"]:
        cold = coldstarts.tally(cold, coldstarts.Verdict("app", "miss", cause, cause))
    assert cold is not None
    assert (cold["causes"][0]["cause"], cold["causes"][0]["pods"]) == ("dynamo_config", 2)
    assert len(cold["causes"]) == len(causes)
