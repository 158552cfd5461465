"""Kopf's side of the admission webhooks: the server Kopf starts, the handlers its managed configurations list.

Written against Kopf :data:`KOPF_VERSION` (the operator image's pin, ``images/operator/requirements.lock``);
``tests/operator/test_kopf_adapter.py`` fails when Kopf changes what this module relies on:

- the server protocol (``settings.admission.server``): a callable taking Kopf's own answer function and
  yielding :class:`kopf.WebhookClientConfig` mappings, the first once the endpoint listens;
- managed mode (``settings.admission.managed``): Kopf writes one webhook per registered handler into the
  Mutating/ValidatingWebhookConfiguration, its URL the server's with ``/<handler id>`` appended, so
  :class:`AdmissionServer` routes a request by the last segment of its path;
- whether a handler id is already registered, read from the registry's private ``_webhooks``
  (:func:`registered_ids`): the only private name used.

Every request is answered directly by the operator's own answer for that webhook (a review in, a review
out): Kopf's generic path (a deep copy of the object, handlers run by its machinery, a diff) is never
taken, so the handler functions registered with Kopf exist only to describe the webhook and refuse to
run (:func:`_answered_by_the_server`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import kopf
from aiohttp import web

log = logging.getLogger(__name__)

KOPF_VERSION = "1.45.2"
"""The Kopf release this module is written against (the operator image's pin)."""

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
Review = Mapping[str, Any]
Answer = Callable[[Review], Awaitable[dict[str, Any]]]
"""The operator's answer to one AdmissionReview of a webhook: the whole AdmissionReview it responds with."""


@dataclass(frozen=True)
class Hook:
    """One admission webhook as Kopf's managed configuration describes it."""

    id: str
    """The handler id: the last segment of the webhook's URL path."""
    kind: Literal["mutating", "validating"]
    resource: tuple[str, ...]
    """The resource as Kopf's decorators take it: (group, version, plural), or (version, plural) for the core group."""
    operations: tuple[Operation, ...]
    fail_open: bool
    """``failurePolicy: Ignore`` (True) or ``Fail``."""
    labels: Mapping[str, Any] = field(default_factory=dict)
    """Object labels the webhook selects (``kopf.PRESENT`` for any value)."""


async def _answered_by_the_server(**_: Any) -> None:
    raise kopf.PermanentError("this webhook is answered by the operator's admission server, not by Kopf's handlers")


def registered_ids(registry: kopf.OperatorRegistry) -> set[str]:
    """The ids of the admission handlers registered in ``registry``."""
    return {str(handler.id) for handler in registry._webhooks.get_all_handlers()}


def register(hooks: Sequence[Hook], registry: kopf.OperatorRegistry | None = None) -> None:
    """Register each of ``hooks`` with Kopf (once per id), so that a managed configuration lists it."""
    registry = registry or kopf.get_default_registry()
    known = registered_ids(registry)
    for hook in hooks:
        if hook.id in known:
            continue
        decorator = kopf.on.mutate if hook.kind == "mutating" else kopf.on.validate
        decorator(
            *hook.resource,
            id=hook.id,
            operations=list(hook.operations),
            labels=dict(hook.labels) or None,
            ignore_failures=hook.fail_open,
            side_effects=False,
            registry=registry,
        )(_answered_by_the_server)


def client_url(host: str, port: int) -> str:
    """The server's URL as the API server reaches it (a webhook's URL is this plus ``/<id>``)."""
    shown = f"[{host}]" if ":" in host else host
    return f"https://{shown}:{port}"


class AdmissionServer:
    """The HTTPS endpoint of the operator's webhooks, started by Kopf (``settings.admission.server``).

    A POST to ``/<id>`` is answered by ``answers[id]``; an unknown id is 404, a body that is not JSON 400.
    The TLS context is used for the server's whole life (:mod:`compilecache_operator.edge.tlsreload` loads a
    renewal into it). :attr:`listening` says whether the endpoint accepts connections (the replica's
    readiness waits for it: a Service must not route admissions to a port that refuses them); while
    :attr:`draining` says so, every answer closes its connection (``Connection: close``), so that the API
    server's kept-alive connections move to the ready replicas before this one exits.
    """

    def __init__(self, *, addr: str, port: int, host: str | None, context: ssl.SSLContext | None,
                 cadata: bytes | None = None) -> None:
        self.addr = addr
        self.port = port
        self.host = host or addr
        self.context = context
        """None: plain HTTP (tests only; the API server calls webhooks over HTTPS)."""
        self.cadata = cadata
        """The CA of the served certificate, for the managed configuration's caBundle."""
        self.answers: dict[str, Answer] = {}
        """Set at start-up: each webhook's answer, by id."""
        self.draining: Callable[[], bool] | None = None
        """Set at start-up: whether this replica is shutting down."""
        self.listening = False

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        """Serve until cancelled; yield the client config once listening. ``fn`` (Kopf's own answer) is not used."""
        runner = web.AppRunner(self.app(), handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.addr or None, self.port, ssl_context=self.context,
                               reuse_port=True, reuse_address=True)
            await site.start()
            self.listening = True
            log.debug("admission webhooks listening on %s:%d", self.addr, self.port)
            url = client_url(self.host, self.port)
            config = kopf.WebhookClientConfig(url=url if self.context is not None else "http" + url[5:])
            if self.cadata is not None:
                config["caBundle"] = base64.b64encode(self.cadata).decode("ascii")
            yield config
            await asyncio.Event().wait()
        finally:
            self.listening = False
            await runner.cleanup()

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([web.post("/{id}", self.serve)])
        return app

    async def serve(self, request: web.Request) -> web.Response:
        answer = self.answers.get(request.match_info["id"])
        if answer is None:
            raise web.HTTPNotFound(reason=f"no webhook {request.match_info['id']!r} here")
        try:
            review = json.loads(await request.text())
        except json.JSONDecodeError as exc:
            raise web.HTTPBadRequest(reason=f"the AdmissionReview is not JSON: {exc}") from exc
        if not isinstance(review, dict):
            raise web.HTTPBadRequest(reason="the AdmissionReview is not a JSON object")
        response = web.json_response(await answer(review))
        if self.draining is not None and self.draining():
            response.force_close()
        return response
