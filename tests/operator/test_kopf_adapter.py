"""What the operator relies on from Kopf for its admission webhooks (compilecache_operator.edge.kopfadapter), checked
against the installed Kopf: the release it is written against, the server protocol Kopf drives, the webhooks of
Kopf's managed configurations (name, failure policy, rules, selector, and a URL ending in the handler id that the
server routes by), and the registry's handler ids. A Kopf that changes any of these fails here."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
from compilecache_operator import handlers
from compilecache_operator.edge import kopfadapter
from compilecache_operator.model.names import CACHE_LABEL, CACHE_WEBHOOK_ID, WEBHOOK_ID
from kopf._cogs.aiokits.aiovalues import Container
from kopf._cogs.structs.references import Insights, Resource
from kopf._core.engines.admission import admission_webhook_server, build_webhooks

from testsupport.servers import free_port

LOCK = Path(__file__).resolve().parents[2] / "images" / "operator" / "requirements.lock"
RESOURCES = {Resource(group="", version="v1", plural="pods"),
             Resource(group="compilecache.io", version="v1alpha1", plural="compilecaches")}


def test_kopf_is_the_release_the_adapter_is_written_against() -> None:
    pinned = re.search(r"^kopf==(\S+)", LOCK.read_text(), re.MULTILINE)
    assert pinned is not None and pinned.group(1) == kopfadapter.KOPF_VERSION, "the image's Kopf changed"
    assert importlib.metadata.version("kopf") == kopfadapter.KOPF_VERSION, "the installed Kopf changed"


def test_each_webhook_is_registered_once_and_refuses_to_run_as_kopfs_handler() -> None:
    registry = kopf.OperatorRegistry()
    kopfadapter.register(handlers.admission_hooks(), registry)
    assert kopfadapter.registered_ids(registry) == {WEBHOOK_ID}
    for _ in range(2):
        handlers.register_webhook(registry, check_caches=True)
    assert kopfadapter.registered_ids(registry) == {WEBHOOK_ID, CACHE_WEBHOOK_ID}
    registered = registry._webhooks.get_all_handlers()
    assert len(registered) == 2
    for handler in registered:
        with pytest.raises(kopf.PermanentError):
            asyncio.run(handler.fn())


async def kopfs_own_answer(request: Any, **_: Any) -> Any:
    raise AssertionError("every webhook is answered by the operator's own answer")


def test_kopf_drives_the_server_and_its_managed_webhooks_reach_each_answer() -> None:
    registry = kopf.OperatorRegistry()
    hooks = handlers.admission_hooks(check_caches=True)
    kopfadapter.register(hooks, registry)
    port = free_port()
    server = kopfadapter.AdmissionServer(addr="127.0.0.1", port=port, host="127.0.0.1", context=None,
                                         cadata=b"-----BEGIN CERTIFICATE-----")

    def answering(hook_id: str) -> kopfadapter.Answer:
        async def answer(review: Any) -> dict[str, Any]:
            return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": True, "warnings": [hook_id]}}
        return answer

    server.answers = {hook.id: answering(hook.id) for hook in hooks}

    async def run() -> list[dict[str, Any]]:
        settings = kopf.OperatorSettings()
        settings.admission.server = server
        insights = Insights(webhook_resources=set(RESOURCES))
        insights.ready_resources.set()
        container: Container[kopf.WebhookClientConfig] = Container()
        serving = asyncio.create_task(admission_webhook_server(settings=settings, registry=registry, insights=insights,
                                                               webhookfn=kopfs_own_answer, container=container))
        config = await asyncio.wait_for(container.wait(), 10)
        assert server.listening and config == {"url": f"http://127.0.0.1:{port}",
                                               "caBundle": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t"}
        webhooks = build_webhooks(registry._webhooks.get_all_handlers(), resources=RESOURCES,
                                  name_suffix="compilecache.io", client_config=config)
        async with aiohttp.ClientSession() as session:
            for webhook in webhooks:
                review = {"request": {"uid": webhook["name"]}}
                async with session.post(webhook["clientConfig"]["url"], json=review) as response:
                    webhook["answered"] = (await response.json())["response"]
            async with session.post(f"http://127.0.0.1:{port}/no-such-webhook", json={}) as response:
                assert response.status == 404
            async with session.post(f"http://127.0.0.1:{port}/{WEBHOOK_ID}", data=b"{not json") as response:
                assert response.status == 400
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        assert not server.listening
        return webhooks

    webhooks = {w["name"]: w for w in asyncio.run(run())}
    pods, caches = webhooks[f"{WEBHOOK_ID}.compilecache.io"], webhooks[f"{CACHE_WEBHOOK_ID}.compilecache.io"]
    assert pods["answered"]["warnings"] == [WEBHOOK_ID] and caches["answered"]["warnings"] == [CACHE_WEBHOOK_ID]
    assert pods["failurePolicy"] == "Ignore" and caches["failurePolicy"] == "Fail"
    assert pods["sideEffects"] == caches["sideEffects"] == "None"
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in pods["rules"]] == [([""], ["pods"], ["CREATE"])]
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in caches["rules"]] == [
        (["compilecache.io"], ["compilecaches"], ["CREATE", "UPDATE"])]
    assert pods["objectSelector"] == {"matchExpressions": [{"key": CACHE_LABEL, "operator": "Exists"}]}
    assert caches["objectSelector"] is None
