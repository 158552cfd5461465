"""The preloader: key resolution, hit / miss / error results, exit codes, termination log, limits."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from cachelib.bundle import CACHEDIR_PART, PREAMBLE
from cachelib.bundlereader import read_header
from cachelib.keyformat import CacheKey, select_keys, version_matches
from cachelib.preload import PreloadFailed, choose_gpu, preload
from cachelib.publish import publish
from cachelib.stores import open_store
from cachelib.unpack import RUNTIME_DIRS
from tests.cachelib.helpers import ROOT, content, last_json, make_key, make_outdir, run_cli, tree
from testsupport.servers import free_port

H100 = make_key()
A100 = make_key(gpu="nvidia-a100-sxm4-80gb", capability="sm80")
OLD_TORCH = make_key(torch="2.12.0+cu128")
CPU = make_key(gpu="cpu", capability="cpu", torch="2.13.0+cpu", triton="none", cuda="none")
EMPTY_CACHE_DIR = dict.fromkeys(RUNTIME_DIRS, "dir")
"""What a preload that installed nothing leaves: the directories torch writes at run time, empty."""


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A file store holding four variants of cache team-a/llama, each with distinct files."""
    url = f"file://{tmp_path / 'store'}"
    for index, key in enumerate((H100, A100, OLD_TORCH, CPU)):
        files = {f"fxgraph/{key.gpu}/{key.torch}": f"graph {index}".encode(), "shared/same": b"identical"}
        publish(make_outdir(tmp_path / f"out{index}", key, files=files), url)
    return url


# -- pure parts -----------------------------------------------------------------------------------
def test_version_matching() -> None:
    assert version_matches("2.13.0+cu128", None)
    assert version_matches("2.13.0+cu128", "2.13.0")
    assert version_matches("2.13.0+cu128", "2.13.0+cu128")
    assert not version_matches("2.13.0+cu128", "2.13.0+cu126")
    assert not version_matches("2.13.0", "2.13")


def test_select_keys_by_gpu_and_versions() -> None:
    every = [H100, A100, OLD_TORCH, CPU]
    assert select_keys(every) == sorted(every)
    assert select_keys(every, gpu="NVIDIA-H100-80GB-HBM3") == sorted([H100, OLD_TORCH])
    assert select_keys(every, gpu="nvidia-h100-80gb-hbm3", versions={"torch": "2.13.0"}) == [H100]
    assert select_keys(every, versions={"cuda": "none"}) == [CPU]
    with pytest.raises(ValueError, match="unknown version field"):
        select_keys(every, versions={"numpy": "2"})


def test_gpu_choice_order() -> None:
    assert choose_gpu("NVIDIA-H100-80GB-HBM3", {"COMPILECACHE_GPU": "x"}) == "nvidia-h100-80gb-hbm3"
    assert choose_gpu(None, {"COMPILECACHE_GPU": "NVIDIA A100"}) == "nvidia-a100"
    assert choose_gpu(None, {}) is None


# -- the API --------------------------------------------------------------------------------------
def test_hit_by_key(store: str, tmp_path: Path) -> None:
    result = preload(store, [str(H100)], tmp_path / "cache")
    assert (result.result, result.keys, result.hits, result.reason) == ("hit", [str(H100)], [str(H100)], None)
    assert result.bytes > 0 and result.files == 2 and result.unpacked_bytes > 0
    assert tree(tmp_path / "cache")[f"fxgraph/{H100.gpu}/{H100.torch}"]


def test_cache_listing_with_gpu_and_versions(store: str, tmp_path: Path) -> None:
    result = preload(store, cache="team-a/llama", target=tmp_path / "a", gpu="NVIDIA-H100-80GB-HBM3",
                     versions={"torch": "2.13.0"})  # fmt: skip
    assert result.result == "hit" and result.keys == [str(H100)] and result.gpu == "nvidia-h100-80gb-hbm3"


def test_every_variant_is_merged_without_a_gpu(store: str, tmp_path: Path) -> None:
    result = preload(store, cache="team-a/llama", target=tmp_path / "all", env={})
    assert result.result == "hit"
    assert sorted(result.hits) == sorted(str(k) for k in (H100, A100, OLD_TORCH, CPU))
    found = tree(tmp_path / "all")
    assert sum(1 for path in found if path.startswith("fxgraph/") and found[path] != "dir") == 4
    assert (tmp_path / "all" / "shared" / "same").read_bytes() == b"identical"


def test_gpu_from_the_environment(store: str, tmp_path: Path) -> None:
    result = preload(store, cache="team-a/llama", target=tmp_path / "c", env={"COMPILECACHE_GPU": "cpu"})
    assert result.hits == [str(CPU)]


