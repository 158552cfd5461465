"""The operator's API client: retries what may pass, logs in again on 401, pages through lists, and
runs kubeconfig ``exec`` credential plugins.

The server is a real HTTP server on loopback that answers as the API server does when it is
overloaded (429 with Retry-After), failing over (503), or sees an expired token (401): behaviour
the local kube-apiserver cannot be made to show on demand.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from aiohttp import web
from compilecache_operator.edge import kubeconfig
from compilecache_operator.edge.kube import KubeAPI, KubeError, backoff, retry_after
from compilecache_operator.lifecycle import login
from hypothesis import given
from hypothesis import strategies as st

Handler = Callable[[web.Request], web.Response]


@asynccontextmanager
async def api_server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    async def serve(request: web.Request) -> web.Response:
        return handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def status(code: int, **headers: str) -> web.Response:
    return web.json_response({"kind": "Status", "reason": "Nope", "message": f"status {code}"}, status=code,
                             headers=headers)


def test_overload_and_failover_answers_are_retried() -> None:
    answers = [status(429, **{"Retry-After": "0"}), status(503), web.json_response({"ok": 1})]
    seen: list[str] = []

    def handler(request: web.Request) -> web.Response:
        seen.append(request.path)
        return answers.pop(0)

    async def run() -> dict[str, Any]:
        async with api_server(handler) as url:
            api = KubeAPI(kopf.ConnectionInfo(server=url))
            try:
                return await api.request("GET", "/api/v1/x")
            finally:
                await api.close()

    assert asyncio.run(run()) == {"ok": 1} and len(seen) == 3


def test_a_client_error_is_not_retried_and_the_last_failure_is_raised() -> None:
    calls: list[int] = []

    def handler(request: web.Request) -> web.Response:
        calls.append(1)
        return status(422 if request.path.endswith("bad") else 500)

    async def run() -> tuple[KubeError, KubeError]:
        async with api_server(handler) as url:
            api = KubeAPI(kopf.ConnectionInfo(server=url), attempts=2)
            try:
                with pytest.raises(KubeError) as bad:
                    await api.request("POST", "/bad", body={})
                with pytest.raises(KubeError) as down:
                    await api.request("GET", "/down")
                return bad.value, down.value
            finally:
                await api.close()

    bad, down = asyncio.run(run())
    assert bad.status == 422 and down.status == 500 and len(calls) == 3
    assert str(down).startswith("GET /down: HTTP 500 Nope: status 500")


def test_a_401_logs_in_again_once() -> None:
    def handler(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer fresh":
            return status(401)
        return web.json_response({"ok": 1})

    async def run() -> tuple[dict[str, Any], int]:
        async with api_server(handler) as url:
            logins: list[int] = []

            def relogin() -> kopf.ConnectionInfo:
                logins.append(1)
                return kopf.ConnectionInfo(server=url, token="fresh")

            api = KubeAPI(kopf.ConnectionInfo(server=url, token="stale"), relogin=relogin)
            try:
                return await api.request("GET", "/api/v1/x"), len(logins)
            finally:
                await api.close()

    assert asyncio.run(run()) == ({"ok": 1}, 1)


def test_a_dropped_connection_is_retried_then_named() -> None:
    async def run() -> KubeError:
        from testsupport.servers import free_port

        api = KubeAPI(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"), attempts=2)
        try:
            with pytest.raises(KubeError) as refused:
                await api.request("GET", "/api/v1/x")
            return refused.value
        finally:
            await api.close()

    error = asyncio.run(run())
    assert error.status == 0 and "GET /api/v1/x" in str(error)


def test_lists_are_read_page_by_page() -> None:
    pages = {None: (["a", "b"], "t1"), "t1": (["c"], "t2"), "t2": (["d"], None)}

    def handler(request: web.Request) -> web.Response:
        assert request.query["limit"] == "2" and request.query["labelSelector"] == "x"
        items, token = pages[request.query.get("continue")]
        return web.json_response({"items": [{"name": i} for i in items], "metadata": {"continue": token or ""}})

    async def run() -> list[dict[str, Any]]:
        async with api_server(handler) as url:
            api = KubeAPI(kopf.ConnectionInfo(server=url))
            try:
                return await api.list_all("/api/v1/pods", {"labelSelector": "x"}, page=2)
            finally:
                await api.close()

    assert [i["name"] for i in asyncio.run(run())] == ["a", "b", "c", "d"]


def test_retry_after_and_backoff() -> None:
    assert retry_after("3") == 3.0 and retry_after(None, {"retryAfterSeconds": 2}) == 2.0
    assert retry_after("soon") is None and retry_after(None) is None
    assert [backoff(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8] and backoff(20) == 10.0


# -- exec credential plugins --------------------------------------------------------------------------------
PLUGIN = """
import json, os, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
assert info["kind"] == "ExecCredential" and os.environ["CLUSTER"] == "c1", info
print(json.dumps({"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {"token": "tok-" + sys.argv[1], "expirationTimestamp": "2030-01-01T00:00:00Z"}}))
"""


def write_kubeconfig(tmp_path: Path, exec_spec: dict[str, Any]) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c1", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "c", "context": {"cluster": "c1", "user": "u"}}],
        "users": [{"name": "u", "user": {"exec": exec_spec}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_exec_plugin_gives_the_token_and_its_expiry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(plugin), "x"],
            "env": [{"name": "CLUSTER", "value": "c1"}]}
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, spec)))
    info = login(settings=kopf.OperatorSettings())
    assert info is not None and info.token == "tok-x" and info.server == "https://127.0.0.1:6443"
    assert info.expiration is not None and info.expiration.year == 2030


def test_a_failing_exec_plugin_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"command": sys.executable, "args": ["-c", "import sys; sys.exit('no cloud credentials')"]}
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, spec)))
    with pytest.raises(kopf.LoginError, match="exited with 1: no cloud credentials"):
        login(settings=kopf.OperatorSettings())
    with pytest.raises(kubeconfig.ExecCredentialError, match="no ExecCredential status"):
        kubeconfig.run_exec_plugin({"command": sys.executable, "args": ["-c", "print(1)"]})


@given(host=st.one_of(st.ip_addresses().map(str), st.from_regex(r"[a-z][a-z0-9.-]{0,30}", fullmatch=True)),
       port=st.integers(1, 65535))
def test_in_a_pod_the_api_server_is_where_the_kubelet_says_as_client_go_takes_it(host: str, port: int) -> None:
    server = kubeconfig.in_cluster_server({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port)})
    assert server is not None
    parsed = urllib.parse.urlsplit(server)
    assert (parsed.scheme, parsed.hostname, parsed.port) == ("https", host.lower(), port), server
    assert kubeconfig.in_cluster_server({"KUBERNETES_SERVICE_HOST": host}) is None
    assert kubeconfig.in_cluster_server({}) is None


# -- client certificates from a kubeconfig's data ------------------------------------------------------
def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(where: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made by the openssl command."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=test-ca", cwd=where)  # fmt: skip
    (where / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ("-extfile", "san.cnf")), ("client", ())):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}/O=system:masters", cwd=where)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.crt", "-days", "1", *extra, cwd=where)  # fmt: skip


def client_certificates_only(pki: Path) -> ssl.SSLContext:
    """The server side of TLS as kube-apiserver's: only clients with a certificate of its CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def who_is_it(request: web.Request) -> web.Response:
    """The common name of the client's certificate."""
    peer = request.transport.get_extra_info("peercert") if request.transport else None
    subject = dict(pair[0] for pair in (peer or {}).get("subject", ()))
    return web.json_response({"user": subject.get("commonName")})


@pytest.mark.parametrize("encoding", ["base64", "pem"])
def test_a_client_certificate_from_kubeconfig_data_leaves_no_key_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    """The kubeconfig's ``client-certificate-data`` and ``client-key-data`` authenticate against a server that
    requires a client certificate, and no copy of them is left in the temporary directory, neither while the
    client lives (a killed operator removes nothing) nor after; a client without them is refused."""
    pki = tmp_path / "pki"
    pki.mkdir()
    make_pki(pki)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def data(name: str) -> str:
        raw = (pki / name).read_bytes()
        return base64.b64encode(raw).decode() if encoding == "base64" else raw.decode()

    async def run() -> tuple[dict[str, Any], list[str], str]:
        async with api_server(who_is_it, client_certificates_only(pki)) as url:
            api = KubeAPI(kopf.ConnectionInfo(server=url, ca_data=data("ca.crt"), certificate_data=data("client.crt"),
                                              private_key_data=data("client.key")), attempts=1)  # fmt: skip
            try:
                answer = await api.request("GET", "/api/v1/namespaces")
                during = sorted(p.name for p in scratch.rglob("*"))
            finally:
                await api.close()
            anonymous = KubeAPI(kopf.ConnectionInfo(server=url, ca_data=data("ca.crt")), attempts=1)
            try:
                await anonymous.request("GET", "/api/v1/namespaces")
                refused = "answered"
            except (KubeError, aiohttp.ClientError, OSError) as exc:
                refused = type(exc).__name__
            finally:
                await anonymous.close()
            return answer, during, refused

    answer, during, refused = asyncio.run(run())
    assert answer == {"user": "client"}
    assert during == [] and list(scratch.iterdir()) == [], "a copy of the client's key stayed on disk"
    assert refused != "answered"
