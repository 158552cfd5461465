"""The operator's side of bundle signatures: the signing key, signing what the publish step reported,
and the public keys every preload is told to trust.

The private key is a PEM file mounted from a Secret of the operator's own namespace (the chart
generates it on first install and keeps it across upgrades, or takes an existing Secret); it
never reaches a warm-up pod. After a warm-up Job's publish container reports the bundle's key and
bundle digest (the sha256 of its header, which holds every part's sha256), the operator signs that
pair and writes the signature beside the bundle in the store (:mod:`cachelib.signing`). Only then
is the bundle recorded in the CompileCache's status and offered to pods.

Trusted keys are the signing key's own public key plus any others given (the previous key during a
rotation): bundles signed by either verify until the old key is dropped from the list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cachelib.signing import KeyFormatError, PublicKey, Signer, parse_public_keys, write_signature
from cachelib.stores import Store, StoreError
from compilecache_operator.decisions.plan import BundleRecord

log = logging.getLogger(__name__)


class SigningKeyError(ValueError):
    """The signing key or a trusted key cannot be used; the message names the file or value."""


@dataclass(frozen=True)
class Signing:
    signer: Signer
    trusted: tuple[PublicKey, ...]
    """The signer's public key first, then the others accepted (a rotation's previous key)."""

    @property
    def trusted_texts(self) -> tuple[str, ...]:
        """The trusted keys as the preload's ``--trusted-key`` takes them."""
        return tuple(k.text() for k in self.trusted)


def load_signing(key_file: Path, extra_trusted: Sequence[str] = ()) -> Signing:
    """The signing key from its PEM file, trusting its public key and ``extra_trusted``."""
    try:
        pem = key_file.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"signing key {key_file}: {exc.strerror or exc}") from None
    signing = signing_from_pem(pem, str(key_file), extra_trusted)
    log_signing(signing)
    return signing


def log_signing(signing: Signing) -> None:
    log.info("signing bundles with key %s (public key %s); preloads trust %s", signing.signer.public_key.id,
             signing.signer.public_key.text(), ", ".join(k.id for k in signing.trusted))


def signing_from_pem(pem: bytes, where: str, extra_trusted: Sequence[str] = ()) -> Signing:
    """The signing key ``pem`` (read from ``where``), trusting its public key and ``extra_trusted``."""
    try:
        signer = Signer.from_pem(pem, where)
        extra = parse_public_keys(extra_trusted)
    except KeyFormatError as exc:
        raise SigningKeyError(str(exc)) from None
    trusted = (signer.public_key, *(k for k in extra if k != signer.public_key))
    return Signing(signer, trusted)


@dataclass(frozen=True)
class SignOutcome:
    signed: tuple[BundleRecord, ...]
    failed: tuple[tuple[BundleRecord, str], ...]
    """Records left unsigned, with the reason (they are not recorded; the next pass tries again)."""


def sign_records(store: Store, signing: Signing, records: Sequence[BundleRecord]) -> SignOutcome:
    """Sign each record's key and the bundle digest its publish step reported, and write the
    signature into ``store``. A record without a reported digest (a publish step of an
    older preloader image) cannot be signed."""
    signed: list[BundleRecord] = []
    failed: list[tuple[BundleRecord, str]] = []
    for record in records:
        digest = record.bundle_digest
        if not digest:
            failed.append((record, "the publish step reported no bundle_digest (preloader image too old?)"))
            continue
        try:
            write_signature(store, signing.signer.sign(record.key, digest))
        except StoreError as exc:
            failed.append((record, f"cannot write the signature: {exc}"))
        else:
            signed.append(record)
    return SignOutcome(tuple(signed), tuple(failed))
