"""Bounded and fail-open preloads: compression-ratio limit, overall deadline, unexpected failures.

Each against real parts: bundles built with the real writer, a real redis-server frozen with
SIGSTOP, a loopback TCP server that accepts and never answers, the CLI in a fresh process.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cachelib.bundle import CACHEDIR_PART, MEGACACHE_PART, PREAMBLE, HashingWriter, write_bundle_file
from cachelib.preload import DEFAULT_MAX_RATIO, PreloadFailed, load, preload
from cachelib.publish import publish
from cachelib.stores import open_store
from cachelib.unpack import RUNTIME_DIRS, STAGING_PREFIX
from tests.cachelib.broken_store import BrokenStore
from tests.cachelib.helpers import ROOT, content, last_json, make_key, make_outdir, run_cli
from testsupport.servers import LOOPBACK, RedisServer, start_redis

KEY = make_key()
BOMB_BYTES = 128 * 1024 * 1024
EMPTY_CACHE_DIR = dict.fromkeys(RUNTIME_DIRS, "dir")


def no_staging(*directories: Path) -> bool:
    return not any(p.name.startswith(STAGING_PREFIX) for d in directories if d.is_dir() for p in d.iterdir())


# -- bundles ------------------------------------------------------------------------------------------
def zeros_tar(sink: HashingWriter) -> None:
    """A tar holding one file of BOMB_BYTES zeros: zstd packs it into a few KB."""
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        info = tarfile.TarInfo("fxgraph/zeros")
        info.size = BOMB_BYTES
        tar.addfile(info, _Zeros(BOMB_BYTES))


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real bundle whose cachedir part is a few KB that inflate to 128 MiB (header honest)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.ccb"
    write_bundle_file(path, key=KEY, parts=[(CACHEDIR_PART, zeros_tar), (MEGACACHE_PART, lambda s: None)],
                      versions={}, created="now", producer="test", job_id="", result={})  # fmt: skip
    return path


def lying_bundle(bomb: Path, out: Path) -> Path:
    """The bomb, with a header that claims a stored size 12x smaller than the content: its declared
    ratio passes any limit, and only the streaming check stops it."""
    data = bomb.read_bytes()
    _, version, length = PREAMBLE.unpack(data[: PREAMBLE.size])
    header = json.loads(data[PREAMBLE.size : PREAMBLE.size + length])
    cachedir, megacache = header["parts"]
    cachedir["stored_size"] = cachedir["size"] // 12
    megacache["offset"] = cachedir["stored_size"]
    encoded = json.dumps(header).encode()
    out.write_bytes(PREAMBLE.pack(b"CCBUNDLE", version, len(encoded)) + encoded + data[PREAMBLE.size + length :])
    return out


def test_declared_ratio_over_the_limit_is_refused_before_anything_is_written(
    bomb: Path, store_url: str, tmp_path: Path
) -> None:
    url = store_url
    with open_store(url) as store, open(bomb, "rb") as stream:
        store.put(str(KEY), stream)
    target = tmp_path / "cache"
    started = time.perf_counter()
    result = preload(url, [str(KEY)], target)
    assert result.result == "error"
    assert (result.reason or "").startswith("RatioExceeded: part 'cachedir'")
    assert f"over the limit of {DEFAULT_MAX_RATIO:g} (--max-ratio)" in (result.reason or "")
    assert result.bytes == 0 and content(target) == EMPTY_CACHE_DIR and no_staging(target, tmp_path)
    assert time.perf_counter() - started < 5  # refused from the header, not after inflating
    assert preload(url, [str(KEY)], tmp_path / "nolimit", max_ratio=None).result == "hit"  # the limit, nothing else


def test_inflation_beyond_the_ratio_while_streaming_is_refused(bomb: Path, store_url: str, tmp_path: Path) -> None:
    url = store_url
    with open_store(url) as store, open(lying_bundle(bomb, tmp_path / "lying.ccb"), "rb") as stream:
        store.put(str(KEY), stream)
    target = tmp_path / "cache"
    target.mkdir()
    result = preload(url, [str(KEY)], target, max_ratio=20)
    assert result.result == "error"
    assert (result.reason or "").startswith("RatioExceeded: part 'cachedir'") and "so far" in (result.reason or "")
    assert content(target) == EMPTY_CACHE_DIR and no_staging(target)


def test_cli_max_ratio_flag_and_its_validation(bomb: Path, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    with open_store(url) as store, open(bomb, "rb") as stream:
        store.put(str(KEY), stream)
    args = ["preload", "--store", url, "--key", str(KEY), "--target", str(tmp_path / "t")]
    proc = run_cli(*args)
    assert proc.returncode == 0 and last_json(proc.stdout)["reason"].startswith("RatioExceeded")
    proc = run_cli(*args, "--max-ratio", "0")
    assert proc.returncode == 0 and last_json(proc.stdout)["result"] == "hit"
    proc = run_cli(*args, "--max-ratio", "0.5")
    assert proc.returncode == 2 and "--max-ratio" in proc.stderr


def test_load_applies_the_ratio_to_the_megacache(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    from cachelib.bundle import RATIO_SLACK

    publish(make_outdir(tmp_path / "out", KEY, megacache=bytes(RATIO_SLACK + 1024 * 1024)), url)
    result = load(url, [str(KEY)], max_ratio=100)
    assert result.result == "error" and (result.reason or "").startswith("RatioExceeded: part 'megacache'")


# -- the deadline -----------------------------------------------------------------------------------
class SilentServer:
    """A loopback TCP server that accepts every connection and never answers (a frozen backend)."""

    def __init__(self) -> None:
        self.sock = socket.create_server((LOOPBACK, 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def silent_url(kind: str, port: int) -> str:
    if kind == "redis":
        return f"redis://{LOOPBACK}:{port}/0?timeout=60"
    return f"s3://bucket/prefix?endpoint=http://{LOOPBACK}:{port}&timeout=60"


@pytest.mark.parametrize("kind", ["redis", "s3"])
@pytest.mark.parametrize(("strict", "code"), [(False, 0), (True, 1)])
def test_deadline_ends_a_preload_held_by_a_server_that_never_answers(
    silent: SilentServer, tmp_path: Path, kind: str, strict: bool, code: int
) -> None:
    log = tmp_path / "termination-log"
    target = tmp_path / "cache"
    started = time.monotonic()
    proc = run_cli("preload", "--store", silent_url(kind, silent.port), "--key", str(KEY), "--target", str(target),
                   "--deadline", "2", *(["--strict"] if strict else []),
                   env={"COMPILECACHE_TERMINATION_LOG": str(log), **_AWS}, timeout=60)  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == code, proc.stderr
    payload = last_json(proc.stdout)
    assert payload["result"] == "error" and payload["deadline"] == 2
    assert payload["reason"].startswith("deadline of 2 s passed while asking the store for cc1/")
    assert json.loads(log.read_text()) == payload
    assert elapsed < 15, f"the preload took {elapsed:.1f} s"  # 2 s, plus starting the interpreter
    assert content(target) == EMPTY_CACHE_DIR and no_staging(target, tmp_path)


_AWS = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}


def test_deadline_while_listing_names_the_stage(silent: SilentServer, tmp_path: Path) -> None:
    result = preload(silent_url("redis", silent.port).replace("timeout=60", "timeout=5&retries=0"),
                     cache="team-a/llama", target=tmp_path / "c", deadline=0.5)  # fmt: skip
    assert result.result == "error" and result.seconds < 3
    assert (result.reason or "").startswith("deadline of 0.5 s passed while listing team-a/llama in the store")


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test alone (it gets frozen); woken up again before it is stopped."""
    with start_redis(tmp_path / "redis") as server:
        try:
            yield server
        finally:
            os.kill(server.process.pid, signal.SIGCONT)


