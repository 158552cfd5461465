"""Bundle signatures: Ed25519 over a bundle's key and digest, kept in the store beside the bundle.

A bundle's sha256 proves nothing about who wrote it: anyone who can write to the store can
recompute it. A signature can only be made with the private key, which the operator holds and
which never reaches a warm-up pod. What is signed is the message
``compilecache-bundle-signature/v1 NUL <key> NUL <bundle digest>``, where the bundle digest is the
sha256 of the bundle's preamble and header (:func:`cachelib.bundlereader.read_header_and_digest`): the
header carries every part's sha256, and a reader checks each part against it before it installs
anything, so the digest stands for every byte of the bundle. The key is signed too, so a signed
bundle cannot be replayed under another cache's or another variant's key.

The signature is a small JSON object in the same store, under the cache's prefix in ``signatures/``
(:func:`signature_key`: not a cache key, so listings of bundles pass over it). A reader holds a set
of trusted public keys (several during a key rotation) and accepts a bundle only when its signature
verifies with the trusted key it names.

Public keys are written as the base64 of their 32 raw bytes (a PEM ``PUBLIC KEY`` is read too);
a key's id is the first 16 hex digits of the sha256 of those bytes. ``cryptography`` is imported
only when a key is used: the core of cachelib stays without it (``pip install compilecache[signing]``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cachelib.bundle import BundleError
from cachelib.stores import NotFound, Store

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SIGNATURES = "signatures"
"""The segment under a cache's prefix that holds its bundles' signatures."""
SIGNATURE_SUFFIX = ".sig"
SIGNATURE_FORMAT = 1
SIGNED_PREFIX = b"compilecache-bundle-signature/v1\0"
MAX_SIGNATURE_BYTES = 4096
"""A signature object is a few hundred bytes; anything much larger is not one."""
TRUSTED_KEYS_ENV = "COMPILECACHE_TRUSTED_KEYS"
"""Comma-separated public keys a preload trusts when no ``--trusted-key`` is given."""
RAW_KEY_BYTES = 32


class SignatureError(BundleError):
    """A bundle whose signature is missing, malformed, by an untrusted key, or does not verify."""


class KeyFormatError(ValueError):
    """A key that cannot be read; the message says which and why."""


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the preloader image installs it
        raise KeyFormatError(
            "bundle signatures need the 'cryptography' package (pip install 'compilecache[signing]')"
        ) from None
    return ed25519


def key_id(raw: bytes) -> str:
    """The short id of a public key: 16 hex digits of the sha256 of its raw bytes."""
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    raw: bytes
    """The 32 raw bytes of an Ed25519 public key."""

    @property
    def id(self) -> str:
        return key_id(self.raw)

    def text(self) -> str:
        """The form this module reads back: base64 of the raw bytes."""
        return base64.b64encode(self.raw).decode()

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """A public key from base64 of its 32 raw bytes, or from a PEM ``PUBLIC KEY`` block."""
        text = text.strip()
        if text.startswith("-----BEGIN"):
            from cryptography.hazmat.primitives import serialization

            try:
                loaded = serialization.load_pem_public_key(text.encode())
            except ValueError as exc:
                raise KeyFormatError(f"public key: not a PEM public key: {exc}") from None
            if not isinstance(loaded, _ed25519().Ed25519PublicKey):
                raise KeyFormatError(f"public key: expected an Ed25519 key, got {type(loaded).__name__}")
            return cls(loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise KeyFormatError(
                f"public key {text[:20]!r}...: not base64 (expected 32 raw bytes in base64, or PEM)"
            ) from None
        if len(raw) != RAW_KEY_BYTES:
            raise KeyFormatError(
                f"public key {text[:20]!r}...: {len(raw)} bytes, an Ed25519 public key has {RAW_KEY_BYTES}"
            )
        return cls(raw)


def parse_public_keys(texts: Iterable[str]) -> tuple[PublicKey, ...]:
    """Every key of ``texts`` (each may hold several, comma-separated), without repeats, in order."""
    keys: dict[bytes, PublicKey] = {}
    for text in texts:
        for item in text.split(","):
            if item.strip():
                key = PublicKey.parse(item)
                keys.setdefault(key.raw, key)
    return tuple(keys.values())


def signed_message(key: str, digest: str) -> bytes:
    return SIGNED_PREFIX + key.encode() + b"\0" + digest.encode()


def signature_key(key: str) -> str:
    """Where the signature of the bundle under ``key`` lives in the store: under the same cache prefix
    (``cc1/<namespace>/<name>/``), so deleting a cache deletes its signatures, but in a folder of its
    own, ``signatures/``, so that it never reads as a cache key (listings of bundles pass over it)."""
    head = key.split("/", 3)
    if len(head) == 4:
        return "/".join([*head[:3], SIGNATURES, head[3]]) + SIGNATURE_SUFFIX
    return f"{SIGNATURES}/{key}{SIGNATURE_SUFFIX}"


def delete_signed(store: Store, key: str) -> bool:
    """Delete the bundle under ``key`` and its signature (a signature without its bundle means nothing);
    True when the bundle was there."""
    deleted = store.delete(key)
    store.delete(signature_key(key))
    return deleted


@dataclass(frozen=True)
class Signature:
    key: str
    digest: str
    key_id: str
    value: bytes

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": SIGNATURE_FORMAT,
                "algorithm": "ed25519",
                "key": self.key,
                "digest": self.digest,
                "key_id": self.key_id,
                "signature": base64.b64encode(self.value).decode(),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Signature:
        try:
            parsed = json.loads(data)
            if not isinstance(parsed, dict):
                raise ValueError("not an object")
            if parsed.get("format") != SIGNATURE_FORMAT or parsed.get("algorithm") != "ed25519":
                raise ValueError(f"format {parsed.get('format')!r} / algorithm {parsed.get('algorithm')!r} unknown")
            return cls(
                key=str(parsed["key"]),
                digest=str(parsed["digest"]),
                key_id=str(parsed["key_id"]),
                value=base64.b64decode(str(parsed["signature"]), validate=True),
            )
        except (ValueError, KeyError, binascii.Error) as exc:
            raise SignatureError(f"{where}: not a bundle signature ({exc})") from None


class Signer:
    """An Ed25519 private key that signs bundles."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        from cryptography.hazmat.primitives import serialization

        self._private = private
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = PublicKey(raw)

    @classmethod
    def generate(cls) -> Signer:
        return cls(_ed25519().Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes, where: str = "private key") -> Signer:
        from cryptography.hazmat.primitives import serialization

        try:
            private = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFormatError(f"{where}: not an unencrypted PEM private key: {exc}") from None
        if not isinstance(private, _ed25519().Ed25519PrivateKey):
            raise KeyFormatError(f"{where}: expected an Ed25519 private key, got {type(private).__name__}")
        return cls(private)

    def private_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def sign(self, key: str, digest: str) -> Signature:
        return Signature(key, digest, self.public_key.id, self._private.sign(signed_message(key, digest)))


