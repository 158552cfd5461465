"""Safe unpacking: unsafe members refused with their name, nothing written on any failure, merges."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cachelib import unpack as unpacking
from tests.cachelib.helpers import ROOT, tree

Member = tuple[tarfile.TarInfo, bytes | None]


def file(name: str, data: bytes = b"data") -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


def make_tar(*members: Member) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def ok() -> None:
    pass


def unpack(
    data: bytes,
    target: Path,
    verify: Callable[[], None] = ok,
    limits: unpacking.Limits | None = None,
    sharing: unpacking.Sharing | None = None,
) -> unpacking.UnpackStats:
    return unpacking.unpack_tar_verified(io.BytesIO(data), verify, target, limits, sharing=sharing)


@pytest.fixture(params=["absent", "empty", "populated"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The target in each state a pod can hand us: not there yet, an empty emptyDir, already filled."""
    path = tmp_path / "cache"
    if request.param != "absent":
        path.mkdir()
    if request.param == "populated":
        (path / "existing").write_bytes(b"keep me")
    return path


def snapshot(path: Path) -> dict[str, str] | None:
    return tree(path) if path.exists() else None


def assert_untouched(target: Path, before: dict[str, str] | None) -> None:
    assert snapshot(target) == before
    leftovers = [p for p in target.parent.iterdir() if p.name.startswith(unpacking.STAGING_PREFIX)]
    assert leftovers == []


