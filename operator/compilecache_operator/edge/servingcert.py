"""The webhook's serving certificate made at run time: a Secret the operator owns, rotated with overlap.

Nothing is generated when the chart renders (``helm template`` gives the same output every time).
The leader keeps a ``kubernetes.io/tls`` Secret of the operator's namespace (``tls.crt``, ``tls.key``
and ``ca.crt``, the CAs the API server is to trust) and writes ``ca.crt`` into the ``caBundle`` of the
webhook configurations named to it. Every replica, the leader included, serves what the Secret
holds and reloads it when it changes (:class:`compilecache_operator.edge.tlsreload.Reloader`).

Each certificate comes with a CA of its own (a new pair each time, the CA's key dropped), and a
rotation goes in three steps, each at least ``overlap`` after the previous one, so that no admission
meets a certificate the API server does not yet trust:

1. *trust*: a new CA and certificate are made; the new certificate waits in ``next.crt``/``next.key``
   while ``ca.crt`` (and every caBundle) holds the old CA and the new one;
2. *switch*: once every caBundle holds both, ``tls.crt``/``tls.key`` become the new pair; the replicas
   reload it;
3. *retire*: the old CA leaves ``ca.crt`` and the caBundles.

A rotation starts once less than ``renew_before`` of the certificate's life is left. A Secret that is
missing or unusable (unreadable, expired, for other host names) is replaced by a fresh pair at once.
:func:`step` decides, with no I/O; :func:`keep` runs it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from compilecache_operator.edge import certs
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.model.names import PREFIX

log = logging.getLogger(__name__)

SINCE_ANNOTATION = f"{PREFIX}/serving-cert-step-since"
"""When the Secret's current step began (RFC 3339): each step waits ``overlap`` after the previous one."""
NEXT_CERT, NEXT_KEY = "next.crt", "next.key"


@dataclass(frozen=True)
class Policy:
    validity: dt.timedelta = dt.timedelta(days=365)
    renew_before: dt.timedelta = dt.timedelta(days=30)
    overlap: dt.timedelta = dt.timedelta(minutes=5)
    """How long each step of a rotation waits for the previous one to reach every replica and the API server."""


@dataclass(frozen=True)
class Material:
    """What the Secret holds."""

    ca: bytes
    """The CAs to trust (PEM, one or two)."""
    cert: bytes
    key: bytes
    since: dt.datetime
    next_cert: bytes | None = None
    next_key: bytes | None = None

    @property
    def data(self) -> dict[str, bytes]:
        data = {"ca.crt": self.ca, "tls.crt": self.cert, "tls.key": self.key}
        if self.next_cert and self.next_key:
            data |= {NEXT_CERT: self.next_cert, NEXT_KEY: self.next_key}
        return data


def from_secret(secret: Mapping[str, Any] | None) -> Material | None:
    """The material of a Secret as the API returns it (None when it lacks a part)."""
    if not secret:
        return None
    try:
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        since = dt.datetime.fromisoformat(str(((secret.get("metadata") or {}).get("annotations") or {})
                                              .get(SINCE_ANNOTATION, "")))
    except ValueError:
        return None
    if not all(data.get(k) for k in ("ca.crt", "tls.crt", "tls.key")):
        return None
    return Material(ca=data["ca.crt"], cert=data["tls.crt"], key=data["tls.key"], since=since,
                    next_cert=data.get(NEXT_CERT), next_key=data.get(NEXT_KEY))


def to_secret(material: Material, name: str, namespace: str, labels: Mapping[str, str],
              base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Secret holding ``material`` (``base``'s metadata kept, resourceVersion included)."""
    meta = dict((base or {}).get("metadata") or {"name": name, "namespace": namespace})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), SINCE_ANNOTATION: material.since.isoformat()}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": meta,
        "data": {k: base64.b64encode(v).decode("ascii") for k, v in material.data.items()},
    }


