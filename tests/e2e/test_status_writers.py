"""One writer at a time per CompileCache status: a pod's cold-start tally and a reconcile of its cache,
interleaved both ways on the real API server, lose nothing.

A status write is a merge patch, and a merge patch replaces a list whole: the reconcile writes the conditions
list it decided from its view of the cache, the tally writes ``coldStarts`` and the ``ColdStarts`` condition
from a fresh read. Here the operator's view (its index) lags behind the whole time, as when its watch is slow:

- the tally arrives while the reconcile is about to write (its status write is held open for a moment);
- the tally writes first, and the reconcile decides afterwards from the index that does not show it yet.

Both ways the cache ends with every pod counted, the ``ColdStarts`` condition and the reconcile's ``Ready``.
The control plane alone (shared with the session), no pods: the operator's reconcile and tally run in the
test's event loop against it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from compilecache_operator.controller import scheduling
from compilecache_operator.controller.state import Indexes, State
from compilecache_operator.decisions import coldstarts
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.handlers import count_cold_start
from compilecache_operator.lifecycle import CountedPods
from compilecache_operator.model import names

from bench import operator_scale
from cachelib.verdict import WHY_KEY
from tests.operator.reconcile_samples import SETTINGS
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CC_API, install_crd
from testsupport.kube.rest import KubeClient


def ended_pod(cache: str, n: int) -> dict[str, Any]:
    """A pod of ``cache`` whose app ended saying it compiled afresh (its verdict in the termination message)."""
    verdict = {"result": "miss", "cause": "shape", "reason": f"shape of l_x_: [4] → [{8 * n}]"}
    terminated = {"exitCode": 0, "message": json.dumps({WHY_KEY: verdict})}
    return {"metadata": {"name": f"app-{n}", "labels": {names.CACHE_LABEL: cache}},
            "status": {"containerStatuses": [{"name": "app", "state": {"terminated": terminated}}]}}


def operator_state(api: KubeAPI, index: Mapping[str, Any]) -> State:
    state = State(settings=SETTINGS, metrics=Metrics(), api=api)
    meta = index["metadata"]
    state.cluster.indexes = Indexes(caches={(meta["namespace"], meta["name"]): [index]})
    return state


def tally(state: State, counted: CountedPods, namespace: str, cache: str, n: int) -> Any:
    return count_cold_start(state, counted, "DELETED", ended_pod(cache, n), namespace, f"app-{n}", f"uid-{n}")


def conditions(body: Mapping[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}


@pytest.mark.parametrize("order", ["tally-while-reconciling", "tally-then-reconcile"])
def test_a_tally_and_a_reconcile_interleaved_lose_nothing(
    kube_cluster: LocalCluster, kube_client: KubeClient, namespace_factory: Callable[[str | None], str], order: str,
) -> None:
    install_crd(kube_client)
    namespace = namespace_factory(None)
    path = f"{CC_API}/namespaces/{namespace}/compilecaches/mlp"
    operator_scale.create_cache(kube_client, namespace, "mlp")

    async def scenario() -> None:
        api = KubeAPI(kube_cluster.connection("status-writers-test", ("system:masters",)))
        counted = CountedPods()
        try:
            first = operator_state(api, kube_client.get(path))
            await tally(first, counted, namespace, "mlp", 1)
            state = operator_state(api, kube_client.get(path))  # the index: one pod tallied, nothing reconciled
            if order == "tally-then-reconcile":
                await tally(state, counted, namespace, "mlp", 2)
                await scheduling.reconcile(state, namespace, "mlp")
                return
            write = api.patch_cache_status
            racing: list[asyncio.Task[None]] = []

            async def held_write(ns: str, name: str, status: Mapping[str, Any]) -> Any:
                if "observedGeneration" in status and not racing:  # the reconcile's write, not the tally's
                    racing.append(asyncio.create_task(tally(state, counted, namespace, "mlp", 2)))
                    await asyncio.sleep(1.0)  # long enough for the tally's read and write, were it not waiting
                return await write(ns, name, status)

            api.patch_cache_status = held_write  # type: ignore[method-assign]
            await scheduling.reconcile(state, namespace, "mlp")
            assert racing, "the reconcile wrote a status"
            await racing[0]
        finally:
            await api.close()

    asyncio.run(scenario())
    status = kube_client.get(path)["status"]
    assert status["coldStarts"]["pods"] == 2 and status["coldStarts"]["cold"] == 2, status["coldStarts"]
    now = conditions(kube_client.get(path))
    assert now.get("Ready") == "True" and now.get(coldstarts.CONDITION) == "True", status["conditions"]
