"""The Events the operator posts itself: what one says, a long message kept at its start and end, and a
queue that never makes the reconcile wait or fail (tests/e2e/test_informer.py posts them to a real API
server)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import kopf
import pytest
from compilecache_operator.edge.events import MAX_MESSAGE, EventPoster, event_body, shortened
from compilecache_operator.edge.kube import KubeAPI
from hypothesis import given
from hypothesis import strategies as st

from tests.operator.reconcile_samples import cache


@given(st.text(max_size=3000))
def test_a_message_is_kept_whole_or_by_its_start_and_end(message: str) -> None:
    short = shortened(message)
    if len(message) <= MAX_MESSAGE:
        assert short == message
    else:
        assert len(short) == MAX_MESSAGE and "..." in short
        assert short.startswith(message[:500]) and short.endswith(message[-500:])


def test_an_event_names_its_object_and_the_operator() -> None:
    body = cache()
    body["metadata"]["uid"] = "uid-1234"
    event = event_body(body, "Warning", "StoreUnavailable", "no answer", now=datetime(2026, 1, 2, 3, 4, 5, 6, UTC))
    assert event["metadata"] == {"namespace": "team-a", "generateName": "mlp."}
    assert event["involvedObject"] == {"apiVersion": body["apiVersion"], "kind": "CompileCache", "namespace": "team-a",
                                       "name": "mlp", "uid": "uid-1234"}
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "StoreUnavailable", "no answer")
    assert event["firstTimestamp"] == "2026-01-02T03:04:05Z" and event["eventTime"] == "2026-01-02T03:04:05.000006Z"
    assert event["source"] == {"component": "compilecache-operator"}


def test_a_full_queue_drops_the_event_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> int:
        poster = EventPoster(KubeAPI(kopf.ConnectionInfo(server="http://127.0.0.1:1")), limit=1)
        poster.emit(cache(), "Warning", "First", "kept")
        poster.emit(cache(), "Warning", "Second", "dropped")
        await poster.api.close()
        return poster.queue.qsize()

    assert asyncio.run(run()) == 1
    assert "event Second not posted (too many waiting): dropped" in caplog.text
