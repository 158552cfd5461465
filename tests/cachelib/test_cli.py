"""The compilecache command line: help a newcomer can read, inspect, ls, gc, one-line errors."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cachelib.cli import main
from cachelib.cli.parser import build_parser
from cachelib.inventory import Entry, format_age, parse_duration, plan_gc
from cachelib.publish import pack, publish
from cachelib.stores import open_store
from cachelib.units import parse_size
from tests.cachelib.helpers import make_key, make_outdir, run_cli

SUBCOMMANDS = ("warmup", "pack", "publish", "preload", "load", "inspect", "ls", "gc", "demo")
DAY = 86400.0


def test_top_level_help_points_to_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "compilecache demo" in text
    for name in SUBCOMMANDS:
        assert name in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_a_description_and_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and f"compilecache {name}" in text.split("examples:")[1]
    description = text.split("\n\n")[1]
    assert len(description) > 60


def test_preload_flags_match_the_contract() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "subcommand")
    preload = sub.choices["preload"]  # type: ignore[index]
    flags = {opt for action in preload._actions for opt in action.option_strings}
    assert {"--store", "--key", "--cache", "--target", "--gpu", "--strict", "--max-bytes", "--torch", "--triton",
            "--cuda", "--py", "--max-ratio", "--deadline", "--share", "--owner"} <= flags  # fmt: skip


def test_sizes_and_durations() -> None:
    assert parse_size("1024") == 1024
    assert parse_size("2K") == parse_size("2KiB") == 2048
    assert parse_size("10G") == 10 * 1024**3
    assert parse_duration("7d") == 7 * DAY and parse_duration("90m") == 5400
    with pytest.raises(ValueError, match="duration '7 days'"):
        parse_duration("7 days")
    assert format_age(3 * DAY) == "3d" and format_age(30) == "30s"


# -- inspect ----------------------------------------------------------------------------------------
def test_inspect_prints_the_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pack(make_outdir(tmp_path / "out", make_key()), tmp_path / "b.ccb")
    assert main(["inspect", str(tmp_path / "b.ccb"), "--verify"]) == 0
    header = json.loads(capsys.readouterr().out)
    assert header["key"] == str(make_key()) and header["verified"] is True
    assert [p["name"] for p in header["parts"]] == ["cachedir", "megacache"]


def test_inspect_a_stored_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path / 'store'}"
    publish(make_outdir(tmp_path / "out", make_key()), url)
    assert main(["inspect", "--store", url, str(make_key())]) == 0
    assert json.loads(capsys.readouterr().out)["job_id"] == "compilecache-team-a.llama"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such bundle file"), (b"GIF89a" + bytes(100), "not a compilecache bundle")],
)
def test_errors_are_one_line_without_traceback(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "thing.ccb"
    if content is not None:
        path.write_bytes(content)
    proc = run_cli("inspect", str(path))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("compilecache inspect: error: ") and message in lines[0]
    verbose = run_cli("-v", "inspect", str(path))
    assert "Traceback" in verbose.stderr


def test_json_log_format_for_errors(tmp_path: Path) -> None:
    proc = run_cli("--log-format", "json", "inspect", str(tmp_path / "none.ccb"))
    assert proc.returncode == 1
    entry = json.loads(proc.stderr.strip().splitlines()[-1])
    assert entry["level"] == "error" and "no such bundle file" in entry["message"]


def test_store_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPILECACHE_STORE", raising=False)
    proc = run_cli("ls")
    assert proc.returncode == 2 and "give --store URL" in proc.stderr


def test_pack_and_publish_print_json(tmp_path: Path) -> None:
    out = make_outdir(tmp_path / "out", make_key())
    proc = run_cli("pack", str(out), str(tmp_path / "b.ccb"))
    assert proc.returncode == 0, proc.stderr
    packed = json.loads(proc.stdout)
    assert packed["key"] == str(make_key()) and packed["bytes"] == (tmp_path / "b.ccb").stat().st_size
    log = tmp_path / "termination-log"
    proc = run_cli("publish", str(out), "--store", f"file://{tmp_path / 'store'}",
                   env={"COMPILECACHE_TERMINATION_LOG": str(log)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    published = json.loads(proc.stdout)
    assert published["key"] == str(make_key()) and len(published["sha256"]) == 64
    assert json.loads(log.read_text()) == published


def test_publish_failure_is_reported_in_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    proc = run_cli("publish", str(tmp_path / "nothing"), "--store", f"file://{tmp_path / 'store'}",
                   env={"COMPILECACHE_TERMINATION_LOG": str(log)})  # fmt: skip
    assert proc.returncode == 1
    message = json.loads(log.read_text())
    assert message["result"] == "error" and "nothing" in message["reason"]


# -- ls and gc ------------------------------------------------------------------------------------------
@pytest.fixture
def aged_store(tmp_path: Path) -> str:
    """Bundles of one group (same cache, model, options, GPU) with three torch versions of different
    ages, one of another GPU, one of another cache, and an object that is not a bundle."""
    url = f"file://{tmp_path / 'store'}"
    ages = {
        make_key(torch="2.11.0"): 30 * DAY,
        make_key(torch="2.12.0"): 10 * DAY,
        make_key(torch="2.13.0"): 1 * DAY,
        make_key(gpu="cpu", capability="cpu"): 20 * DAY,
        make_key(name="other", torch="2.11.0"): 40 * DAY,
    }
    now = time.time()
    with open_store(url) as store:
        root = Path(url.removeprefix("file://"))
        for index, (key, age) in enumerate(ages.items()):
            publish(make_outdir(tmp_path / f"o{index}", key), store)
            os.utime(root / str(key), (now - age, now - age))
        (root / "notes.txt").write_text("not a bundle")
        os.utime(root / "notes.txt", (now - 99 * DAY, now - 99 * DAY))
    return url


def test_ls_table_and_json(aged_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "--store", aged_store]) == 0
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert lines[0].split() == ["CACHE", "MODEL", "OPTIONS", "GPU", "CAP", "TORCH", "TRITON", "CUDA", "PY", "SIZE",
                                "AGE"]  # fmt: skip
    assert len(lines) == 6 and "5 bundle(s)" in out.err
    assert any("team-a/other" in line and "40d" in line for line in lines)
    assert main(["ls", "--store", aged_store, "--cache", "team-a/llama", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4 and {r["name"] for r in rows} == {"llama"}
    assert all({"key", "size", "age_seconds", "torch", "gpu"} <= set(r) for r in rows)


def _remaining(url: str) -> list[str]:
    with open_store(url) as store:
        return sorted(i.key for i in store.list(""))


def test_gc_dry_run_deletes_nothing(aged_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _remaining(aged_store)
    assert main(["gc", "--store", aged_store, "--older-than", "7d", "--dry-run"]) == 0
    planned = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {p["action"] for p in planned} == {"would delete"}
    assert len(planned) == 4
    assert _remaining(aged_store) == before


def test_gc_keep_newest_per_group(aged_store: str) -> None:
    assert main(["gc", "--store", aged_store, "--keep", "1"]) == 0
    left = _remaining(aged_store)
    assert str(make_key(torch="2.13.0")) in left
    assert str(make_key(torch="2.12.0")) not in left and str(make_key(torch="2.11.0")) not in left
    assert str(make_key(gpu="cpu", capability="cpu")) in left  # alone in its group
    assert str(make_key(name="other", torch="2.11.0")) in left
    assert "notes.txt" in left  # not a bundle: never touched


def test_gc_age_and_keep_combined(aged_store: str) -> None:
    assert main(["gc", "--store", aged_store, "--cache", "team-a/llama", "--older-than", "15d", "--keep", "1"]) == 0
    left = _remaining(aged_store)
    assert str(make_key(torch="2.11.0")) not in left  # 30 days, not the newest
    assert str(make_key(torch="2.12.0")) in left  # 10 days: young enough
    assert str(make_key(gpu="cpu", capability="cpu")) in left  # 20 days but the newest of its group
    assert str(make_key(name="other", torch="2.11.0")) in left  # another cache


def test_gc_needs_a_criterion(aged_store: str) -> None:
    proc = run_cli("gc", "--store", aged_store)
    assert proc.returncode == 2 and "--older-than and/or --keep" in proc.stderr


def test_plan_gc_pure() -> None:
    now = 100 * DAY
    entries = [Entry(make_key(torch=f"2.{i}.0"), 1, now - i * DAY) for i in range(1, 5)]
    assert [str(e.key) for e in plan_gc(entries, now, older_than=None, keep=2)] == sorted(
        str(make_key(torch=f"2.{i}.0")) for i in (3, 4)
    )
    assert plan_gc(entries, now, older_than=10 * DAY, keep=None) == []
    assert len(plan_gc(entries, now, older_than=0, keep=0)) == 4


@pytest.mark.slow
def test_warmup_runs_the_harness_and_publishes(tmp_path: Path) -> None:
    """`compilecache warmup` end to end with a --command (no compile, so it stays quick)."""
    store = f"file://{tmp_path / 'store'}"
    script = "import os, pathlib; (pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']) / 'entry').write_text('x')"
    proc = run_cli("warmup", "--command", f'python -c "{script}"', "--name", "cmd", "--store", store,
                   "--out", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    published = json.loads(proc.stdout.strip().splitlines()[-1])
    assert published["result"] == "published" and published["key"].startswith("cc1/default/cmd/")
    assert (tmp_path / "out" / "result.json").exists()
    with open_store(store) as opened:
        assert [i.key for i in opened.list("")] == [published["key"]]
    failing = run_cli("warmup", "--target", "no_such_mod:f", "--name", "bad", "--store", store)
    assert failing.returncode == 3
    assert "cannot import target 'no_such_mod:f'" in failing.stderr
    assert "the warm-up harness failed (exit status 3)" in failing.stderr.strip().splitlines()[-1]