def _certs(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def _pem(certificates: Sequence[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def usable(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, hostnames: Sequence[str], now: dt.datetime) -> bool:
    """The certificate parses, is valid now, covers every host name, matches its key and was signed by a CA of
    ``ca_pem``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        issuers = [c for c in _certs(ca_pem) if c.subject == cert.issuer]
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return False
    names = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    names |= {str(n) for n in sans.get_values_for_type(x509.IPAddress)}
    wanted = {h for h in hostnames if h and h not in ("0.0.0.0", "::")}
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    same_key = key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    return (bool(issuers) and same_key and wanted <= names
            and cert.not_valid_before_utc <= now < cert.not_valid_after_utc)


def fresh(hostnames: Sequence[str], policy: Policy, now: dt.datetime) -> Material:
    issued = certs.issue(hostnames, policy.validity, now)
    return Material(ca=issued.ca, cert=issued.cert, key=issued.key, since=now)


def step(current: Material | None, hostnames: Sequence[str], policy: Policy, now: dt.datetime,
         *, injected: bool) -> tuple[Material | None, str]:
    """The Secret's next content (None: leave it as it is) and what changed, in words.

    ``injected``: every caBundle holds the current ``ca.crt`` (a switch waits for it)."""
    if current is None or not usable(current.cert, current.key, current.ca, hostnames, now):
        return fresh(hostnames, policy, now), "created a new serving certificate and CA"
    waited = now - current.since >= policy.overlap
    if current.next_cert and current.next_key:
        if not usable(current.next_cert, current.next_key, current.ca, hostnames, now):
            return replace(current, next_cert=None, next_key=None, since=now), "dropped an unusable next certificate"
        if waited and injected:
            return (Material(ca=current.ca, cert=current.next_cert, key=current.next_key, since=now),
                    "switched to the new serving certificate")
        return None, ""
    cas = _certs(current.ca)
    issuer = x509.load_pem_x509_certificate(current.cert).issuer
    if len(cas) > 1 and waited:
        return replace(current, ca=_pem([c for c in cas if c.subject == issuer]), since=now), "retired the old CA"
    expires = certs.not_after(current.cert)
    if expires - now <= policy.renew_before and len(cas) == 1:
        new = fresh(hostnames, policy, now)
        return (Material(ca=current.ca + new.ca, cert=current.cert, key=current.key, since=now,
                         next_cert=new.cert, next_key=new.key),
                "made the next serving certificate; its CA is trusted beside the current one")
    return None, ""


# -- the webhook configurations' caBundle -------------------------------------------------------------
def bundle_ops(config: Mapping[str, Any], ca: bytes) -> list[dict[str, Any]]:
    """JSON-patch operations that set every webhook's ``clientConfig.caBundle`` of ``config`` to ``ca``
    (none when all hold it already); each checks the webhook's name first."""
    wanted = base64.b64encode(ca).decode("ascii")
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") == wanted:
            continue
        ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")},
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}]
    return ops


WEBHOOK_CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
"""The kinds of webhook configuration a name may stand for (the chart names both alike)."""


async def inject(api: KubeAPI, configs: Sequence[str], ca: bytes) -> bool:
    """Write ``ca`` into the caBundle of the Mutating- and ValidatingWebhookConfiguration of each name; True when
    every one of them holds it (a name with neither is said in the log and counts as not holding it)."""
    done = True
    for name in configs:
        found = False
        for kind in WEBHOOK_CONFIGURATIONS:
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}"
            config = await api.get(path)
            if config is None:
                continue
            found = True
            ops = bundle_ops(config, ca)
            if ops:
                await api.request("PATCH", path, body=ops, content_type="application/json-patch+json")
                log.info("wrote the webhook CA into the caBundle of %s %s", kind, name)
        if not found:
            log.warning("webhook configuration %s not found: its caBundle cannot be set", name)
            done = False
    return done


# -- the loop -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    namespace: str
    secret: str
    hostnames: tuple[str, ...]
    configs: tuple[str, ...]
    """Names of the Mutating- and ValidatingWebhookConfigurations whose caBundle the leader keeps."""
    labels: Mapping[str, str]


async def reconcile(api: KubeAPI, target: Target, policy: Policy, now: dt.datetime) -> Material | None:
    """One pass of the leader: move the Secret one step on, and keep the caBundles; the Secret's material."""
    path = f"/api/v1/namespaces/{target.namespace}/secrets"
    secret = await api.get(f"{path}/{target.secret}")
    current = from_secret(secret)
    injected = current is not None and await inject(api, target.configs, current.ca)
    new, what = step(current, target.hostnames, policy, now, injected=injected)
    if new is None:
        return current
    body = to_secret(new, target.secret, target.namespace, target.labels, secret)
    try:
        if secret is None:
            await api.request("POST", path, body=body)
        else:
            await api.request("PUT", f"{path}/{target.secret}", body=body)
    except KubeError as exc:
        if exc.status in (409, 422):  # changed or created meanwhile: look again next pass
            log.info("serving certificate Secret %s changed meanwhile; looking again", target.secret)
            return current
        raise
    log.info("serving certificate Secret %s/%s: %s", target.namespace, target.secret, what)
    await inject(api, target.configs, new.ca)
    return new


async def keep(
    api: KubeAPI,
    target: Target,
    policy: Policy,
    *,
    leading: Callable[[], bool],
    serve: Callable[[Material], None],
    interval: float = 10.0,
) -> None:
    """Forever: the leader moves the Secret on; every replica serves what it holds."""
    served: tuple[bytes, bytes] | None = None
    while True:
        try:
            now = dt.datetime.now(dt.UTC)
            if leading():
                material = await reconcile(api, target, policy, now)
            else:
                material = from_secret(await api.get(f"/api/v1/namespaces/{target.namespace}/secrets/{target.secret}"))
            if material is not None and (material.cert, material.key) != served:
                serve(material)
                served = (material.cert, material.key)
        except (KubeError, OSError, ValueError) as exc:
            log.warning("serving certificate: %s", exc)
        await asyncio.sleep(interval)