@pytest.mark.slow
def test_deadline_in_the_middle_of_a_fetch_from_a_frozen_redis_leaves_nothing_partial(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """redis-server is stopped (SIGSTOP) while the preload is unpacking: the deadline ends the
    preload with an error, the half-filled staging directory is gone, the target untouched."""
    url = own_redis.store_url(chunk="4K", workers="1")
    files = {f"fxgraph/{i:03d}/entry": os.urandom(64 * 1024) for i in range(256)}  # 16 MiB, 4096 chunks
    publish(make_outdir(tmp_path / "out", KEY, files=files), url)
    target = tmp_path / "vol" / "cache"
    target.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "cachelib.cli", "preload", "--store", url, "--key", str(KEY),
                             "--target", str(target), "--deadline", "4"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        staging = _wait_for_staging(target.parent, proc)
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        assert any(staging.rglob("entry")), "the preload had not started writing yet"
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    payload = last_json(stdout)
    assert payload["result"] == "error" and payload["hits"] == []
    assert payload["reason"].startswith(f"deadline of 4 s passed while fetching and unpacking {KEY}")
    assert not staging.exists() and no_staging(target.parent, target)
    assert content(target) == EMPTY_CACHE_DIR


def _wait_for_staging(directory: Path, proc: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in directory.iterdir():
            if path.name.startswith(STAGING_PREFIX) and path.is_dir() and any(path.rglob("entry")):
                return path
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.002)
    raise AssertionError("no staging directory appeared")


# -- fail open ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("deadline", [None, 5.0])
def test_an_unexpected_exception_is_an_error_result(tmp_path: Path, deadline: float | None) -> None:
    for kwargs in ({"keys": [str(KEY)]}, {"cache": "team-a/llama"}):
        result = preload(BrokenStore(), target=tmp_path / "t", deadline=deadline, **kwargs)  # type: ignore[arg-type]
        assert result.result == "error"
        assert result.reason == "unexpected TypeError: call_with_retry() takes 3 positional arguments but 5 were given"
    with pytest.raises(PreloadFailed):
        preload(BrokenStore(), [str(KEY)], tmp_path / "t", strict=True)
    assert load(BrokenStore(), [str(KEY)]).reason == result.reason


_BROKEN_CLI = """
import sys
import cachelib.preload
from tests.cachelib.broken_store import BrokenStore
cachelib.preload.open_store = lambda url: BrokenStore()
from cachelib.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["preload", "load"])
@pytest.mark.parametrize(("strict", "code"), [(False, 0), (True, 1)])
def test_cli_fails_open_on_an_unexpected_exception(tmp_path: Path, command: str, strict: bool, code: int) -> None:
    log = tmp_path / "termination-log"
    proc = subprocess.run(
        [sys.executable, "-c", _BROKEN_CLI, command, "--store", "redis://x:1/0", "--key", str(KEY),
         "--target", str(tmp_path / "t"), *(["--strict"] if strict else [])],
        capture_output=True, text=True, cwd=ROOT, check=False,
        env={**os.environ, "COMPILECACHE_TERMINATION_LOG": str(log)},
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    payload = last_json(proc.stdout)
    assert payload["result"] == "error" and payload["mode"] == command
    assert payload["reason"].startswith("unexpected TypeError: call_with_retry()")
    assert json.loads(log.read_text()) == payload


def test_cli_without_a_store_is_an_error_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPILECACHE_STORE", raising=False)
    proc = run_cli("preload", "--key", str(KEY), "--target", str(tmp_path / "t"))
    assert proc.returncode == 0
    assert last_json(proc.stdout)["reason"].startswith("no store: give --store URL")


def test_deadline_flag_validation(tmp_path: Path) -> None:
    for bad in ("soon", "-1", "inf"):
        proc = run_cli("preload", "--store", "file:///x", "--key", str(KEY), "--target", str(tmp_path),
                       "--deadline", bad)  # fmt: skip
        assert proc.returncode == 2 and "--deadline" in proc.stderr


def test_the_lying_header_passes_every_header_check(bomb: Path, tmp_path: Path) -> None:
    """Guards the streaming test: its bundle's declared ratio is within the limit it runs with."""
    from cachelib.bundlereader import read_header

    header = read_header(io.BytesIO(lying_bundle(bomb, tmp_path / "l.ccb").read_bytes()))
    part = header.part(CACHEDIR_PART)
    assert part.size > BOMB_BYTES and part.size / part.stored_size < 20


def test_a_small_part_is_never_judged_by_its_ratio(tmp_path: Path) -> None:
    """A warm-up that compiled nothing publishes an empty cache directory: a 10 KiB tar of zeros stored in a
    few bytes (ratio above 400). Parts within the slack of 64 MiB cannot bomb anyone and pass."""
    from cachelib.bundle import RATIO_SLACK, PartInfo, RatioExceeded, check_ratio

    def part(size: int, stored: int) -> PartInfo:
        return PartInfo(CACHEDIR_PART, "zstd", size, stored, 0, "0" * 64, "0" * 64)

    check_ratio(part(10240, 22), DEFAULT_MAX_RATIO)
    with pytest.raises(RatioExceeded, match="over the limit"):
        check_ratio(part(RATIO_SLACK + 1, 1000), DEFAULT_MAX_RATIO)
