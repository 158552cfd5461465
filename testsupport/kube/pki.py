"""A throwaway certificate authority for the local control plane: serving and client certificates."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from compilecache_operator.edge import certs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


class CertificateAuthority:
    """A self-signed CA that writes its certificate and the certificates it signs under ``directory``."""

    def __init__(self, directory: Path, common_name: str = "compilecache-test-ca") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = _name(common_name)
        self._cert = certs.ca_certificate(self._key, name, now - datetime.timedelta(minutes=5), now + VALIDITY,
                                          path_length=None)
        self.pair = KeyPair(
            cert=_write(directory / "ca.crt", self._cert.public_bytes(serialization.Encoding.PEM)),
            key=_write(directory / "ca.key", _key_pem(self._key), private=True),
        )

    @property
    def cert_path(self) -> Path:
        return self.pair.cert

    def issue(
        self,
        stem: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server_names: tuple[str, ...] = (),
        client: bool = True,
    ) -> KeyPair:
        """Sign a certificate; ``server_names`` (DNS names or IPs) make it a serving certificate too."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False
            )
        )
        if server_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(certs.alt_names(server_names)), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert=_write(self.directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            key=_write(self.directory / f"{stem}.key", _key_pem(key), private=True),
        )


def write_service_account_keys(directory: Path) -> KeyPair:
    """An RSA key pair for signing service-account tokens (``cert`` holds the public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(
        cert=_write(directory / "sa.pub", public),
        key=_write(directory / "sa.key", _key_pem(key), private=True),
    )
