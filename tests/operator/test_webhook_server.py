"""The webhook endpoint's part in readiness and in a drain, against the operator's real aiohttp server.

A replica is ready only once its webhook endpoint accepts connections (Kopf starts it after the
start-up handlers), and while it drains each answer closes its connection, so that an API
server's kept-alive connections move to the other replicas before this one exits."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from compilecache_operator import lifecycle
from compilecache_operator.edge.kopfadapter import AdmissionServer

from tests.operator.reconcile_samples import cache, state_with
from testsupport.servers import free_port

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "u-1", "operation": "CREATE", "object": {"metadata": {}}}}  # fmt: skip


async def not_used(request: Any, **_: Any) -> Any:
    raise AssertionError("the direct answer serves the pod webhook")


def test_ready_only_once_the_endpoint_listens_and_a_drain_closes_each_connection() -> None:
    state = state_with(cache())
    state.cluster.ready = True
    port = free_port()
    server = AdmissionServer(addr="127.0.0.1", port=port, host=None, context=None)

    async def allow(review: Any) -> dict[str, Any]:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True}}

    server.answers = {"inject-pods": allow}
    server.draining = lambda: state.lifecycle.draining  # as the operator's start-up wires it
    ready = lifecycle.readiness(state, server)

    async def run() -> list[tuple[bool, str | None]]:
        assert not ready(), "the caches are known, but nothing listens on the webhook port yet"
        configs: asyncio.Queue[Any] = asyncio.Queue()

        async def serve() -> None:  # as Kopf's admission task consumes the server
            async for config in server(not_used):
                configs.put_nowait(config)

        serving = asyncio.create_task(serve())
        config = await configs.get()
        assert f":{port}" in config["url"] and ready()
        seen = []
        async with aiohttp.ClientSession() as session:
            for draining in (False, True):
                state.lifecycle.draining = draining
                async with session.post(f"http://127.0.0.1:{port}/inject-pods", json=REVIEW) as response:
                    body = await response.json()
                    assert body["response"] == {"uid": "u-1", "allowed": True}
                    seen.append((ready(), response.headers.get("Connection")))
        serving.cancel()  # the operator stopping
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        assert not server.listening
        return seen

    kept_alive, closing = asyncio.run(run())
    assert kept_alive == (True, None), "serving: the connection is kept alive"
    assert closing == (False, "close"), "draining: not ready, and the answer closes its connection"


def test_an_operator_without_a_webhook_is_ready_on_the_caches_alone() -> None:
    state = state_with(cache())
    state.cluster.ready = True
    assert lifecycle.readiness(state, None)()
