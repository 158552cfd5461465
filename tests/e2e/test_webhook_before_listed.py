"""A restarted operator injects pods before it has listed every CompileCache, exactly as it will afterwards.

Until its watches have listed the CompileCaches (seconds at 10,000), the webhook reads the one cache a pod asks
for (one GET, bounded). On the real API server, with the operator's watches, views and pod answer running in the
test's event loop:

- a pod of a Ready cache gets, before the list, the very answer (patch, annotations, warnings) it gets once
  every watch has listed;
- a pod naming a cache that does not exist gets the unknown-cache answer, before as after;
- a cache read before the list and deleted before the list ends is not kept: once listed, its pods are told it
  is unknown (the list, not the early read, is what the webhook knows from then on);
- an API server that does not answer costs the pod at most the bounded wait, and the pod is admitted as for an
  unknown cache (the webhook fails open).

The control plane alone (shared with the session), no pods run: the reviews are answered in process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from compilecache_operator import lifecycle
from compilecache_operator.controller.state import State
from compilecache_operator.controller.watches import Watches
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.model import preload_reasons
from compilecache_operator.model.names import WEBHOOK_ID

from bench import operator_scale
from tests.operator.reconcile_samples import SETTINGS
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CC_API, install_crd
from testsupport.kube.rest import KubeClient

READ_SECONDS = 2.0


def review(namespace: str, cache: str) -> dict[str, Any]:
    pod = operator_scale.labelled_pod(True)
    pod["metadata"] = {"name": "app", "labels": {"compilecache.io/cache": cache}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": namespace, "object": pod}}


def outcome(answer: dict[str, Any]) -> dict[str, Any]:
    """What a pod gets from an answer: the patch's operations and the warnings."""
    response = answer["response"]
    ops = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return {"allowed": response["allowed"], "ops": ops, "warnings": response.get("warnings", [])}


def skipped(answer: dict[str, Any]) -> str | None:
    """The ``compilecache.io/skipped`` annotation the answer gives the pod (None: injected)."""
    for op in outcome(answer)["ops"]:
        if op["path"] == "/metadata/annotations" and "compilecache.io/skipped" in op["value"]:
            return str(op["value"]["compilecache.io/skipped"])
        if op["path"] == "/metadata/annotations/compilecache.io~1skipped":
            return str(op["value"])
    return None


class Operator:
    """The operator's watches and pod answer, as :meth:`lifecycle.Runtime.start` wires them."""

    def __init__(self, api: KubeAPI, namespace: str) -> None:
        self.state = State(settings=SETTINGS, metrics=Metrics(), api=api)
        self.watches = Watches(api, [namespace], lambda: self.state.settings, on_cache=lambda _: None,
                               on_job=lambda _: None)
        self.answer = lifecycle.admission_answers(
            self.state, self.watches.views,
            lambda key: self.watches.fetch_unlisted(api, key, READ_SECONDS))[WEBHOOK_ID]
        self.tasks: list[asyncio.Task[None]] = []

    async def list(self) -> None:
        self.tasks = self.watches.start()
        await asyncio.wait_for(self.watches.wait_synced(), 60)
        assert self.watches.caches_listed()

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()


def test_before_the_list_a_pod_gets_the_answer_it_gets_after_it(
    kube_cluster: LocalCluster, kube_client: KubeClient, namespace_factory: Callable[[str | None], str],
) -> None:
    install_crd(kube_client)
    namespace = namespace_factory(None)
    for name in ("ready", "doomed"):
        operator_scale.create_cache(kube_client, namespace, name, ready=True)

    async def scenario() -> None:
        api = KubeAPI(kube_cluster.connection("before-listed-test", ("system:masters",)))
        operator = Operator(api, namespace)
        try:
            early = await operator.answer(review(namespace, "ready"))
            assert (namespace, "ready") in operator.watches.fetched, "read by its pod"
            unknown = await operator.answer(review(namespace, "nowhere"))
            assert skipped(unknown) == preload_reasons.UNKNOWN_CACHE, outcome(unknown)
            assert skipped(await operator.answer(review(namespace, "doomed"))) is None, "Ready before the list"
            kube_client.delete(f"{CC_API}/namespaces/{namespace}/compilecaches/doomed")

            await operator.list()
            assert not operator.watches.fetched, "the list replaces what was read one by one"
            late = await operator.answer(review(namespace, "ready"))
            assert outcome(early) == outcome(late), (outcome(early), outcome(late))
            assert skipped(late) is None and any(op["path"].startswith("/spec/") for op in outcome(late)["ops"])
            assert skipped(await operator.answer(review(namespace, "nowhere"))) == preload_reasons.UNKNOWN_CACHE
            gone = await operator.answer(review(namespace, "doomed"))
            assert skipped(gone) == preload_reasons.UNKNOWN_CACHE, ("deleted before the list ended", outcome(gone))
        finally:
            operator.stop()
            await api.close()

    asyncio.run(scenario())


def test_an_api_server_that_does_not_answer_costs_the_pod_the_bounded_wait_only(
    kube_cluster: LocalCluster,
) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    try:
        info = kube_cluster.connection("before-listed-test", ("system:masters",),
                                       f"https://127.0.0.1:{silent.getsockname()[1]}")

        async def scenario() -> tuple[float, dict[str, Any]]:
            api = KubeAPI(info)
            operator = Operator(api, "team-a")
            try:
                started = time.monotonic()
                answer = await operator.answer(review("team-a", "mlp"))
                return time.monotonic() - started, answer
            finally:
                await api.close()

        spent, answer = asyncio.run(scenario())
    finally:
        silent.close()
    assert spent < READ_SECONDS + 1.0, spent
    assert answer["response"]["allowed"] is True and skipped(answer) == preload_reasons.UNKNOWN_CACHE, outcome(answer)
