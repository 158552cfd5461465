"""Signed bundles: who may write a bundle that a preload accepts (real redis-server, real Ed25519).

A store writer without the private key can put any bytes under a bundle key, with a correct
sha256 for them; a preload that trusts keys refuses such a bundle before it reads any part.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from cachelib.bundlereader import BundleReader
from cachelib.preload import preload
from cachelib.publish import publish
from cachelib.signing import (
    KeyFormatError,
    PublicKey,
    Signature,
    SignatureError,
    Signer,
    check_stored,
    parse_public_keys,
    signature_key,
    verify,
    write_signature,
)
from cachelib.stores import Store, open_store
from tests.cachelib.helpers import last_json, make_key, make_outdir, run_cli
from testsupport.servers import RedisServer

KEY = make_key()
OTHER = make_key(name="other")


@pytest.fixture
def redis_store(redis_server: RedisServer) -> str:
    return redis_server.store_url()


def publish_bundle(store: str, tmp_path: Path, key: str = str(KEY), payload: bytes = b"graph") -> str:
    """Publish a bundle as a store writer would (no signature); its bundle digest."""
    out = make_outdir(tmp_path / f"out-{payload.hex()[:12]}", make_key(**_fields(key)), files={"fx/entry": payload})
    return publish(out, store).digest


def _fields(key: str) -> dict[str, str]:
    from cachelib.keyformat import CacheKey

    return {k: v for k, v in CacheKey.parse(key).to_dict().items() if k != "format"}


def stored_digest(store: Store, key: str) -> str:
    with store.get(key) as stream:
        return BundleReader(stream).digest


# -- pure parts -------------------------------------------------------------------------------------
def test_sign_and_verify_names_the_key() -> None:
    signer = Signer.generate()
    signature = signer.sign(str(KEY), "ab" * 32)
    assert verify(signature, str(KEY), "ab" * 32, [signer.public_key]) == signer.public_key.id
    assert Signature.from_json(signature.to_json(), "x") == signature


def test_signature_bound_to_key_digest_and_signer() -> None:
    signer, stranger = Signer.generate(), Signer.generate()
    signature = signer.sign(str(KEY), "ab" * 32)
    with pytest.raises(SignatureError, match="another bundle key"):
        verify(signature, str(OTHER), "ab" * 32, [signer.public_key])
    with pytest.raises(SignatureError, match="covers bundle digest"):
        verify(signature, str(KEY), "cd" * 32, [signer.public_key])
    with pytest.raises(SignatureError, match="not trusted"):
        verify(signature, str(KEY), "ab" * 32, [stranger.public_key])
    forged = Signature(str(KEY), "ab" * 32, signer.public_key.id, stranger.sign(str(KEY), "ab" * 32).value)
    with pytest.raises(SignatureError, match="does not verify"):
        verify(forged, str(KEY), "ab" * 32, [signer.public_key])


def test_public_keys_parse_from_base64_and_pem_and_refuse_garbage() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    signer = Signer.generate()
    pem = (
        serialization.load_pem_private_key(signer.private_pem(), None)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    assert PublicKey.parse(pem) == signer.public_key == PublicKey.parse(signer.public_key.text())
    other = Signer.generate().public_key
    assert parse_public_keys([f"{signer.public_key.text()},{other.text()}", other.text()]) == (signer.public_key, other)
    with pytest.raises(KeyFormatError, match="not base64"):
        PublicKey.parse("not a key!")
    with pytest.raises(KeyFormatError, match="16 bytes"):
        PublicKey.parse("AAAAAAAAAAAAAAAAAAAAAA==")
    assert isinstance(ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey)
    with pytest.raises(KeyFormatError, match="Ed25519"):
        from cryptography.hazmat.primitives.asymmetric import ec

        rsa_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        Signer.from_pem(rsa_pem)
    assert Signer.from_pem(signer.private_pem()).public_key == signer.public_key


# -- the preload, against a real redis-server --------------------------------------------------------
def test_signed_bundle_hits_and_names_its_signer(redis_store: str, tmp_path: Path) -> None:
    signer = Signer.generate()
    digest = publish_bundle(redis_store, tmp_path)
    with open_store(redis_store) as store:
        assert stored_digest(store, str(KEY)) == digest
        write_signature(store, signer.sign(str(KEY), digest))
    result = preload(redis_store, [str(KEY)], tmp_path / "t", trusted_keys=[signer.public_key])
    assert result.result == "hit", result.reason
    assert result.signed_by == {str(KEY): signer.public_key.id}
    assert (tmp_path / "t" / "fx" / "entry").read_bytes() == b"graph"
    listed = preload(redis_store, cache=f"{KEY.namespace}/{KEY.name}", target=tmp_path / "c",
                     trusted_keys=[signer.public_key])  # fmt: skip
    assert listed.result == "hit" and listed.keys == [str(KEY)], listed.reason  # the signature is no bundle


@pytest.mark.parametrize("signature", ["none", "other-key", "garbage", "replayed"])
def test_unsigned_or_wrongly_signed_bundle_is_refused_before_unpacking(
    redis_store: str, tmp_path: Path, signature: str
) -> None:
    """A store writer without the key: correct sha256, no / another key's / a malformed signature, or
    the valid signature of an earlier bundle under the same key."""
    signer = Signer.generate()
    if signature == "replayed":
        old = publish_bundle(redis_store, tmp_path, payload=b"old")
        with open_store(redis_store) as store:
            write_signature(store, signer.sign(str(KEY), old))
    digest = publish_bundle(redis_store, tmp_path, payload=b"evil")
    with open_store(redis_store) as store:
        head = store.head(str(KEY))
        assert head is not None and head.sha256  # the store's own sha256 is right: it proves nothing
        if signature == "other-key":
            write_signature(store, Signer.generate().sign(str(KEY), digest))
        elif signature == "garbage":
            store.put(signature_key(str(KEY)), io.BytesIO(b"{}"), size=2)
    result = preload(redis_store, [str(KEY)], tmp_path / "t", trusted_keys=[signer.public_key])
    assert result.result == "error" and (result.reason or "").startswith("SignatureError:"), result.reason
    expected = {"none": "not signed", "other-key": "not trusted", "garbage": "not a bundle signature",
                "replayed": "covers bundle digest"}[signature]  # fmt: skip
    assert expected in (result.reason or "")
    assert not (tmp_path / "t" / "fx").exists() and result.hits == [] and result.files == 0


def test_rotation_accepts_both_keys_during_the_rollover(redis_store: str, tmp_path: Path) -> None:
    old, new = Signer.generate(), Signer.generate()
    digest_a = publish_bundle(redis_store, tmp_path, payload=b"a")
    other_key = str(make_key(gpu="cpu", capability="cpu"))
    digest_b = publish_bundle(redis_store, tmp_path, key=other_key, payload=b"b")
    with open_store(redis_store) as store:
        write_signature(store, old.sign(str(KEY), digest_a))
        write_signature(store, new.sign(other_key, digest_b))
        assert check_stored(store, str(KEY), digest_a, [new.public_key, old.public_key]) == old.public_key.id
    both = preload(redis_store, [str(KEY), other_key], tmp_path / "both", trusted_keys=[new.public_key, old.public_key])
    assert both.result == "hit", both.reason
    assert both.signed_by == {str(KEY): old.public_key.id, other_key: new.public_key.id}
    after = preload(redis_store, [str(KEY)], tmp_path / "after", trusted_keys=[new.public_key])
    assert after.result == "error" and "not trusted" in (after.reason or "")


def test_without_trusted_keys_nothing_is_checked(redis_store: str, tmp_path: Path) -> None:
    publish_bundle(redis_store, tmp_path)
    result = preload(redis_store, [str(KEY)], tmp_path / "t")
    assert result.result == "hit" and result.signed_by == {}


# -- the command line --------------------------------------------------------------------------------
def test_cli_preload_with_trusted_keys_from_the_environment(redis_store: str, tmp_path: Path) -> None:
    signer = Signer.generate()
    digest = publish_bundle(redis_store, tmp_path)
    with open_store(redis_store) as store:
        write_signature(store, signer.sign(str(KEY), digest))
    env = {"COMPILECACHE_TRUSTED_KEYS": f"{Signer.generate().public_key.text()},{signer.public_key.text()}"}
    proc = run_cli("preload", "--store", redis_store, "--key", str(KEY), "--target", str(tmp_path / "t"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["signed_by"] == {str(KEY): signer.public_key.id}
    refused = run_cli("preload", "--store", redis_store, "--key", str(KEY), "--target", str(tmp_path / "u"),
                      "--trusted-key", Signer.generate().public_key.text(), "--strict")  # fmt: skip
    assert refused.returncode == 1 and "not trusted" in last_json(refused.stdout)["reason"]
    bad = run_cli("preload", "--store", redis_store, "--key", str(KEY), "--target", str(tmp_path / "v"),
                  "--trusted-key", "nope")  # fmt: skip
    assert bad.returncode == 2 and bad.stdout == "", "a key that does not parse is a bad argument"
    assert bad.stderr.startswith("compilecache preload: error: --trusted-key:")


def test_cli_inspect_verify_shows_who_signed(redis_store: str, tmp_path: Path) -> None:
    signer = Signer.generate()
    digest = publish_bundle(redis_store, tmp_path)
    proc = run_cli("inspect", "--store", redis_store, str(KEY), "--verify")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["digest"] == digest and shown["signature"]["key_id"] is None
    with open_store(redis_store) as store:
        write_signature(store, signer.sign(str(KEY), digest))
    claimed = json.loads(run_cli("inspect", "--store", redis_store, str(KEY), "--verify").stdout)
    assert claimed["signature"] == {"key_id": signer.public_key.id, "verified": None,
                                    "reason": "not checked: no --trusted-key given"}  # fmt: skip
    checked = run_cli("inspect", "--store", redis_store, str(KEY), "--verify",
                      "--trusted-key", signer.public_key.text())  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["signature"] == {"key_id": signer.public_key.id, "verified": True, "reason": None}
    stranger = run_cli("inspect", "--store", redis_store, str(KEY), "--verify",
                       "--trusted-key", Signer.generate().public_key.text())  # fmt: skip
    assert stranger.returncode == 1 and "not trusted" in stranger.stderr


def test_ls_passes_over_signatures_and_gc_deletes_them_with_their_bundle(tmp_path: Path) -> None:
    store_url = f"file://{tmp_path / 'store'}"
    signer = Signer.generate()
    digest = publish_bundle(store_url, tmp_path)
    with open_store(store_url) as store:
        write_signature(store, signer.sign(str(KEY), digest))
    listed = run_cli("ls", "--store", store_url, "--json")
    assert [json.loads(line)["key"] for line in listed.stdout.splitlines()] == [str(KEY)]
    assert run_cli("gc", "--store", store_url, "--keep", "0", "--yes").returncode == 0
    with open_store(store_url) as store:
        assert list(store.list()) == []
