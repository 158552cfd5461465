"""``/healthz`` and ``/readyz``: liveness while the event loop answers, readiness once the webhook can inject.

Readiness matters for the webhook: a replica that answered admissions before it knew the caches
would let pods start cold (the webhook fails open). Kubernetes routes the webhook Service only to
Ready replicas, so a restarted or added replica takes traffic only once it can inject.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

Server = web.AppRunner


async def serve(address: str, port: int, ready: Callable[[], bool]) -> Server:
    """Start serving; the caller cleans the returned runner up."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({})

    async def readyz(_: web.Request) -> web.Response:
        if ready():
            return web.json_response({"ready": True})
        reason = "caches not known yet, webhook not listening yet, or shutting down"
        return web.json_response({"ready": False, "reason": reason}, status=503)

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    return runner
