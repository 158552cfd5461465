"""pack and publish: a harness output directory becomes a verified bundle in a store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachelib.bundle import CACHEDIR_PART, MEGACACHE_PART, BadMagic
from cachelib.bundlereader import BundleReader, verify_bundle_file
from cachelib.keyformat import CacheKey
from cachelib.publish import PackError, inspect_bundle, pack, publish
from cachelib.stores import open_store
from cachelib.unpack import RUNTIME_DIRS, unpack_tar_verified
from tests.cachelib.helpers import content, make_key, make_outdir, tree


def test_pack_writes_a_bundle_of_the_output_directory(tmp_path: Path) -> None:
    key = make_key()
    out = make_outdir(tmp_path / "out", key, megacache=b"M" * 1000)
    (out / "cachedir" / "inner-link").symlink_to("fxgraph/ab/fabc/entry")
    (out / "cachedir" / "outer-link").symlink_to("/etc/passwd")
    written = pack(out, tmp_path / "b.ccb")
    header = verify_bundle_file(tmp_path / "b.ccb")
    assert header == written.header
    assert header.key == key
    assert header.job_id == "compilecache-team-a.llama"
    assert header.versions["python"] == "3.11.7"
    assert header.result["compile_seconds"] == 1.5
    assert header.producer.startswith("compilecache/")
    assert [p.name for p in header.parts] == [CACHEDIR_PART, MEGACACHE_PART]
    with open(tmp_path / "b.ccb", "rb") as stream:
        reader = BundleReader(stream)
        with reader.open_part(CACHEDIR_PART) as part:
            unpack_tar_verified(part, part.verify, tmp_path / "unpacked")  # type: ignore[arg-type]
        assert reader.read_part(MEGACACHE_PART) == b"M" * 1000
    expected = tree(out / "cachedir")
    for excluded in ("locks", "locks/cxy.lock", "outer-link"):
        expected.pop(excluded)
    assert tree(tmp_path / "unpacked") == expected


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda out: (out / "result.json").unlink(), "result.json: missing"),
        (lambda out: (out / "result.json").write_text("{"), "cannot be read as JSON"),
        (lambda out: (out / "result.json").write_text(json.dumps({"key": {"namespace": "x"}})), "field 'key'.*missing"),
        (lambda out: _rename_dir(out / "cachedir"), "cachedir: missing"),
    ],
)
def test_pack_refuses_bad_output_directories(tmp_path: Path, damage: object, match: str) -> None:
    out = make_outdir(tmp_path / "out", make_key())
    damage(out)  # type: ignore[operator]
    with pytest.raises(PackError, match=match):
        pack(out, tmp_path / "b.ccb")
    assert not (tmp_path / "b.ccb").exists()


def _rename_dir(path: Path) -> None:
    path.rename(path.with_name("elsewhere"))


def test_pack_refuses_a_key_string_that_disagrees(tmp_path: Path) -> None:
    out = make_outdir(tmp_path / "out", make_key())
    result = json.loads((out / "result.json").read_text())
    result["key_string"] = str(make_key(gpu="cpu"))
    (out / "result.json").write_text(json.dumps(result))
    with pytest.raises(PackError, match="does not match"):
        pack(out, tmp_path / "b.ccb")


def test_publish_puts_the_bundle_under_its_key(tmp_path: Path) -> None:
    key = make_key()
    url = f"file://{tmp_path / 'store'}"
    published = publish(make_outdir(tmp_path / "out", key), url)
    assert published.key == str(key)
    with open_store(url) as store:
        info = store.head(str(key))
        assert info is not None and info.size == published.bytes
        with store.get(str(key)) as stream:
            data = stream.read()
    assert len(data) == published.bytes
    import hashlib

    assert hashlib.sha256(data).hexdigest() == published.sha256
    payload = published.to_dict()
    assert payload["result"] == "published" and payload["compile_seconds"] == 1.5
    assert payload["versions"]["torch"] == key.torch and payload["job_id"] == "compilecache-team-a.llama"
    assert len(json.dumps(payload)) < 3 * 1024
    assert set(payload["parts"]) == {CACHEDIR_PART, MEGACACHE_PART}
    assert not list(tmp_path.glob("compilecache-publish-*"))


def test_publish_reports_the_warm_up_check_of_the_precompiled_part(tmp_path: Path) -> None:
    out = make_outdir(tmp_path / "out", make_key())
    result = json.loads((out / "result.json").read_text())
    result["precompile"] = {"dynamo_entries": 0, "check": {"verified": False, "reason": "outputs differ", "seconds": 3}}
    result["bytecode"] = {"files": 7, "bytes": 700, "sources": 7, "skipped": None, "seconds": 0.1}
    (out / "result.json").write_text(json.dumps(result))
    payload = publish(out, f"file://{tmp_path / 'store'}").to_dict()
    assert payload["precompile"] == {"verified": False, "reason": "outputs differ", "seconds": 3, "dynamo_entries": 0}
    assert payload["bytecode"] == {"files": 7, "bytes": 700, "skipped": None}
    plain = publish(make_outdir(tmp_path / "plain", make_key(name="other")), f"file://{tmp_path / 'store'}")
    assert "precompile" not in plain.to_dict() and "bytecode" not in plain.to_dict()


def test_publish_takes_a_bundle_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    key = make_key()
    pack(make_outdir(tmp_path / "out", key), tmp_path / "b.ccb")
    url = f"file://{tmp_path / 'store'}"
    assert publish(tmp_path / "b.ccb", url).key == str(key)
    bad = tmp_path / "bad.ccb"
    bad.write_bytes(b"NOTABUNDLE" * 10)
    with pytest.raises(BadMagic):
        publish(bad, f"file://{tmp_path / 'store2'}")
    assert not (tmp_path / "store2").exists()


def test_inspect_returns_the_header(tmp_path: Path) -> None:
    pack(make_outdir(tmp_path / "out", make_key()), tmp_path / "b.ccb")
    header = inspect_bundle(tmp_path / "b.ccb", verify=True)
    assert CacheKey.parse(header["key"]) == make_key()
    assert header["parts"][0]["name"] == CACHEDIR_PART


def test_publish_and_preload_round_trip_through_every_store(store_url: str, tmp_path: Path) -> None:
    from cachelib.preload import preload

    key = make_key()
    out = make_outdir(tmp_path / "out", key)
    publish(out, store_url)
    result = preload(store_url, [str(key)], tmp_path / "target")
    assert result.result == "hit", result.reason
    expected = tree(out / "cachedir")
    expected.pop("locks/cxy.lock")
    expected.update(dict.fromkeys(RUNTIME_DIRS, "dir"))  # made by the preload (locks/ empty), not shipped
    assert content(tmp_path / "target") == expected
    with open_store(store_url) as store:
        assert [i.key for i in store.list("cc1/")] == [str(key)]
        with store.get(str(key)) as stream:
            assert BundleReader(stream).header.key == key