# -- refusals ------------------------------------------------------------------------------------
UNSAFE = {
    "dotdot": ([file("ok"), file("../evil")], unpacking.UnsafeMember, "'../evil'.*escapes"),
    "dotdot-inner": ([file("a/../../evil")], unpacking.UnsafeMember, "a/../../evil"),
    "absolute": ([file("/etc/evil")], unpacking.UnsafeMember, "'/etc/evil'.*absolute"),
    "symlink-out": ([special("link", tarfile.SYMTYPE, "../../etc/passwd")], unpacking.UnsafeMember, "'link'.*outside"),
    "symlink-absolute": ([special("link", tarfile.SYMTYPE, "/etc/passwd")], unpacking.UnsafeMember, "'link'.*absolute"),
    "hardlink-out": ([special("hard", tarfile.LNKTYPE, "../outside")], unpacking.UnsafeMember, "'hard'.*outside"),
    "hardlink-absolute": ([special("hard", tarfile.LNKTYPE, "/etc/passwd")], unpacking.UnsafeMember,
                          "'hard'.*/etc/passwd"),
    "hardlink-missing": ([special("hard", tarfile.LNKTYPE, "nothere")], unpacking.UnsafeMember,
                         "'hard'.*not an earlier file"),
    "through-symlink": (
        [special("d", tarfile.SYMTYPE, "."), file("d/x")],
        unpacking.UnsafeMember,
        "'d/x'.*below the symlink 'd'",
    ),
    "char-device": ([special("dev/null", tarfile.CHRTYPE)], unpacking.UnsafeMember, "'dev/null'.*device"),
    "block-device": ([special("sda", tarfile.BLKTYPE)], unpacking.UnsafeMember, "'sda'.*device"),
    "fifo": ([special("pipe", tarfile.FIFOTYPE)], unpacking.UnsafeMember, "'pipe'.*FIFO"),
    "duplicate": ([file("same"), file("same", b"other")], unpacking.UnsafeMember, "'same'.*twice"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_member_refused_and_nothing_written(case: str, target: Path) -> None:
    members, error, match = UNSAFE[case]
    before = snapshot(target)
    with pytest.raises(error, match=match):
        unpack(make_tar(*members), target)
    assert_untouched(target, before)
    assert not (target.parent / "evil").exists() and not (target.parent / "outside").exists()


def test_member_over_the_size_limit(target: Path) -> None:
    before = snapshot(target)
    archive = make_tar(file("small", b"x"), file("big", b"y" * 101))
    with pytest.raises(unpacking.MemberTooLarge, match=r"'big'.*101 bytes"):
        unpack(archive, target, limits=unpacking.Limits(max_member_bytes=100))
    assert_untouched(target, before)


def test_total_over_the_limit(target: Path) -> None:
    before = snapshot(target)
    members = [file(f"f{i}", b"z" * 40) for i in range(3)]
    with pytest.raises(unpacking.ArchiveTooLarge, match="'f2'"):
        unpack(make_tar(*members), target, limits=unpacking.Limits(max_member_bytes=100, max_total_bytes=100))
    assert_untouched(target, before)


def test_too_many_members(target: Path) -> None:
    before = snapshot(target)
    with pytest.raises(unpacking.ArchiveTooLarge, match="more than 2 members"):
        unpack(make_tar(file("a"), file("b"), file("c")), target, limits=unpacking.Limits(max_members=2))
    assert_untouched(target, before)


def test_digest_failure_after_extraction_writes_nothing(target: Path) -> None:
    """verify() runs after the last member: a mismatch there must leave the target as it was."""

    def verify() -> None:
        raise ValueError("digest mismatch")

    before = snapshot(target)
    with pytest.raises(ValueError, match="digest mismatch"):
        unpack(make_tar(file("fxgraph/a", b"1"), file("b", b"2")), target, verify)
    assert_untouched(target, before)


def test_garbage_is_a_corrupt_archive(target: Path) -> None:
    before = snapshot(target)
    with pytest.raises(unpacking.CorruptArchive):
        unpack(b"\x01" * 1024, target)
    assert_untouched(target, before)


# -- success and merges ----------------------------------------------------------------------------
def test_unpacks_files_dirs_and_inner_links(target: Path) -> None:
    existing = snapshot(target) or {}
    data = make_tar(
        file("fxgraph/ab/entry", b"graph"),
        special("emptydir", tarfile.DIRTYPE),
        special("fxgraph/latest", tarfile.SYMTYPE, "ab/entry"),
        special("copy", tarfile.LNKTYPE, "fxgraph/ab/entry"),
        file("./dotted/name", b"n"),
    )
    stats = unpack(data, target)
    found = tree(target)
    assert (target / "fxgraph/ab/entry").read_bytes() == b"graph"
    assert (target / "copy").read_bytes() == b"graph"
    assert found["fxgraph/latest"] == "link:ab/entry"
    assert found["emptydir"] == "dir"
    assert (target / "dotted/name").read_bytes() == b"n"
    assert {k: v for k, v in found.items() if k in existing} == existing
    assert stats.files == 3
    assert [p for p in target.parent.iterdir() if p.name.startswith(unpacking.STAGING_PREFIX)] == []
    assert [p for p in target.iterdir() if p.name.startswith(unpacking.STAGING_PREFIX)] == []


def test_merging_identical_and_conflicting_files(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    unpack(make_tar(file("fxgraph/a", b"first"), file("shared", b"same")), target)
    stats = unpack(make_tar(file("fxgraph/a", b"second"), file("shared", b"same"), file("fxgraph/b", b"new")), target)
    assert (target / "fxgraph/a").read_bytes() == b"first"  # existing content is kept
    assert (target / "fxgraph/b").read_bytes() == b"new"
    assert (stats.installed, stats.identical, stats.conflicts) == (1, 1, 1)


def test_old_unlocked_staging_is_removed_and_a_young_one_kept(tmp_path: Path) -> None:
    """Staging directories without a lock file (left by an older unpacker): removed once old."""
    target = tmp_path / "cache"
    target.mkdir()
    stale, young = target / f"{unpacking.STAGING_PREFIX}999999999-abc", target / f"{unpacking.STAGING_PREFIX}1-young"
    for path in (stale, young):
        path.mkdir()
        (path / "junk").write_bytes(b"x")
    old = time.time() - unpacking.UNLOCKED_STALE_SECONDS - 60
    os.utime(stale, (old, old))
    unpack(make_tar(file("a")), target)
    assert sorted(p.name for p in target.iterdir()) == [young.name, "a"]


def test_modes_are_sane(tmp_path: Path) -> None:
    info, data = file("run.so", b"\x7fELF")
    info.mode = 0o4777  # setuid + world-writable in the archive
    unpack(make_tar((info, data)), tmp_path / "cache")
    mode = os.stat(tmp_path / "cache/run.so").st_mode & 0o7777
    assert mode == 0o755


# -- the tar reader: damaged and unusual archives ------------------------------------------------------
def test_truncated_member_data_is_a_corrupt_archive(target: Path) -> None:
    data = make_tar(file("first", b"1"), file("big", b"b" * 5000))
    cut = data.index(b"b" * 5000) + 100  # inside big's data
    before = snapshot(target)
    with pytest.raises(unpacking.CorruptArchive, match=r"'big'.*ends inside its data"):
        unpack(data[:cut], target)
    assert_untouched(target, before)


def test_truncated_header_is_a_corrupt_archive(target: Path) -> None:
    data = make_tar(file("first", b"1"), file("second", b"2"))
    before = snapshot(target)
    with pytest.raises(unpacking.CorruptArchive, match=r"ends inside a header"):
        unpack(data[: 2 * 512 + 100], target)  # the header and data of "first", then part of a header
    assert_untouched(target, before)


def test_bad_header_checksum_is_a_corrupt_archive(target: Path) -> None:
    data = bytearray(make_tar(file("ok", b"1"), file("second", b"2")))
    second = data.index(b"second")
    data[second] ^= 0x20  # flip a bit of the name: the checksum no longer matches
    before = snapshot(target)
    with pytest.raises(unpacking.CorruptArchive, match=r"bad checksum"):
        unpack(bytes(data), target)
    assert_untouched(target, before)


def test_empty_stream_is_a_corrupt_archive(target: Path) -> None:
    with pytest.raises(unpacking.CorruptArchive, match=r"empty"):
        unpack(b"", target)


def test_archive_without_end_blocks_is_read_to_its_last_member(tmp_path: Path) -> None:
    data = make_tar(file("a", b"x" * 700))
    unpack(data[: 512 * 3], tmp_path / "cache")  # the header, then the data padded to whole blocks
    assert (tmp_path / "cache/a").read_bytes() == b"x" * 700


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_each_tar_format(fmt: int, tmp_path: Path) -> None:
    deep = "/".join(["directory-with-a-long-name"] * 5) + "/file.py"  # over 100 bytes
    ustar = fmt == tarfile.USTAR_FORMAT  # ustar splits long names into prefix and name; links stay short
    link_name, link_target = (
        ("links/short", "../directory-with-a-long-name") if ustar else ("links/" + "l" * 120, "../" + deep)
    )
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        info, data = file(deep, b"source")
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(link_name)
        link.type = tarfile.SYMTYPE
        link.linkname = link_target
        tar.addfile(link)
    unpack(out.getvalue(), tmp_path / "cache")
    assert (tmp_path / "cache" / deep).read_bytes() == b"source"
    assert os.readlink(tmp_path / "cache" / link_name) == link_target


def test_pax_global_header_applies_to_the_members_after_it(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"mtime": "1000.5"}) as tar:
        info, data = file("a", b"1")
        tar.addfile(info, io.BytesIO(data))
    unpack(out.getvalue(), tmp_path / "cache")
    assert os.stat(tmp_path / "cache/a").st_mtime == 1000.5


def test_pax_path_cannot_smuggle_an_unsafe_name(target: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = file("harmless", b"x")
        info.pax_headers = {"path": "../evil"}
        tar.addfile(info, io.BytesIO(data))
    before = snapshot(target)
    with pytest.raises(unpacking.UnsafeMember, match=re.escape("'../evil'")):
        unpack(out.getvalue(), target)
    assert_untouched(target, before)


def test_sparse_and_unknown_member_types_are_refused(target: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = file("sparse", b"x")
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(unpacking.UnsafeMember, match=r"'sparse'.*sparse"):
        unpack(out.getvalue(), target)
    with pytest.raises(unpacking.UnsafeMember, match=r"'contig'.*unsupported member type b'V'"):
        unpack(make_tar(special("contig", b"V")), target)


def test_oversized_extended_header_is_refused(target: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = file("a", b"1")
        info.pax_headers = {"comment": "c" * 70_000}
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(unpacking.CorruptArchive, match=r"extended header.*over"):
        unpack(out.getvalue(), target)


def test_malformed_pax_record_is_a_corrupt_archive(target: Path) -> None:
    data = bytearray(make_tar(file("n" * 120, b"1")))  # the long name needs a pax record
    record = data.index(b" path=")
    data[record - 3 : record] = b"999"  # a record length past the header's end
    block = data[:512]
    block[148:156] = b" " * 8
    data[148:156] = b"%06o\x00 " % sum(block)
    with pytest.raises(unpacking.CorruptArchive, match=r"pax header.*malformed"):
        unpack(bytes(data), target)


def test_base256_sizes_are_read(tmp_path: Path) -> None:
    """GNU tar writes numbers that do not fit the octal field in base-256; the reader decodes them."""
    from cachelib.unpack import parse_header

    block = bytearray(make_tar(file("a", b"1"))[1024:1536])  # the ustar header after the pax one
    block[124:136] = b"\x80" + (5).to_bytes(11, "big")
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    assert parse_header(bytes(block), 0).size == 5


def test_large_members_cross_the_reader_buffer(tmp_path: Path) -> None:
    """Members larger than the reader's buffer, and headers that straddle two buffer fills."""
    members = [file(f"m{i}", os.urandom(n)) for i, n in enumerate([3 * 1024 * 1024 + 7, 1, 511, 512, 513, 2 * 1024**2])]
    unpack(make_tar(*members), tmp_path / "cache")
    for info, data in members:
        assert (tmp_path / "cache" / info.name).read_bytes() == data


# -- who may write the tree -----------------------------------------------------------------------
def modes(root: Path) -> dict[str, int]:
    """rel path -> permission bits (setgid included) of everything under root, the root as '.'."""
    found = {".": os.stat(root).st_mode & 0o7777}
    for path in sorted(root.rglob("*")):
        if not path.is_symlink():
            found[path.relative_to(root).as_posix()] = os.stat(path).st_mode & 0o7777
    return found


SHARED_MODES = {
    # share: (directory, the archive's 0600 file, its 4777 file)
    "owner": (0o755, 0o600, 0o755),  # the archive's bits, within 0755
    "group": (0o2775, 0o664, 0o775),
    "all": (0o777, 0o666, 0o777),
}


@pytest.mark.parametrize("share", sorted(SHARED_MODES))
@pytest.mark.parametrize("state", ["absent", "existing"])
def test_share_sets_the_modes_of_every_directory_and_file(share: str, state: str, tmp_path: Path) -> None:
    """Directories (the root, implicit parents, explicit entries) and files get the share's modes,
    whatever the umask and whether the tree is renamed into place or merged."""
    target = tmp_path / "cache"
    if state == "existing":
        target.mkdir(mode=0o700)
    run = special("bin", tarfile.DIRTYPE)
    exe, exe_data = file("bin/run.so", b"\x7fELF")
    exe.mode = 0o4777  # setuid + world-writable in the archive: never kept as such
    plain, plain_data = file("fxgraph/ab/cd/entry", b"graph")
    plain.mode = 0o600
    old_umask = os.umask(0o077)
    try:
        unpack(make_tar(run, (exe, exe_data), (plain, plain_data)), target, sharing=unpacking.Sharing(share))
    finally:
        os.umask(old_umask)
    directory, plain_mode, exe_mode = SHARED_MODES[share]
    assert modes(target) == {
        ".": directory, "bin": directory, "bin/run.so": exe_mode, "fxgraph": directory, "fxgraph/ab": directory,
        "fxgraph/ab/cd": directory, "fxgraph/ab/cd/entry": plain_mode,
    }  # fmt: skip


def test_default_sharing_keeps_owner_only_write(tmp_path: Path) -> None:
    info, data = file("run.so", b"\x7fELF")
    info.mode = 0o4777
    unpack(make_tar((info, data)), tmp_path / "cache")
    assert modes(tmp_path / "cache") == {".": 0o755, "run.so": 0o755}


def test_owner_hands_the_tree_over(tmp_path: Path) -> None:
    """Run as root here (CAP_CHOWN): every path, links included, belongs to the given uid/gid."""
    if os.geteuid() != 0:
        pytest.skip("needs root (CAP_CHOWN)")
    target = tmp_path / "cache"
    data = make_tar(file("a/b/c", b"1"), special("a/link", tarfile.SYMTYPE, "b/c"), special("d", tarfile.DIRTYPE))
    unpack(data, target, sharing=unpacking.Sharing("group", owner=(4321, 8765)))
    owners = {p.relative_to(target).as_posix(): (p.lstat().st_uid, p.lstat().st_gid) for p in target.rglob("*")}
    owners["."] = (target.stat().st_uid, target.stat().st_gid)
    assert set(owners.values()) == {(4321, 8765)}, owners
    assert modes(target)["a/b"] == 0o2775  # chown does not cost the setgid bit


def test_owner_without_cap_chown_is_refused_before_anything_is_written(open_dir: Path) -> None:
    """A preload that may not chown says so (and why) before it writes anything."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    open_dir.chmod(0o777)
    code = (
        "import sys; from pathlib import Path; from cachelib.unpack import OwnershipError, check_can_own\n"
        f"try: check_can_own(Path({str(open_dir)!r}), (0, 0))\n"
        "except OwnershipError as exc: print(exc); sys.exit(3)\n"
    )
    proc = subprocess.run(["setpriv", "--reuid", "65532", "--regid", "65532", "--clear-groups", sys.executable,
                           "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "--owner 0:0" in proc.stdout and "CAP_CHOWN" in proc.stdout
    assert list(open_dir.iterdir()) == []


def test_lock_files_and_bookkeeping_are_never_taken_from_an_archive(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    stats = unpack(
        make_tar(
            file("locks/abc.lock"), file("locks/other"), file("fxgraph/x.lock"), file(".compilecache/bundles/k.json"),
            file(".compilecache-preload.json"), file("fxgraph/entry", b"kept"),
        ),
        target,
    )  # fmt: skip
    assert tree(target) == {"fxgraph": "dir", "fxgraph/entry": tree(target)["fxgraph/entry"]}
    assert stats.skipped == 5 and stats.files == 1


def test_prepare_cache_dir_creates_what_torch_writes_at_run_time(tmp_path: Path) -> None:
    target = tmp_path / "vol" / "inductor"
    unpacking.prepare_cache_dir(target, unpacking.Sharing("group"))
    assert modes(target) == {".": 0o2775, **dict.fromkeys(unpacking.RUNTIME_DIRS, 0o2775)}
    (target / "locks").chmod(0o700)  # an older preload's directory of ours: adopted
    unpacking.prepare_cache_dir(target, unpacking.Sharing("all"))
    assert set(modes(target).values()) == {0o777}


# -- staging locks: stale staging of killed unpackers, in any PID namespace ------------------------------
_HOLD_STAGING = """
import os, sys, time
from pathlib import Path
from cachelib.unpack import make_staging
staging = make_staging(Path(sys.argv[1]))
(staging.path / "half-written").write_bytes(b"x" * 1000)
print(os.getpid(), staging.path, flush=True)
time.sleep(600)
"""


def wait_until_unlocked(lock: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    fd = os.open(lock, os.O_RDONLY)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{lock} still locked after {timeout} s"
                time.sleep(0.05)
    finally:
        os.close(fd)


def _start_holder(target: Path, *prefix: str) -> tuple[subprocess.Popen[str], int, Path]:
    proc = subprocess.Popen([*prefix, sys.executable, "-c", _HOLD_STAGING, str(target)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    pid, path = proc.stdout.readline().split()
    return proc, int(pid), Path(path)


def test_staging_of_a_killed_unpacker_in_another_pid_namespace_is_removed(tmp_path: Path) -> None:
    """The unpacker runs as PID 1 of its own PID namespace (as in every pod) and is killed mid-unpack.
    Its staging directory is removed by the next unpack, because its lock is free; a PID check
    would have seen PID 1 alive and kept it forever."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a PID namespace")
    target = tmp_path / "cache"
    target.mkdir()
    proc, pid, staging = _start_holder(target, "unshare", "--pid", "--fork", "--kill-child")
    try:
        assert pid == 1 and staging.is_dir() and staging.parent == target
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until_unlocked(Path(f"{staging}{unpacking.LOCK_SUFFIX}"))  # the namespace's PID 1 dies a moment later
        assert staging.is_dir()  # left behind by the killed unpacker
        unpack(make_tar(file("a")), target)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert sorted(p.name for p in target.iterdir()) == ["a"]


def test_staging_of_a_live_unpacker_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.mkdir()
    proc, _, staging = _start_holder(target)
    try:
        unpack(make_tar(file("a")), target)
        assert staging.is_dir() and (staging / "half-written").exists()
        assert unpacking.remove_stale_staging(target) == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    wait_until_unlocked(Path(f"{staging}{unpacking.LOCK_SUFFIX}"))
    assert unpacking.remove_stale_staging(target) == [staging.name]
    assert sorted(p.name for p in target.iterdir()) == ["a"]


def test_a_closed_gate_calls_the_unpack_off_before_it_installs(tmp_path: Path) -> None:
    gate = unpacking.Gate("deadline passed")
    target = tmp_path / "cache"

    def close_then_verify() -> None:
        gate.close()

    with pytest.raises(unpacking.Cancelled, match="deadline passed"):
        unpacking.unpack_tar_verified(io.BytesIO(make_tar(file("a"))), close_then_verify, target, gate=gate)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == []


# -- node caches: markers and the per-bundle lock ----------------------------------------------------------
def test_marker_is_written_with_the_tree_and_read_back(target: Path) -> None:
    marker = {"key": "cc1/k", "sha256": "a" * 64, "size": 10}
    stats = unpacking.unpack_tar_verified(io.BytesIO(make_tar(file("x"))), ok, target, marker=marker)
    found = unpacking.completed(target, "cc1/k", "a" * 64, 10)
    assert found is not None and found["files"] == stats.files == 1
    assert unpacking.completed(target, "cc1/k", "b" * 64, 10) is None  # another bundle under the same key
    assert unpacking.completed(target, "cc1/k", None, 10) is None  # a store that records no digest: no shortcut
    assert unpacking.completed(target, "cc1/other", "a" * 64, 10) is None


def test_bundle_lock_waits_for_its_holder_and_honours_the_gate(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    code = (
        "import sys, time; from pathlib import Path; from cachelib.unpack import Sharing, bundle_lock\n"
        f"with bundle_lock(Path({str(target)!r}), 'cc1/k', Sharing()):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        gate = unpacking.Gate("deadline")
        waited: list[bool] = []
        timer = threading.Timer(0.5, gate.close)
        timer.start()
        with (
            pytest.raises(unpacking.Cancelled),
            unpacking.bundle_lock(target, "cc1/k", unpacking.Sharing(), gate=gate, on_wait=lambda: waited.append(True)),
        ):
            pass
        assert waited == [True]
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with unpacking.bundle_lock(target, "cc1/k", unpacking.Sharing()):  # free once its holder is gone
        pass
