"""A small asynchronous Kubernetes API client: plain dicts in and out.

It authenticates exactly as Kopf's watches do (the same login handler: the pod's service
account, else the kubeconfig, with ``exec`` credential plugins), so the operator needs nothing
beyond Kopf and aiohttp. Like the official clients it retries what may pass (429 and 5xx answers,
honouring ``Retry-After``; dropped or refused connections) with exponential back-off, logs in
again on 401 (a rotated or expired token), and pages through lists (``limit``/``continue``).
Every call names the method and path in its error.

Most of what the operator reads comes from its watches (``list_versioned`` and ``watch``, run by
:mod:`compilecache_operator.edge.informer`); the other calls are the few direct ones: Secrets, the pods of
unfinished warm-up Jobs, status patches, Job create/annotate/delete.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from compilecache_operator.model.names import GROUP, PLURAL, VERSION

JSON = dict[str, Any]
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
USER_AGENT = "compilecache-operator"
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
PAGE_SIZE = 500
logger = logging.getLogger(__name__)


class KubeError(Exception):
    """An API call answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        self.method, self.path, self.status = method, path, status
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = {}
        detail = parsed.get("message", text[:300]) if isinstance(parsed, dict) else text[:300]
        self.reason = str(parsed.get("reason", "")) if isinstance(parsed, dict) else ""
        self.detail = str(detail)
        self.causes = _causes(parsed)
        """The fields the API server names in a refusal (``details.causes``): (field, message) pairs."""
        self.retry_after: float | None = None
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {detail}")


def _causes(status: Any) -> tuple[tuple[str, str], ...]:
    details = status.get("details") if isinstance(status, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return tuple(
        (str(c.get("field", "")), str(c.get("message", "")))
        for c in (causes if isinstance(causes, list) else []) if isinstance(c, dict)
    )


def retry_after(header: str | None, details: Any = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds) or a Status' ``retryAfterSeconds``."""
    for value in (header, details.get("retryAfterSeconds") if isinstance(details, dict) else None):
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):
            continue
    return None