def verify(signature: Signature, key: str, digest: str, trusted: Sequence[PublicKey]) -> str:
    """The id of the trusted key that signed ``key`` with ``digest``; :class:`SignatureError` naming
    what is wrong otherwise."""
    if signature.key != key:
        raise SignatureError(f"signature of {key} was made for another bundle key ({signature.key})")
    if signature.digest != digest:
        raise SignatureError(
            f"signature of {key} covers bundle digest {signature.digest[:16]}..., the bundle has {digest[:16]}..."
        )
    public = next((k for k in trusted if k.id == signature.key_id), None)
    if public is None:
        ids = ", ".join(k.id for k in trusted)
        raise SignatureError(f"bundle {key} is signed by key {signature.key_id}, which is not trusted (trusted: {ids})")
    from cryptography.exceptions import InvalidSignature

    try:
        _ed25519().Ed25519PublicKey.from_public_bytes(public.raw).verify(signature.value, signed_message(key, digest))
    except InvalidSignature:
        raise SignatureError(f"bundle {key}: the signature does not verify with key {public.id}") from None
    return public.id


# -- the store edge ------------------------------------------------------------------------------------
def read_signature(store: Store, key: str) -> Signature:
    """The signature stored for ``key``; :class:`SignatureError` when there is none or it is unreadable."""
    where = signature_key(key)
    try:
        with store.get(where) as stream:
            data = stream.read(MAX_SIGNATURE_BYTES + 1)
    except NotFound:
        raise SignatureError(f"bundle {key} is not signed (no {where} in the store)") from None
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"{where}: larger than {MAX_SIGNATURE_BYTES} bytes, not a bundle signature")
    return Signature.from_json(data, where)


def write_signature(store: Store, signature: Signature) -> None:
    import io

    data = signature.to_json()
    store.put(signature_key(signature.key), io.BytesIO(data), size=len(data))


def check_stored(store: Store, key: str, digest: str, trusted: Sequence[PublicKey]) -> str:
    """Read the signature of ``key`` from the store and verify it; the signing key's id."""
    return verify(read_signature(store, key), key, digest, trusted)
