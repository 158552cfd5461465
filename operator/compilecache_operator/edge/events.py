"""Kubernetes Events about the operator's objects, posted by the operator itself.

:func:`event_body` builds one ``v1`` Event (pure); an :class:`EventPoster` queues what the reconcile and
the handlers say (``emit`` never waits and never fails) and posts it in the background, one request per
event. An Event that cannot be posted is said in the log instead; a full queue drops the newest, said
in the log too. (Kopf's own ``kopf.event`` reaches only code that Kopf itself runs for an object; the
operator's reconciles run from its own watches.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from compilecache_operator.edge.kube import KubeAPI, KubeError

logger = logging.getLogger(__name__)
COMPONENT = "compilecache-operator"
MAX_MESSAGE = 1024
"""The longest message posted; a longer one keeps its start and end around ``...``."""
MAX_QUEUED = 1000


def shortened(message: str, limit: int = MAX_MESSAGE) -> str:
    if len(message) <= limit:
        return message
    half = (limit - 3) // 2
    return f"{message[:half]}...{message[len(message) - (limit - 3 - half):]}"


def event_body(obj: Mapping[str, Any], type_: str, reason: str, message: str, *, now: datetime,
               component: str = COMPONENT) -> dict[str, Any]:
    """The ``v1`` Event saying ``reason: message`` about ``obj`` (namespaced: the Event lives beside it)."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    now = now.astimezone(UTC)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": namespace, "generateName": f"{meta.get('name') or 'object'}."},
        "type": type_,
        "reason": reason,
        "message": shortened(message),
        "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "namespace": namespace,
                           "name": meta.get("name"), "uid": meta.get("uid")},
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "action": reason,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }


class EventPoster:
    """Posts the Events :meth:`emit` is given, in order, from :meth:`run`."""

    def __init__(self, api: KubeAPI, limit: int = MAX_QUEUED) -> None:
        self.api = api
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=limit)

    def emit(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event about ``obj`` (the operator's ``Emit``)."""
        try:
            self.queue.put_nowait(event_body(obj, type_, reason, message, now=datetime.now(UTC)))
        except asyncio.QueueFull:
            logger.warning("event %s not posted (too many waiting): %s", reason, shortened(message))

    async def run(self) -> None:
        while True:
            event = await self.queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                await self.api.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=event)
            except (KubeError, OSError, TimeoutError) as exc:
                logger.warning("event %s not posted (%s): %s", event["reason"], exc, event["message"])