def backoff(attempt: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Exponential back-off before retry ``attempt`` (1, 2, ...)."""
    return float(min(cap, base * 2 ** (attempt - 1)))


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _data(value: str | bytes) -> bytes:
    """Kubeconfig ``*-data`` fields are base64 of PEM; accept PEM as is, too."""
    raw = value.encode() if isinstance(value, str) else value
    return raw if raw.lstrip().startswith(b"-----") else base64.b64decode(raw)


def _private_file(path: Path, data: bytes) -> str:
    """``data`` into a new file only its owner can read; its path."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


class KubeAPI:
    """One API server with one identity; reuse a single instance per operator."""

    def __init__(
        self,
        info: Any,
        *,
        timeout: float = 30.0,
        attempts: int = 5,
        relogin: Callable[[], Any] | None = None,
    ) -> None:
        """``info`` is a :class:`kopf.ConnectionInfo` (from the same login handler Kopf uses);
        ``relogin`` gives a fresh one after a 401 or once ``info.expiration`` has passed. A
        request is tried up to ``attempts`` times; ``timeout`` bounds connecting and each read,
        not the wait for a free connection."""
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self._attempts = max(1, attempts)
        self._relogin = relogin
        self._session: aiohttp.ClientSession | None = None
        self._use(info)

    def _use(self, info: Any) -> None:
        self.server = str(info.server).rstrip("/")
        self._ssl = self._ssl_context(info)
        self._token: str | None = info.token
        self._token_file = SERVICE_ACCOUNT_TOKEN if info.token and os.path.exists(SERVICE_ACCOUNT_TOKEN) else None
        self._basic = (info.username, info.password) if info.username and info.password else None
        expiration = getattr(info, "expiration", None)
        if isinstance(expiration, datetime) and expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=UTC)
        self._expiration: datetime | None = expiration

    def _login_again(self) -> bool:
        """Log in afresh; False when there is no way to."""
        if self._relogin is None:
            return False
        info = self._relogin()
        if info is None:
            return False
        self._use(info)
        return True

    def _ssl_context(self, info: Any) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if info.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif info.ca_data:
            context = ssl.create_default_context(cadata=_data(info.ca_data).decode())
        else:
            context = ssl.create_default_context(cafile=os.fspath(info.ca_path) if info.ca_path else None)
        # ssl reads a client certificate only from files: the kubeconfig's data is written into a private
        # directory for the load and removed with it, so no copy of the key outlives the login (nor a killed
        # process).
        with tempfile.TemporaryDirectory(prefix="compilecache-kube-") as scratch:
            cert, key = info.certificate_path, info.private_key_path
            if info.certificate_data:
                cert = _private_file(Path(scratch) / "client.crt", _data(info.certificate_data))
            if info.private_key_data:
                key = _private_file(Path(scratch) / "client.key", _data(info.private_key_data))
            if cert:
                context.load_cert_chain(os.fspath(cert), os.fspath(key) if key else None)
        return context

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._token
        if self._token_file:  # projected tokens rotate: read the current one
            token = Path(self._token_file).read_text().strip() or token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif self._basic:
            raw = f"{self._basic[0]}:{self._basic[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        return headers

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> JSON:
        """One API call, retried while the answer or the connection says it may pass."""
        if self._expiration is not None and datetime.now(UTC) >= self._expiration:
            self._login_again()
        logged_in_again = False
        for attempt in range(1, self._attempts + 1):
            last = attempt == self._attempts
            try:
                return await self._send(method, path, query, body, content_type)
            except KubeError as exc:
                if exc.status == 401 and not logged_in_again and self._login_again():
                    logged_in_again = True
                    continue
                if exc.status not in RETRIED_STATUSES or last:
                    raise
                delay = exc.retry_after if exc.retry_after is not None else backoff(attempt)
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                if last:
                    raise KubeError(method, path, 0, f"{type(exc).__name__}: {exc}") from exc
                delay = backoff(attempt)
            logger.debug("%s %s: retry %d in %.1fs", method, path, attempt, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _send(
        self, method: str, path: str, query: Mapping[str, Any] | None, body: Any, content_type: str | None
    ) -> JSON:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = self.server + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body) if body is not None else None
        if data is not None and content_type is None:
            content_type = "application/json"
        async with self._session.request(
            method, url, data=data, headers=self._headers(content_type), ssl=self._ssl
        ) as response:
            text = await response.text()
            if response.status >= 300:
                error = KubeError(method, path, response.status, text)
                details = _json_or_none(text)
                error.retry_after = retry_after(response.headers.get("Retry-After"),
                                                (details or {}).get("details") if isinstance(details, dict) else None)
                raise error
            return json.loads(text) if text else {}

    async def list_all(self, path: str, query: Mapping[str, Any] | None = None, *, page: int = PAGE_SIZE) -> list[JSON]:
        """Every item of a list, page by page (``limit``/``continue``)."""
        return (await self.list_versioned(path, query, page=page))[0]

    async def list_versioned(
        self, path: str, query: Mapping[str, Any] | None = None, *, page: int = PAGE_SIZE
    ) -> tuple[list[JSON], str]:
        """Every item of a list, page by page, and the list's resourceVersion (where a watch of it starts)."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            found = await self.request("GET", path, query={**(query or {}), "limit": page, "continue": token})
            items += found.get("items") or []
            meta = found.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return items, str(meta.get("resourceVersion") or "")

    async def watch(self, path: str, query: Mapping[str, Any], *, read_timeout: float) -> AsyncIterator[JSON]:
        """The events of one watch request (``watch=1``), as the server sends them, until it ends the watch.
        ``read_timeout`` bounds the wait for the next bytes (bookmarks keep a quiet watch talking); a 401 logs
        in again and raises, so that the caller starts the watch again."""
        if self._expiration is not None and datetime.now(UTC) >= self._expiration:
            self._login_again()
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        url = self.server + path + "?" + urlencode({"watch": "1", **{k: v for k, v in query.items() if v is not None}})
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.sock_connect, sock_read=read_timeout)
        async with self._session.get(url, headers=self._headers(None), ssl=self._ssl, timeout=timeout) as response:
            if response.status >= 300:
                error = KubeError("WATCH", path, response.status, await response.text())
                if response.status == 401:
                    self._login_again()
                raise error
            pending = bytearray()
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    async def get(self, path: str, query: Mapping[str, Any] | None = None) -> JSON | None:
        try:
            return await self.request("GET", path, query=query)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def server_version(self) -> JSON:
        """The API server's ``/version`` (``major``, ``minor``, ``gitVersion``, ...)."""
        return await self.request("GET", "/version")

    # -- CompileCaches -----------------------------------------------------------------------------
    @staticmethod
    def cache_path(namespace: str, name: str = "") -> str:
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}"
        return f"{base}/{quote(name)}" if name else base

    async def get_cache(self, namespace: str, name: str) -> JSON | None:
        """The CompileCache, or None when it is gone."""
        return await self.get(self.cache_path(namespace, name))

    async def patch_cache_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> JSON:
        """Merge-patch the status subresource; lists in ``status`` replace the stored ones whole."""
        return await self.request(
            "PATCH", self.cache_path(namespace, name) + "/status", body={"status": status}, content_type=MERGE_PATCH
        )

    async def set_finalizers(
        self, namespace: str, name: str, current: Sequence[str], new: Sequence[str]
    ) -> JSON:
        """Replace the finalizers, provided they are still ``current`` (else HTTP 422: look again)."""
        ops = [{"op": "test", "path": "/metadata/finalizers", "value": list(current)}] if current else []
        ops.append({"op": "add", "path": "/metadata/finalizers", "value": list(new)})
        return await self.request("PATCH", self.cache_path(namespace, name), body=ops, content_type=JSON_PATCH)

    # -- Leases (leader election) -----------------------------------------------------------------
    @staticmethod
    def lease_path(namespace: str, name: str = "") -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return f"{base}/{quote(name)}" if name else base

    async def get_lease(self, namespace: str, name: str) -> JSON | None:
        return await self.get(self.lease_path(namespace, name))

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> JSON:
        return await self.request("POST", self.lease_path(namespace), body=lease)

    async def replace_lease(self, namespace: str, name: str, lease: Mapping[str, Any]) -> JSON:
        """PUT with the Lease's resourceVersion: HTTP 409 when someone changed it meanwhile."""
        return await self.request("PUT", self.lease_path(namespace, name), body=lease)

    # -- Secrets ---------------------------------------------------------------------------------------
    async def read_secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        secret = await self.get(f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}")
        if secret is None:
            return None
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    # -- Jobs ---------------------------------------------------------------------------------------
    @staticmethod
    def jobs_path(namespace: str, name: str = "") -> str:
        base = f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs"
        return f"{base}/{quote(name)}" if name else base

    async def create_job(self, namespace: str, job: Mapping[str, Any]) -> bool:
        """Create the Job unless one of that name exists; True when this call created it."""
        try:
            await self.request("POST", self.jobs_path(namespace), body=job)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def delete_job(self, namespace: str, name: str) -> bool:
        try:
            await self.request("DELETE", self.jobs_path(namespace, name), query={"propagationPolicy": "Background"})
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def annotate_job(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        await self.request(
            "PATCH", self.jobs_path(namespace, name),
            body={"metadata": {"annotations": dict(annotations)}}, content_type=MERGE_PATCH,
        )

    # -- Pods ---------------------------------------------------------------------------------------
    async def list_pods(self, namespace: str, selector: str) -> list[JSON]:
        return await self.list_all(f"/api/v1/namespaces/{quote(namespace)}/pods", query={"labelSelector": selector})

    async def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> bool:
        """Add annotations; False when the pod is gone."""
        try:
            await self.request(
                "PATCH", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}",
                body={"metadata": {"annotations": dict(annotations)}}, content_type=MERGE_PATCH,
            )
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True
