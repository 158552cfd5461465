"""The operator's own serving certificate: rotation with overlap (simulated over generated timings), the
caBundle patch, the reload into the operator's real webhook server with a real TLS client, and the signing
key's Secret."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import socket
import ssl
from collections import deque
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
from compilecache_operator.edge import certs, servingcert, signingkey, tlsreload
from compilecache_operator.edge.kopfadapter import AdmissionServer
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.signing import Signer
from testsupport.servers import free_port

HOSTS = ("compilecache-webhook.ops.svc", "localhost", "127.0.0.1")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def issuer_of(cert_pem: bytes) -> x509.Name:
    return x509.load_pem_x509_certificate(cert_pem).issuer


def trusts(bundle: bytes, cert_pem: bytes) -> bool:
    return any(ca.subject == issuer_of(cert_pem) for ca in x509.load_pem_x509_certificates(bundle))


@settings(max_examples=15, deadline=None)
@given(
    tick_minutes=st.lists(st.integers(min_value=1, max_value=12 * 60), min_size=60, max_size=200),
    lag_ticks=st.integers(min_value=0, max_value=3),
)
def test_every_replica_serves_a_certificate_the_api_server_trusts_through_rotations(
    tick_minutes: list[int], lag_ticks: int
) -> None:
    """The leader steps the Secret on each tick and writes the caBundle; a replica serves the Secret as it was
    ``lag_ticks`` ticks ago (its sync interval), and the overlap is longer than that lag. At no tick does a
    replica present a certificate whose CA the API server does not hold, and certificates get renewed."""
    policy = servingcert.Policy(validity=dt.timedelta(days=6), renew_before=dt.timedelta(days=2),
                                overlap=dt.timedelta(hours=12, minutes=1) * max(lag_ticks, 1))
    now, secret, bundle = T0, None, b""
    history: deque[servingcert.Material] = deque(maxlen=lag_ticks + 1)
    served_serials = set()
    for minutes in tick_minutes:
        now += dt.timedelta(minutes=minutes)
        new, what = servingcert.step(secret, HOSTS, policy, now, injected=secret is not None and bundle == secret.ca)
        if new is not None:
            assert what
            secret = new
        assert secret is not None
        bundle = secret.ca  # the leader writes the caBundle right after the Secret
        history.append(secret)
        served = history[0]  # the slowest replica
        if servingcert.usable(served.cert, served.key, served.ca, HOSTS, now):
            assert trusts(bundle, served.cert), f"{now}: a replica serves a certificate the API server refuses"
        served_serials.add(x509.load_pem_x509_certificate(secret.cert).serial_number)
        assert len(x509.load_pem_x509_certificates(secret.ca)) <= 2
    if now - T0 > dt.timedelta(days=10) and lag_ticks == 0:
        assert len(served_serials) > 1, "the certificate was renewed"


def test_an_unusable_secret_is_replaced_and_a_usable_one_kept() -> None:
    policy = servingcert.Policy()
    first, what = servingcert.step(None, HOSTS, policy, T0, injected=False)
    assert first is not None and "created" in what
    assert servingcert.step(first, HOSTS, policy, T0 + dt.timedelta(days=1), injected=True) == (None, "")
    for broken in (servingcert.Material(first.ca, first.cert, b"not a key", T0),
                   servingcert.Material(first.ca, first.key, first.key, T0)):
        assert servingcert.step(broken, HOSTS, policy, T0, injected=True)[0] is not None
    other_names, _ = servingcert.step(first, ("elsewhere.svc",), policy, T0, injected=True)
    assert other_names is not None and other_names.cert != first.cert
    expired, _ = servingcert.step(first, HOSTS, policy, T0 + dt.timedelta(days=400), injected=True)
    assert expired is not None and expired.cert != first.cert


def test_a_switch_waits_for_the_ca_bundle() -> None:
    policy = servingcert.Policy(validity=dt.timedelta(days=10), renew_before=dt.timedelta(days=3),
                                overlap=dt.timedelta(minutes=5))
    first, _ = servingcert.step(None, HOSTS, policy, T0, injected=False)
    assert first is not None
    later = T0 + dt.timedelta(days=8)
    trusting, _ = servingcert.step(first, HOSTS, policy, later, injected=True)
    assert trusting is not None and trusting.next_cert and trusting.cert == first.cert
    assert len(x509.load_pem_x509_certificates(trusting.ca)) == 2
    after = later + dt.timedelta(hours=1)
    assert servingcert.step(trusting, HOSTS, policy, after, injected=False) == (None, "")
    switched, _ = servingcert.step(trusting, HOSTS, policy, after, injected=True)
    assert switched is not None and switched.cert == trusting.next_cert and switched.next_cert is None
    retired, what = servingcert.step(switched, HOSTS, policy, after + dt.timedelta(hours=1), injected=True)
    assert retired is not None and "retired" in what and not trusts(retired.ca, first.cert)
    assert trusts(retired.ca, retired.cert)


def test_the_secret_round_trips() -> None:
    material, _ = servingcert.step(None, HOSTS, servingcert.Policy(), T0, injected=False)
    assert material is not None
    secret = servingcert.to_secret(material, "tls", "ops", {"a": "b"})
    assert secret["type"] == "kubernetes.io/tls"
    assert servingcert.from_secret(secret) == material
    assert servingcert.from_secret({"data": {"tls.crt": "eA=="}}) is None


def test_the_ca_bundle_patch_sets_every_webhook_and_nothing_when_set() -> None:
    config: dict[str, Any] = {"webhooks": [
        {"name": "a.example", "clientConfig": {"service": {"name": "s"}}},
        {"name": "b.example", "clientConfig": {"caBundle": "b2xk"}},
    ]}
    ops = servingcert.bundle_ops(config, b"PEM")
    patched = jsonpatch.apply_patch(config, ops)
    assert [h["clientConfig"]["caBundle"] for h in patched["webhooks"]] == [base64.b64encode(b"PEM").decode()] * 2
    assert servingcert.bundle_ops(patched, b"PEM") == []
    reordered = {"webhooks": list(reversed(config["webhooks"]))}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(reordered, ops)


# -- the reload, against Kopf's real server and a real TLS client ---------------------------------------------
def served_certificate(port: int, ca: bytes) -> x509.Certificate:
    """Handshake with the webhook port trusting only ``ca``; the certificate the server presented."""
    context = ssl.create_default_context(cadata=ca.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


async def answer(request: Any, **_: Any) -> Any:
    return {"response": {"allowed": True}}


def test_a_renewed_certificate_is_served_without_restarting_the_server(tmp_path: Path) -> None:
    """The server keeps the context it was given and its listener: the renewal reaches the next handshake while the
    server yields its client config once (a restart would yield again) and a connection opened before goes on."""
    first = certs.issue(HOSTS, dt.timedelta(days=1))
    files = certs.write_files(tmp_path, first.cert, first.key, first.ca)
    expiries: list[bytes] = []
    reloader = tlsreload.Reloader(files, expiries.append)
    port = free_port()
    server = AdmissionServer(addr="127.0.0.1", port=port, host=None, context=reloader.context, cadata=first.ca)

    async def run() -> certs.Issued:
        configs: asyncio.Queue[Any] = asyncio.Queue()

        async def serve() -> None:
            async for config in server(answer):
                configs.put_nowait(config)

        serving = asyncio.create_task(serve())
        await configs.get()
        loop = asyncio.get_running_loop()
        before = await loop.run_in_executor(None, served_certificate, port, first.ca)
        assert before.serial_number == x509.load_pem_x509_certificate(first.cert).serial_number
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       ssl=ssl.create_default_context(cadata=first.ca.decode()),
                                                       server_hostname="localhost")
        second = certs.issue(HOSTS, dt.timedelta(days=2))
        certs.write_files(tmp_path, second.cert, second.key, second.ca)
        assert reloader.check()
        after = await loop.run_in_executor(None, served_certificate, port, second.ca)
        assert after.serial_number == x509.load_pem_x509_certificate(second.cert).serial_number
        writer.write(b"POST /x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        status = await reader.readline()
        assert status.startswith(b"HTTP/1.1"), "the connection opened before the reload is still served"
        writer.close()
        (tmp_path / "tls.key").write_bytes(first.key)  # a key that does not match: refused, the served one stays
        assert not reloader.check()
        again = await loop.run_in_executor(None, served_certificate, port, second.ca)
        assert again.serial_number == after.serial_number
        assert configs.empty(), "the server restarted on the file change"
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return second

    second = asyncio.run(run())
    assert expiries == [first.cert, second.cert]


# -- the signing key's Secret ----------------------------------------------------------------------------------
def test_a_rotation_keeps_the_previous_key_trusted_and_happens_once() -> None:
    secret = signingkey.new_secret("sign", "ops", {})
    first = signingkey.signing_of(secret, "sign", ())
    assert signingkey.rotation_request(secret) is None
    secret["metadata"]["annotations"] = {signingkey.ROTATE_ANNOTATION: "2026-11-25"}
    assert signingkey.rotation_request(secret) == "2026-11-25"
    once = signingkey.rotated(secret, "2026-11-25")
    assert signingkey.rotation_request(once) is None
    second = signingkey.signing_of(once, "sign", ())
    assert second.signer.public_key != first.signer.public_key
    assert second.trusted == (second.signer.public_key, first.signer.public_key)
    once["metadata"]["annotations"][signingkey.ROTATE_ANNOTATION] = "again"
    third = signingkey.signing_of(signingkey.rotated(once, "again"), "sign", ())
    assert third.trusted == (third.signer.public_key, second.signer.public_key, first.signer.public_key)
    extra = Signer.generate().public_key.text()
    assert signingkey.signing_of(once, "sign", (extra,)).trusted[-1].text() == extra
