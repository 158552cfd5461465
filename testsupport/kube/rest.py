"""A minimal JSON client for the Kubernetes API: plain dicts in and out, watches as iterators.

The test infrastructure uses it instead of the generated ``kubernetes`` client so that it depends only on
the wire format of the API server it talks to, not on the client's model classes.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml

JSON = dict[str, Any]


class KubeAPIError(Exception):
    """An API call answered with a non-2xx status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.method, self.path, self.status, self.body = method, path, status, body
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        self.reason = parsed.get("reason", "") if isinstance(parsed, dict) else ""
        message = parsed.get("message", body[:500]) if isinstance(parsed, dict) else body[:500]
        super().__init__(f"{method} {path}: HTTP {status} {self.reason}: {message}")


def _materialise(entry: Mapping[str, Any], key: str, scratch: Path) -> str | None:
    """Return a file path for ``key`` (``key``-data is written to ``scratch``), or None when neither is set."""
    if entry.get(f"{key}-data"):
        path = scratch / key
        path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
        path.chmod(0o600)
        return str(path)
    value = entry.get(key)
    return str(value) if value else None


class KubeClient:
    """HTTPS client for one API server, configured from a kubeconfig file (its current context)."""

    def __init__(self, kubeconfig: Path | str, timeout: float = 30.0) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context_name = config["current-context"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        self._scratch = tempfile.TemporaryDirectory(prefix="kubeclient-")
        scratch = Path(self._scratch.name)
        self.server = cluster["server"].rstrip("/")
        ssl_context = ssl.create_default_context(cafile=_materialise(cluster, "certificate-authority", scratch))
        cert = _materialise(user, "client-certificate", scratch)
        key = _materialise(user, "client-key", scratch)
        if cert:
            ssl_context.load_cert_chain(cert, key)
        self._headers = {"Accept": "application/json"}
        if user.get("token"):
            self._headers["Authorization"] = f"Bearer {user['token']}"
        self._timeout = timeout
        self._pool = urllib3.PoolManager(ssl_context=ssl_context, maxsize=8, retries=False)
        self._watches: set[urllib3.BaseHTTPResponse] = set()

    def close(self) -> None:
        """Close the connections, ending any watch in progress (its iterator stops)."""
        for response in list(self._watches):
            self._watches.discard(response)
            response.shutdown()
        self._pool.clear()
        self._scratch.cleanup()

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        url: str = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        return url

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One API call; returns the decoded JSON body, raises KubeAPIError on a non-2xx status."""
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        response = self._pool.request(
            method, self._url(path, query), body=data, headers=headers, timeout=self._timeout
        )
        text = response.data.decode("utf-8", "replace")
        if not 200 <= response.status < 300:
            raise KubeAPIError(method, path, response.status, text)
        return json.loads(text) if text else {}

    def get(self, path: str, **query: Any) -> JSON:
        return self.request("GET", path, query=query)

    def get_if_present(self, path: str) -> JSON | None:
        """The object at ``path``, or None when there is none (a 404; any other error is raised)."""
        try:
            return self.get(path)
        except KubeAPIError as error:
            if error.status == 404:
                return None
            raise

    def exists(self, path: str) -> bool:
        """Whether ``path`` names an object (a 404 is False; any other error is raised)."""
        return self.get_if_present(path) is not None

    def post(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def delete_if_present(self, *paths: str) -> None:
        """Delete each object; one already gone (404) is fine, any other refusal raises."""
        for path in paths:
            try:
                self.delete(path)
            except KubeAPIError as error:
                if error.status != 404:
                    raise

    def watch(self, path: str, resource_version: str, timeout_seconds: int = 30) -> Iterator[JSON]:
        """Yield watch events ({"type", "object"}) until the server ends the watch; raises KubeAPIError."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
        }
        response = self._pool.request(
            "GET",
            self._url(path, query),
            headers=self._headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=self._timeout, read=timeout_seconds + 15),
        )
        self._watches.add(response)
        try:
            if response.status != 200:
                raise KubeAPIError("WATCH", path, response.status, response.read().decode("utf-8", "replace"))
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, OSError):
            if response not in self._watches:
                return
            raise
        finally:
            if response in self._watches:
                self._watches.discard(response)
                response.release_conn()
