"""Node caches: a directory shared by the pods of a node gets each bundle once.

A second preload that finds the same bundle (key and sha256) complete fetches nothing;
preloads of the same bundle at the same time (real processes) wait for each other and leave
one complete tree; a re-published bundle is fetched again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cachelib.preload import preload
from cachelib.publish import publish
from cachelib.stores import open_store
from cachelib.unpack import STAGING_PREFIX, read_marker
from tests.cachelib.helpers import ROOT, content, last_json, make_key, make_outdir, tree

KEY = make_key()
OTHER = make_key(name="other")


def files(seed: int, count: int = 40, size: int = 64 * 1024) -> dict[str, bytes]:
    """Distinct, incompressible cache files (as compiled objects are), the same for the same seed."""
    rng = random.Random(seed)
    return {f"fxgraph/{i:02d}/entry": rng.randbytes(size) for i in range(count)}


def test_store_records_the_sha256_the_marker_compares(store_url: str, tmp_path: Path) -> None:
    published = publish(make_outdir(tmp_path / "out", KEY, files=files(1)), store_url)
    with open_store(store_url) as store:
        info = store.head(str(KEY))
    assert info is not None and info.sha256 == published.sha256


def test_a_second_preload_of_the_same_bundle_fetches_nothing(store_url: str, tmp_path: Path) -> None:
    publish(make_outdir(tmp_path / "out", KEY, files=files(1)), store_url)
    target = tmp_path / "node" / "inductor"
    first = preload(store_url, [str(KEY)], target)
    assert (first.result, first.source, first.node_cache) == ("hit", "store", [])
    assert first.bytes > 0 and first.files == 40
    before = content(target)
    second = preload(store_url, [str(KEY)], target)
    assert (second.result, second.source, second.node_cache) == ("hit", "node-cache", [str(KEY)])
    assert (second.bytes, second.files, second.unpacked_bytes, second.hits) == (0, 0, 0, [str(KEY)])
    assert second.to_dict()["source"] == "node-cache"
    assert content(target) == before


def test_a_republished_bundle_is_fetched_again_and_others_are_kept(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    publish(make_outdir(tmp_path / "a", KEY, files=files(1)), url)
    publish(make_outdir(tmp_path / "b", OTHER, files=files(2)), url)
    target = tmp_path / "inductor"
    assert preload(url, [str(KEY), str(OTHER)], target).source == "store"
    publish(make_outdir(tmp_path / "c", KEY, files={**files(1), "fxgraph/new/entry": b"new"}), url)
    again = preload(url, [str(KEY), str(OTHER)], target)
    assert (again.result, again.source, again.node_cache) == ("hit", "mixed", [str(OTHER)])
    assert (target / "fxgraph/new/entry").read_bytes() == b"new"
    with open_store(url) as store:
        info = store.head(str(KEY))
    assert info is not None and (read_marker(target, str(KEY)) or {}).get("sha256") == info.sha256


def test_a_marker_of_another_bundle_under_the_key_is_not_trusted(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    publish(make_outdir(tmp_path / "a", KEY, files=files(1)), url)
    target = tmp_path / "inductor"
    preload(url, [str(KEY)], target)
    with open_store(url) as store, store.get(str(KEY)) as stream:
        data = stream.read()
    with open_store(url) as store:  # the same bytes again: same sha256, still a node-cache hit
        store.put(str(KEY), io.BytesIO(data))
    assert preload(url, [str(KEY)], target).source == "node-cache"
    marker = target / ".compilecache" / "bundles"
    next(marker.iterdir()).write_text(json.dumps({"key": str(KEY), "sha256": "0" * 64, "size": 1}))
    assert preload(url, [str(KEY)], target).source == "store"


_PRELOAD = [sys.executable, "-m", "cachelib.cli", "preload", "--deadline", "120"]


def test_concurrent_preloads_into_one_directory_fetch_once_and_leave_one_whole_tree(tmp_path: Path) -> None:
    """Four preload processes start together on the same node cache: one fetches, the others wait
    for it and find the bundle complete; the tree is whole and no staging is left."""
    url = f"file://{tmp_path / 'store'}"
    wanted = files(3, count=200)  # 12.5 MiB: long enough for the four to overlap
    publish(make_outdir(tmp_path / "out", KEY, files=wanted), url)
    target = tmp_path / "node" / "inductor"
    procs = [
        subprocess.Popen(
            [*_PRELOAD, "--store", url, "--key", str(KEY), "--target", str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(4)
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        results.append(last_json(stdout))
    assert [r["result"] for r in results] == ["hit"] * 4
    assert sorted(r["source"] for r in results) == ["node-cache", "node-cache", "node-cache", "store"]
    assert sum(1 for r in results if r["bytes"] > 0) == 1
    found = tree(target)
    for rel, data in wanted.items():
        assert found[rel] == hashlib.sha256(data).hexdigest()
    leftovers = [p for d in (target, target.parent) for p in d.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert leftovers == []


@pytest.mark.parametrize("share", ["group", "all"])
def test_concurrent_preloads_of_different_bundles_merge(tmp_path: Path, share: str) -> None:
    url = f"file://{tmp_path / 'store'}"
    publish(make_outdir(tmp_path / "a", KEY, files=files(4)), url)
    publish(make_outdir(tmp_path / "b", OTHER, files={**files(5), **{"shared/same": b"same"}}), url)
    target = tmp_path / "inductor"
    procs = [
        subprocess.Popen(
            [*_PRELOAD, "--store", url, "--key", str(key), "--target", str(target), "--share", share],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for key in (KEY, OTHER, KEY, OTHER)
    ]
    outputs = [last_json(proc.communicate(timeout=300)[0]) for proc in procs]
    assert all(o["result"] == "hit" and o["share"] == share for o in outputs)
    assert sorted(o["source"] for o in outputs) == ["node-cache", "node-cache", "store", "store"]
    assert read_marker(target, str(KEY)) is not None and read_marker(target, str(OTHER)) is not None
    assert (target / "shared/same").read_bytes() == b"same"
    assert os.stat(target).st_mode & 0o7777 == (0o2775 if share == "group" else 0o777)


def test_a_shared_preload_reopens_what_an_earlier_app_of_another_uid_left() -> None:
    """A node cache outlives its pods: the first app (uid 1000) made lock files 0644 and a directory at its
    umask; the next pod's preload (root, --share all) opens them again, so an app of uid 1001 can lock."""
    if os.geteuid() != 0:
        pytest.skip("needs root to play two app uids")
    tmp_path = Path(tempfile.mkdtemp(prefix="compilecache-node-"))  # other uids must reach it
    tmp_path.chmod(0o755)
    try:
        _reopen_for_another_uid(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _reopen_for_another_uid(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    key = make_key(name="node")
    publish(make_outdir(tmp_path / "out", key, files=files(3, count=2)), url)
    target = tmp_path / "node" / "inductor"
    assert preload(url, [str(key)], target, share="all").result == "hit"
    lock, made = target / "locks" / "abc.lock", target / "fxgraph" / "zz"
    lock.write_text("")
    made.mkdir()
    for path, mode in ((lock, 0o644), (made, 0o755)):
        os.chown(path, 1000, 1000)
        path.chmod(mode)
    second = preload(url, [str(key)], target, share="all")
    assert second.result == "hit" and second.source == "node-cache"
    assert lock.stat().st_mode & 0o777 == 0o666 and made.stat().st_mode & 0o777 == 0o777
    opened = subprocess.run(["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "--", "sh", "-c",
                             f"echo > {lock} && touch {made}/entry"], capture_output=True, text=True)
    assert opened.returncode == 0, opened.stderr
