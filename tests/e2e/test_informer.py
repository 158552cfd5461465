"""The operator's own I/O against the real API server.

- Its watches: list then watch, a label selector, a watch whose connection drops (started again from the last
  version, no new list), a version the server no longer serves (its watch cache started afresh, as after a
  restart of the API server: 410 Gone, listed afresh, the deletions missed meanwhile reported), and every
  change in the server's order.
- Its Events: what the API server's validation accepts, read back as posted (a long message shortened).

No pods run: the control plane alone, shared with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from compilecache_operator.edge.events import EventPoster
from compilecache_operator.edge.informer import ADDED, DELETED, MODIFIED, Change, Informer, Resource
from compilecache_operator.edge.kube import KubeAPI

from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.wait import wait_for

SELECTOR = "compilecache.io/warmup-for"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def widget_crd(group: str) -> dict[str, Any]:
    """A kind of the test's own, so that the test can start the API server's watch cache for it afresh (by
    making the CRD again), as a restart of the API server does."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}]}}


def make_kind(client: KubeClient, group: str) -> None:
    client.post(CRDS, widget_crd(group))
    wait_for(lambda: any(c["type"] == "Established" and c["status"] == "True"
                         for c in client.get(f"{CRDS}/widgets.{group}").get("status", {}).get("conditions") or []),
             30, "the test kind established")
    wait_for(lambda: client.exists(f"/apis/{group}/v1/widgets"), 30, "the test kind served")


def remove_kind(client: KubeClient, group: str) -> None:
    if client.exists(f"{CRDS}/widgets.{group}"):
        client.delete(f"{CRDS}/widgets.{group}")
    wait_for(lambda: not client.exists(f"{CRDS}/widgets.{group}"), 60, "the test kind gone")


def put(client: KubeClient, path: str, name: str, value: str, labelled: bool = True) -> dict[str, Any]:
    """Create or change one object of ``path`` (ConfigMaps or the test's widgets): ``data.v`` is ``value``."""
    labels = {SELECTOR: "c"} if labelled else {}
    kind = "ConfigMap" if path.endswith("/configmaps") else "Widget"
    api_version = "v1" if kind == "ConfigMap" else path.split("/")[2] + "/v1"
    body = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "labels": labels}, "data": {"v": value}}
    if client.exists(f"{path}/{name}"):
        return client.merge_patch(f"{path}/{name}", {"data": {"v": value}})
    return client.post(path, body)


def held(informer: Informer) -> dict[str, str]:
    return {name: body["data"]["v"] for (_, name), body in informer.store.items()}


async def until(probe: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Relay:
    """A TCP relay to the API server in the test's event loop whose connections can all be dropped at once,
    as a network fault would (TLS passes through; new connections are relayed again)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self.accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        self.cut()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> int:
        """Drop every open connection; returns how many there were."""
        cut, self.writers = [w for w in self.writers if not w.is_closing()], []
        for writer in cut:
            writer.transport.abort()
        return len(cut)


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_watch_follows_the_server_through_a_dropped_connection_and_a_gone_version(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str,
) -> None:
    ns = kube_namespace
    group = f"{ns}.informer.compilecache.test"
    path = f"/apis/{group}/v1/namespaces/{ns}/widgets"
    port = int(kube_cluster.server.rsplit(":", 1)[1])
    make_kind(kube_client, group)
    for name in ("a", "b", "c"):
        put(kube_client, path, name, "1")
    put(kube_client, path, "unlabelled", "1", labelled=False)
    changes: list[Change] = []

    async def scenario() -> None:
        relay = Relay(port)
        async with relay as relay_port:
            api = KubeAPI(kube_cluster.connection("informer-test", ("system:masters",), f"https://127.0.0.1:{relay_port}"))
            informer = Informer(api, Resource(f"{group}/v1", "Widget", "widgets", selector=SELECTOR), changes.append,
                                namespace=ns, watch_seconds=60)
            try:
                async with running(informer):
                    await asyncio.wait_for(informer.synced.wait(), 20)
                    assert held(informer) == {"a": "1", "b": "1", "c": "1"}, "listed: only the labelled ones"
                    assert sorted(c.key[1] for c in changes) == ["a", "b", "c"] and {c.type for c in changes} == {ADDED}
                    await until(lambda: informer.watches == 1, "the watch")
                    put(kube_client, path, "a", "2")
                    await until(lambda: held(informer)["a"] == "2", "a change seen by the watch")

                    assert relay.cut() >= 2, "the watch's connection, both ends"
                    put(kube_client, path, "b", "2")  # while no watch is open
                    kube_client.delete(f"{path}/c")
                    await until(lambda: held(informer) == {"a": "2", "b": "2"}, "the changes made while it was down")
                    assert informer.lists == 1 and informer.watches >= 2, "started again from its version, no list"
                    put(kube_client, path, "b", "3")
                    put(kube_client, path, "b", "4")
                    await until(lambda: held(informer).get("b") == "4", "two changes in a row")

                # While it is away, the API server's watch cache of the kind starts afresh (as after a restart of
                # the API server): the version the informer holds is older than any it can serve now.
                remove_kind(kube_client, group)
                make_kind(kube_client, group)
                put(kube_client, path, "b", "5")
                put(kube_client, path, "d", "1")
                seen = len(changes)
                async with running(informer):
                    await until(lambda: informer.lists == 2, "a new list after 410 Gone")
                    await until(lambda: held(informer) == {"b": "5", "d": "1"}, "the store as the server holds it")
                after = {(c.type, c.key[1]) for c in changes[seen:]}
                assert after == {(DELETED, "a"), (MODIFIED, "b"), (ADDED, "d")}, "each difference, the deletion too"
            finally:
                await api.close()

    try:
        asyncio.run(scenario())
    finally:
        remove_kind(kube_client, group)
    history: dict[str, Any] = {}
    for change in changes:  # in the server's order: each change starts where the one before it ended
        assert history.get(change.key[1]) == change.old
        history[change.key[1]] = change.new
    assert {n: b["data"]["v"] for n, b in history.items() if b is not None} == {"b": "5", "d": "1"}


def test_the_events_the_operator_posts_are_accepted_and_read_back(
    kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str,
) -> None:
    ns = kube_namespace
    involved = put(kube_client, f"/api/v1/namespaces/{ns}/configmaps", "involved", "1")
    long_message = "x" * 3000

    async def scenario() -> None:
        api = KubeAPI(kube_cluster.connection("events-test", ("system:masters",)))
        poster = EventPoster(api)
        task = asyncio.create_task(poster.run())
        try:
            poster.emit(involved, "Warning", "StoreUnavailable", "the store at redis://cache:6379/0 did not answer")
            poster.emit(involved, "Normal", "Long", long_message)
            await until(lambda: poster.queue.empty(), "the events posted")
            await asyncio.sleep(0.2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await api.close()

    asyncio.run(scenario())
    events = {e["reason"]: e for e in kube_client.get(f"/api/v1/namespaces/{ns}/events")["items"]}
    said = events["StoreUnavailable"]
    assert (said["type"], said["message"]) == ("Warning", "the store at redis://cache:6379/0 did not answer")
    assert said["involvedObject"]["uid"] == involved["metadata"]["uid"]
    assert said["source"]["component"] == "compilecache-operator"
    assert len(events["Long"]["message"]) == 1024 and events["Long"]["message"].startswith("xxx")
