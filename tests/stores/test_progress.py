"""Progress bars: formatting, and drawn only on a real terminal (a pseudo-terminal here)."""

from __future__ import annotations

import io
import os
import pty
import select
from collections.abc import Iterator

import pytest

from cachelib.progress import (
    Progress,
    display_label,
    format_bar,
    format_duration,
    human_bytes,
    stderr_bar,
    unwatched,
)
from cachelib.stores import open_store


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(5 * 1024**3) == "5.0 GiB"


def test_format_duration() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(75.2) == "0:01:15"
    assert format_duration(3 * 3600 + 5) == "3:00:05"


def test_format_bar_with_total() -> None:
    line = format_bar("get k", 50 * 1024**2, 100 * 1024**2, 2.0, width=10)
    assert line == "get k [#####-----] 50.0 MiB / 100.0 MiB  25.0 MiB/s  ETA 0:00:02"


def test_format_bar_without_total() -> None:
    assert format_bar("put k", 3 * 1024**2, None, 1.0) == "put k  3.0 MiB  3.0 MiB/s"


def test_not_shown_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("x", 10, stream=out) as bar:
        bar.update(10)
    assert out.getvalue() == "" and not bar.shown


@pytest.fixture
def terminal() -> Iterator[tuple[io.TextIOWrapper, int]]:
    leader, follower = pty.openpty()
    stream = open(follower, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    try:
        yield stream, leader
    finally:
        stream.close()
        os.close(leader)


def read_terminal(leader: int) -> str:
    """Everything written to the terminal so far."""
    out = b""
    while select.select([leader], [], [], 0.2)[0]:
        out += os.read(leader, 65536)
    return out.decode()


def test_shown_on_a_terminal(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, leader = terminal
    with Progress("get k", 2048, stream=stream) as bar:
        bar.update(2048)
    text = read_terminal(leader)
    assert bar.shown
    assert "get k [" in text and "2.0 KiB / 2.0 KiB" in text and text.endswith("\r\n")


def test_disabled_is_silent_on_a_terminal(terminal: tuple[io.TextIOWrapper, int]) -> None:
    stream, _ = terminal
    bar = Progress("x", 1, enabled=False, stream=stream)
    assert not bar.shown


def test_store_transfers_draw_on_a_terminal(
    tmp_path: os.PathLike[str], terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, leader = terminal
    monkeypatch.setattr("sys.stderr", stream)
    store = open_store(f"file://{tmp_path}")
    data = os.urandom(3 * 1024 * 1024)
    with stderr_bar("put k", io.BytesIO(data), len(data)) as watched:
        store.put("k", watched, len(data))
    with store.get("k") as fh, stderr_bar("get k", fh, len(data)) as watched:
        assert watched.read() == data
    text = read_terminal(leader)
    assert "put k [" in text and "get k [" in text
    assert "3.0 MiB / 3.0 MiB" in text


def test_a_watched_stream_stays_seekable_and_the_bar_follows(
    terminal: tuple[io.TextIOWrapper, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store may hash a local file ahead and seek back (S3 multipart metadata): the bar follows the position."""
    stream, leader = terminal
    monkeypatch.setattr("sys.stderr", stream)
    source = io.BytesIO(b"x" * 4096)
    with stderr_bar("put k", source, 4096) as watched:
        assert watched.seekable() and watched.read() == b"x" * 4096
        assert watched.seek(1024) == 1024 and watched.tell() == 1024
        assert watched.read(10) == b"x" * 10
    assert not source.closed
    assert "1.0 KiB / 4.0 KiB" in read_terminal(leader)


def test_unwatched_and_off_a_terminal_the_stream_is_the_same_object() -> None:
    source = io.BytesIO(b"abc")
    with unwatched("k", source, 3) as same:
        assert same is source
    with stderr_bar("k", source, 3) as same:  # pytest's stderr is not a terminal
        assert same is source
def test_a_key_label_shows_the_cache_and_gpu() -> None:
    key = "cc1/team-a/llama/0123456789abcdef/fedcba9876543210/nvidia-h100-80gb-hbm3/sm90/torch-2.13.0/triton-3.6.0/cuda-12.8/py-3.11"  # noqa: E501
    assert display_label(f"get {key}") == "get team-a/llama nvidia-h100-80gb-hbm3"
    assert display_label("get k") == "get k" and display_label("copying") == "copying"


@pytest.mark.parametrize("columns", [100, 80, 60, 40, 20])
def test_format_bar_fits_the_terminal(columns: int) -> None:
    label = "get team-a/a-rather-long-cache-name-for-a-model nvidia-h100-80gb-hbm3"
    for total in (100 * 1024**2, None):
        line = format_bar(label, 50 * 1024**2, total, 2.0, columns=columns)
        assert len(line) <= columns - 1, line
    assert format_bar("get k", 1, 2, 1.0, columns=100).startswith("get k [" + "#" * 15 + "-" * 15 + "]")


def test_format_bar_narrows_the_bar_before_cutting_the_label() -> None:
    line = format_bar("get team-a/llama cpu", 50 * 1024**2, 100 * 1024**2, 2.0, columns=85)
    assert line.startswith("get team-a/llama cpu [" + "#" * 7 + "-" * 8 + "] 50.0 MiB") and len(line) == 84
    cut = format_bar("get " + "x" * 80, 50 * 1024**2, 100 * 1024**2, 2.0, columns=70)
    assert cut.startswith("get xx") and "…" in cut and len(cut) == 69 and "[#####-----]" in cut
