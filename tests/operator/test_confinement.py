"""The cluster admin's allow-lists: stores, credentials Secrets, warm-up ServiceAccounts (pure parts),
and the signing key the operator loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from compilecache_operator.decisions import cacheview, podpatch
from compilecache_operator.decisions.plan import BundleRecord
from compilecache_operator.edge.signing import SigningKeyError, load_signing, sign_records
from compilecache_operator.main import parse_args, settings_from
from compilecache_operator.model.confinement import (
    Confinement,
    check_confinement,
    destination_allowed,
    problems,
    store_destination,
)
from compilecache_operator.model.spec import InvalidSpec

from cachelib.signing import Signer, check_stored
from cachelib.stores import open_store
from tests.operator.samples import inject, owner, parsed, pod, view


@pytest.mark.parametrize(
    ("url", "destination"),
    [
        ("redis://:pw@Redis.Cache.svc:6380/1?prefix=x", "redis.cache.svc:6380"),
        ("rediss://redis.cache.svc/0", "redis.cache.svc:6379"),
        ("s3://bucket/prefix?endpoint=https://minio.storage.svc:9000", "minio.storage.svc:9000"),
        ("s3://bucket/prefix?endpoint=http://minio.storage.svc", "minio.storage.svc:80"),
        ("s3://bucket/prefix", "s3://bucket"),
        ("file:///shared/cache", "file:///shared/cache"),
    ],
)
def test_store_destination(url: str, destination: str) -> None:
    assert store_destination(url) == destination


@pytest.mark.parametrize(
    ("destination", "patterns", "allowed"),
    [
        ("redis.cache.svc:6379", ["redis.cache.svc"], True),
        ("redis.cache.svc:6379", ["redis.cache.svc:6379"], True),
        ("redis.cache.svc:6380", ["redis.cache.svc:6379"], False),
        ("redis.cache.svc:6379", ["*.cache.svc"], True),
        ("redis.evil.example:6379", ["*.cache.svc", "redis.cache.svc"], False),
        ("evilcache.svc:6379", ["*.cache.svc"], False),
        ("s3://bucket", ["s3://bucket"], True),
        ("s3://bucket2", ["s3://bucket"], False),
        ("s3://bucket", ["bucket"], False),
        ("file:///shared/cache/x", ["file:///shared/cache"], True),
        ("file:///shared/cachex", ["file:///shared/cache"], False),
        ("anything:1", ["*"], True),
        ("redis.cache.svc:6379", [], False),
    ],
)
def test_destination_patterns(destination: str, patterns: list[str], allowed: bool) -> None:
    assert destination_allowed(destination, patterns) is allowed


def test_every_choice_outside_the_lists_is_named() -> None:
    confined = Confinement(store_hosts=("redis.cache.svc",), store_secrets=("store", "team-b/special"),
                           warmup_service_accounts=("warmup",))  # fmt: skip
    ok = problems(confined, "team-a", store_url="redis://redis.cache.svc/0", secret_name="store",
                  service_account="warmup")  # fmt: skip
    assert ok == []
    found = problems(confined, "team-a", store_url="redis://attacker.example:6379/0", secret_name="special",
                     service_account="cluster-admin-sa")  # fmt: skip
    assert [e.path for e in found] == ["spec.storage.url", "spec.storage.secretRef.name",
                                       "spec.warmup.serviceAccountName"]  # fmt: skip
    assert "attacker.example:6379 is not on the operator's allow-list (redis.cache.svc)" in found[0].message
    assert problems(confined, "team-b", store_url="redis://redis.cache.svc/0", secret_name="special",
                    service_account=None) == []  # fmt: skip
    assert problems(Confinement(), "x", store_url="redis://anywhere/0", secret_name="s", service_account="a") == []
    nothing = Confinement(store_hosts=(), store_secrets=(), warmup_service_accounts=())
    assert len(problems(nothing, "x", store_url="redis://anywhere/0", secret_name="s", service_account="a")) == 3


def test_a_confined_cache_is_invalid_and_never_wired_into_pods() -> None:
    confined = Confinement(store_hosts=("redis.cache.svc",))
    spec = parsed(storage={"url": "redis://attacker.example:6379/0", "secretRef": {"name": "store"}})
    with pytest.raises(InvalidSpec, match=r"spec\.storage\.url: store attacker\.example:6379"):
        check_confinement(confined, "team-a", spec)
    body = owner(storage={"url": "redis://attacker.example:6379/0", "secretRef": {"name": "store"}})
    body["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    from compilecache_operator.model.spec import Defaults

    assert cacheview.cache_view(body, Defaults()).ready
    refused = cacheview.cache_view(body, Defaults(), confined)
    assert not refused.ready and refused.spec is None
    assert inject(pod(), refused).skipped == "not-ready"


@pytest.mark.parametrize(("host", "port", "allowed"), [
    ("redis.cache.svc", 6379, True),
    ("Redis.Cache.SVC", 6379, True),
    ("collector.attacker.example", 6379, False),
    ("169.254.169.254", 80, False),
    ("redis.cache.svc", 6380, False),  # the allow-list pins the port
    ("other.team.svc", 6379, True),  # a grant's host
])
def test_the_remote_cache_is_confined_like_a_store(host: str, port: int, allowed: bool) -> None:
    """``spec.remoteCache`` points the warm-up and every opted-in pod's PyTorch remote cache (entries torch loads and
    runs, signed by nobody) at a Redis: its ``host:port`` is held against the stores' allow-list, grants included,
    and refused with the field named, at the reconcile and in the webhook's view (no pod is wired to it)."""
    from compilecache_operator.model.confinement import Grant

    confined = Confinement(store_hosts=("redis.cache.svc:6379",),
                           grants=(Grant(source="cm", namespaces=("team-a",), store_hosts=("*.team.svc",)),))
    remote = {"host": host, "port": port}
    spec = parsed(storage={"url": "redis://redis.cache.svc:6379/0"}, remoteCache=remote)
    body = owner(storage={"url": "redis://redis.cache.svc:6379/0"}, remoteCache=remote)
    body["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    from compilecache_operator.model.spec import Defaults

    if allowed:
        check_confinement(confined, "team-a", spec)
        assert cacheview.cache_view(body, Defaults(), confined).ready
        return
    with pytest.raises(InvalidSpec) as refused:
        check_confinement(confined, "team-a", spec)
    (error,) = refused.value.errors
    assert error.path == "spec.remoteCache.host"
    assert f"remote cache {host.lower()}:{port} is not on the operator's allow-list" in error.message
    view_of = cacheview.cache_view(body, Defaults(), confined)
    assert not view_of.ready and inject(pod(), view_of).skipped == "not-ready"
    check_confinement(Confinement(), "team-a", spec)  # a list not configured confines nothing


def test_webhook_passes_the_trusted_keys_to_the_preload() -> None:
    keys = ("a" * 44, "b" * 44)
    patch = podpatch.build_pod_patch(pod(), view(), preloader_image="img", trusted_keys=keys)
    assert patch.init_containers is not None
    command = patch.init_containers[0]["command"]
    assert [command[i + 1] for i, arg in enumerate(command) if arg == "--trusted-key"] == list(keys)
    plain = inject(pod(), view())
    assert plain.init_containers is not None and "--trusted-key" not in plain.init_containers[0]["command"]


def test_operator_flags_build_the_confinement_and_signing(tmp_path: Path) -> None:
    key_file = tmp_path / "signing.key"
    signer, previous = Signer.generate(), Signer.generate()
    key_file.write_bytes(signer.private_pem())
    options = parse_args([
        "--default-storage-url", "redis://redis.compilecache.svc:6379/0", "--default-storage-secret", "store",
        "--allowed-store-hosts", "*.cache.svc", "--allowed-store-secrets", "team-a/creds",
        "--signing-key-file", str(key_file), "--trusted-public-keys", previous.public_key.text(),
    ])  # fmt: skip
    settings = settings_from(options)
    assert settings.confinement == Confinement(
        store_hosts=("*.cache.svc", "redis.compilecache.svc:6379"), store_secrets=("team-a/creds", "store")
    )
    assert settings.signing is not None
    assert settings.signing.trusted == (signer.public_key, previous.public_key)
    assert settings_from(parse_args([])).confinement == Confinement() and settings_from(parse_args([])).signing is None


def test_bad_signing_key_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(SigningKeyError, match="No such file"):
        load_signing(tmp_path / "absent")
    (tmp_path / "bad").write_text("not a key")
    with pytest.raises(SigningKeyError, match=r"bad: not an unencrypted PEM private key"):
        load_signing(tmp_path / "bad")
    good = tmp_path / "good"
    good.write_bytes(Signer.generate().private_pem())
    with pytest.raises(SigningKeyError, match="not base64"):
        load_signing(good, ["???"])


def test_sign_records_writes_verifiable_signatures(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_bytes(Signer.generate().private_pem())
    signing = load_signing(key_file)
    key = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/cpu/cpu/torch-2.13.0/triton-none/cuda-none/py-3.11"
    records = [BundleRecord(variant="v", key=key, bundle_digest="ab" * 32),
               BundleRecord(variant="w", key=key.replace("mlp", "old"))]  # fmt: skip
    with open_store(f"file://{tmp_path / 'store'}") as store:
        outcome = sign_records(store, signing, records)
        assert outcome.signed == (records[0],)
        assert outcome.failed[0][0] == records[1] and "no bundle_digest" in outcome.failed[0][1]
        assert check_stored(store, key, "ab" * 32, signing.trusted) == signing.signer.public_key.id