def test_miss_when_no_variant_matches(store: str, tmp_path: Path) -> None:
    result = preload(store, cache="team-a/llama", target=tmp_path / "m", gpu="NVIDIA-B200")
    assert result.result == "miss" and result.keys == []
    assert "nvidia-b200" in (result.reason or "") and "4 in the store" in (result.reason or "")
    assert content(tmp_path / "m") == EMPTY_CACHE_DIR
    with pytest.raises(PreloadFailed) as caught:
        preload(store, cache="team-a/llama", target=tmp_path / "m", gpu="NVIDIA-B200", strict=True)
    assert caught.value.result.result == "miss"


def test_explicit_key_of_another_gpu_is_filtered(store: str, tmp_path: Path) -> None:
    result = preload(store, [str(H100), str(A100)], tmp_path / "f", gpu="NVIDIA-A100-SXM4-80GB")
    assert result.hits == [str(A100)]


def test_missing_key_is_a_miss(store: str, tmp_path: Path) -> None:
    absent = make_key(name="other")
    result = preload(store, [str(absent)], tmp_path / "x")
    assert result.result == "miss" and str(absent) in (result.reason or "")


def test_corrupt_bundle_is_an_error_and_writes_nothing(store: str, tmp_path: Path) -> None:
    """The last bytes of the cachedir part (zstd's frame checksum) are damaged: every member has been
    extracted to staging when the damage shows, and still nothing reaches the target."""
    with open_store(store) as opened, opened.get(str(H100)) as stream:
        data = bytearray(stream.read())
    _, _, length = PREAMBLE.unpack(data[: PREAMBLE.size])
    header = read_header(io.BytesIO(bytes(data)))
    end = PREAMBLE.size + length + header.part(CACHEDIR_PART).stored_size
    data[end - 4 : end] = bytes(b ^ 0xFF for b in data[end - 4 : end])
    with open_store(store) as opened:
        opened.put(str(H100), io.BytesIO(bytes(data)))
    target = tmp_path / "cache"
    target.mkdir()
    result = preload(store, [str(H100)], target)
    assert result.result == "error"
    assert (result.reason or "").startswith("CorruptPart: part 'cachedir'")
    assert content(target) == EMPTY_CACHE_DIR


def test_max_bytes_refuses_before_writing(store: str, tmp_path: Path) -> None:
    result = preload(store, [str(H100)], tmp_path / "small", max_bytes=100)
    assert result.result == "error" and "--max-bytes" in (result.reason or "")
    assert content(tmp_path / "small") == EMPTY_CACHE_DIR


def test_malformed_key_is_an_error(store: str, tmp_path: Path) -> None:
    result = preload(store, ["cc1/not/a/key"], tmp_path / "k")
    assert result.result == "error" and "InvalidKey" in (result.reason or "")


