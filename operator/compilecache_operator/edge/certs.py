"""TLS material of the webhook server: files from a directory, or a CA and certificate made here.

A mounted ``kubernetes.io/tls`` Secret (cert-manager's or the user's) gives ``tls.crt``,
``tls.key`` and, optionally, ``ca.crt``. Without a directory the operator makes a CA and a
server certificate for the webhook host names (:func:`issue`): with ``--webhook-config managed``,
where Kopf writes the CA into the webhook configuration, or kept and rotated in a Secret
(:mod:`compilecache_operator.edge.servingcert`). :func:`write_files` replaces each file at once.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path | None


class CertError(ValueError):
    """The certificate directory lacks a file the webhook server needs."""


def from_directory(directory: Path) -> CertFiles:
    cert, key, ca = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    for needed in (cert, key):
        if not needed.is_file():
            raise CertError(f"--webhook-cert-dir {directory}: {needed.name} is missing")
    return CertFiles(cert=cert, key=key, ca=ca if ca.is_file() else None)


def alt_names(names: Sequence[str]) -> list[x509.GeneralName]:
    """Subject alternative names: an IP address as such, anything else as a DNS name."""
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    return alt


def ca_certificate(
    key: ec.EllipticCurvePrivateKey, name: x509.Name, start: datetime.datetime, end: datetime.datetime,
    *, path_length: int | None = 0,
) -> x509.Certificate:
    """A self-signed CA certificate for ``key``, valid from ``start`` to ``end``: the one CA builder, of the
    operator's webhook CA and of the test clusters' (``testsupport/kube/pki.py``)."""
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


@dataclass(frozen=True)
class Issued:
    """A fresh CA and a serving certificate it signed, as PEM (the CA's key is not kept)."""

    ca: bytes
    cert: bytes
    key: bytes


def issue(hostnames: Sequence[str], validity: datetime.timedelta, now: datetime.datetime | None = None) -> Issued:
    """A new CA and a serving certificate for ``hostnames`` (DNS names or IPs), both valid for ``validity``.
    The CA signs only this one certificate; its private key is dropped."""
    names = [h for h in dict.fromkeys(hostnames) if h and h not in ("0.0.0.0", "::")]
    if not names:
        raise CertError("no host name to put into the webhook certificate")
    now = now or datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + validity
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, "compilecache-operator webhook CA"),
        x509.NameAttribute(NameOID.SERIAL_NUMBER, f"{x509.random_serial_number():x}"),
    ])
    ca_cert = ca_certificate(ca_key, ca_name, start, end, path_length=0)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names(names)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(
        ca=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def write_files(directory: Path, cert: bytes, key: bytes, ca: bytes | None) -> CertFiles:
    """Write ``tls.crt``, ``tls.key`` (mode 0600) and ``ca.crt`` into ``directory``, each replaced at once
    (a reader never sees half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(cert=directory / "tls.crt", key=directory / "tls.key", ca=directory / "ca.crt" if ca else None)
    for path, data in ((files.key, key), (files.cert, cert), (files.ca, ca)):
        if path is None or data is None:
            continue
        part = path.with_name(path.name + ".new")
        part.unlink(missing_ok=True)
        part.touch(mode=0o600)
        part.write_bytes(data)
        part.replace(path)
    return files


def self_signed(hostnames: Sequence[str], directory: Path, *, days: int = 365) -> CertFiles:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` for ``hostnames`` (DNS names or IPs) into ``directory``."""
    issued = issue(hostnames, datetime.timedelta(days=days))
    return write_files(directory, issued.cert, issued.key, issued.ca)


def not_after(cert_pem: bytes) -> datetime.datetime:
    """When the first certificate of ``cert_pem`` expires."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