# -- the command line -------------------------------------------------------------------------------
def test_cli_hit_prints_one_json_line_and_writes_the_termination_log(store: str, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    proc = run_cli("preload", "--store", store, "--key", str(H100), "--target", str(tmp_path / "t"),
                   env={"COMPILECACHE_TERMINATION_LOG": str(log)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    payload = json.loads(lines[0])
    assert {"result", "key", "keys", "gpu", "bytes", "seconds", "reason"} <= set(payload)
    assert payload["result"] == "hit" and payload["key"] == str(H100)
    assert json.loads(log.read_text()) == payload


@pytest.mark.parametrize(("strict", "code"), [(False, 0), (True, 1)])
def test_cli_miss_exit_codes(store: str, tmp_path: Path, strict: bool, code: int) -> None:
    args = ["preload", "--store", store, "--cache", "team-a/nothing", "--target", str(tmp_path / "t")]
    proc = run_cli(*args, *(["--strict"] if strict else []))
    assert proc.returncode == code
    assert last_json(proc.stdout)["result"] == "miss"


@pytest.mark.parametrize(("strict", "code"), [(False, 0), (True, 1)])
def test_cli_store_outage_is_a_miss(tmp_path: Path, strict: bool, code: int) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = run_cli("preload", "--store", url, "--key", str(H100), "--target", str(tmp_path / "t"),
                   *(["--strict"] if strict else []))  # fmt: skip
    assert proc.returncode == code
    payload = last_json(proc.stdout)
    assert payload["result"] == "miss" and payload["reason"].startswith("store unavailable")


def test_cli_error_exit_codes(store: str, tmp_path: Path) -> None:
    args = ["preload", "--store", store, "--key", str(H100), "--target", str(tmp_path / "t"), "--max-bytes", "1K"]
    assert run_cli(*args).returncode == 0
    proc = run_cli(*args, "--strict")
    assert proc.returncode == 1 and last_json(proc.stdout)["result"] == "error"


def test_cli_usage_error_exits_2(tmp_path: Path) -> None:
    proc = run_cli("preload", "--store", "file:///x", "--target", str(tmp_path), "--max-bytes", "lots")
    assert proc.returncode == 2 and "--max-bytes" in proc.stderr


def test_preloader_never_imports_torch(store: str, tmp_path: Path) -> None:
    code = (
        "import sys; from cachelib.cli import main; "
        f"rc = main(['preload', '--store', {store!r}, '--cache', 'team-a/llama', "
        f"'--target', {str(tmp_path / 't')!r}]); "
        "assert rc == 0; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "COMPILECACHE_TERMINATION_LOG": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout)["result"] == "hit"


def test_cached_keys_parse(store: str) -> None:
    with open_store(store) as opened:
        assert sorted(CacheKey.parse(i.key) for i in opened.list("cc1/")) == sorted([H100, A100, OLD_TORCH, CPU])


def test_unsafe_member_in_a_stored_bundle_is_an_error_naming_it(tmp_path: Path) -> None:
    """A bundle whose tar escapes the target (with plenty of data after it): refused, nothing written."""
    import tarfile

    from cachelib.bundle import MEGACACHE_PART, write_bundle_file

    def evil_tar(sink: object) -> None:
        with tarfile.open(fileobj=sink, mode="w|") as tar:  # type: ignore[call-overload]
            for name, size in (("../escaped", 10), ("big", 16 * 1024 * 1024)):
                info = tarfile.TarInfo(name)
                info.size = size
                tar.addfile(info, io.BytesIO(os.urandom(size)))

    parts = [(CACHEDIR_PART, evil_tar), (MEGACACHE_PART, lambda s: None)]
    write_bundle_file(tmp_path / "evil.ccb", key=H100, parts=parts, versions={}, created="now", producer="test",
                      job_id="", result={})  # fmt: skip
    url = f"file://{tmp_path / 'store'}"
    publish(tmp_path / "evil.ccb", url)
    target = tmp_path / "cache"
    target.mkdir()
    result = preload(url, [str(H100)], target)
    assert result.result == "error"
    assert result.reason == "UnsafeMember: member '../escaped': '..' escapes the target"
    assert content(target) == EMPTY_CACHE_DIR and not (tmp_path / "escaped").exists()


# -- who may write the cache ---------------------------------------------------------------------------
def test_share_is_applied_and_reported(store: str, tmp_path: Path) -> None:
    result = preload(store, [str(H100)], tmp_path / "c", share="all")
    assert (result.result, result.share, result.owner) == ("hit", "all", None)
    assert {os.stat(p).st_mode & 0o777 for p in (tmp_path / "c").rglob("*") if p.is_dir()} == {0o777}
    assert preload(store, [str(H100)], tmp_path / "d").share == "group"  # the default


def test_cli_owner_hands_the_tree_over(store: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_CHOWN)")
    target = tmp_path / "cache"
    proc = run_cli("preload", "--store", store, "--key", str(H100), "--target", str(target), "--owner", "4321:8765")
    assert proc.returncode == 0, proc.stderr
    payload = last_json(proc.stdout)
    assert payload["result"] == "hit" and payload["owner"] == "4321:8765"
    everything = [target, *target.rglob("*")]
    assert {(p.lstat().st_uid, p.lstat().st_gid) for p in everything} == {(4321, 8765)}
    assert (target / "locks").is_dir()


def test_cli_owner_without_cap_chown_is_an_error_result(store: str, open_dir: Path) -> None:
    """As a uid without CAP_CHOWN: a clear error result before anything is fetched, exit 0, and
    still a cache directory the workload can write (without the owner)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    import shutil
    import subprocess

    shutil.copytree(store.removeprefix("file://"), open_dir / "store")
    (open_dir / "vol").mkdir(mode=0o777)
    (open_dir / "vol").chmod(0o777)
    target = open_dir / "vol" / "inductor"
    proc = subprocess.run(
        ["setpriv", "--reuid", "65532", "--regid", "65532", "--clear-groups", sys.executable, "-m", "cachelib.cli",
         "preload", "--store", f"file://{open_dir / 'store'}", "--key", str(H100), "--target", str(target),
         "--owner", "1000:1000"],
        capture_output=True, text=True, cwd=ROOT, check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    payload = last_json(proc.stdout)
    assert payload["result"] == "error" and payload["bytes"] == 0
    assert payload["reason"].startswith("OwnershipError: --owner 1000:1000: cannot hand")
    assert "needs CAP_CHOWN" in payload["reason"]
    assert content(target) == EMPTY_CACHE_DIR
    assert {p.stat().st_uid for p in (target, *target.iterdir())} == {65532}


def test_cli_owner_and_share_validation(tmp_path: Path) -> None:
    base = ["preload", "--store", "file:///x", "--key", str(H100), "--target", str(tmp_path)]
    for flags, named in (
        (["--owner", "app"], "--owner"),
        (["--owner", "1:-1"], "--owner"),
        (["--share", "x"], "--share"),
    ):
        proc = run_cli(*base, *flags)
        assert proc.returncode == 2 and named in proc.stderr
