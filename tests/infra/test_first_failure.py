"""A clean-up that fails does not hide the failure it cleans up after (testsupport/firstfailure.py): the report
names the first failure, and says what the clean-up raised as a note. Real exceptions raised through real
``finally:`` blocks, and an inner pytest session for the report itself."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testsupport.firstfailure import first_failure, raised_over

ROOT = Path(__file__).resolve().parents[2]


def caught(function: object) -> BaseException:
    with pytest.raises(BaseException) as info:
        function()  # type: ignore[operator]
    return info.value


def a_wait_in_finally() -> None:
    try:
        raise AssertionError("the runbook exited 1")
    finally:
        raise TimeoutError("timed out waiting for the old CRD to go")


@contextlib.contextmanager
def namespace() -> Iterator[None]:
    try:
        yield
    finally:
        raise RuntimeError("deleting the namespace failed")


def a_context_manager_cleaning_up() -> None:
    with namespace():
        raise KeyError("the pod's annotation")


def two_cleanups() -> None:
    try:
        try:
            raise ValueError("first")
        finally:
            raise OSError("second")
    finally:
        raise TimeoutError("third")


def raised_on_purpose_in_except() -> None:
    try:
        {}["missing"]
    except KeyError:
        raise AssertionError("no such key") from None


def raised_in_except_without_from() -> None:
    try:
        {}["missing"]
    except KeyError:
        raise AssertionError("no such key")  # noqa: B904 (what the module must not mistake for a clean-up)


@pytest.mark.parametrize(("function", "first", "notes"), [
    (a_wait_in_finally, AssertionError, ["TimeoutError: timed out waiting for the old CRD to go"]),
    (a_context_manager_cleaning_up, KeyError, ["RuntimeError: deleting the namespace failed"]),
    (two_cleanups, ValueError, ["OSError: second", "TimeoutError: third"]),
])
def test_the_first_failure_is_reported_with_the_clean_ups_as_notes(function: object, first: type, notes: list[str]
                                                                   ) -> None:
    exc = caught(function)
    reported = first_failure(exc)
    assert type(reported) is first
    assert [n.removeprefix("and then a clean-up failed: ") for n in reported.__notes__] == notes
    assert first_failure(exc) is reported and len(reported.__notes__) == len(notes), "notes added once"


@pytest.mark.parametrize("function", [raised_on_purpose_in_except, raised_in_except_without_from])
def test_an_exception_raised_in_an_except_block_is_its_own_failure(function: object) -> None:
    exc = caught(function)
    assert raised_over(exc) == [] and first_failure(exc) is exc


def test_the_report_of_a_session_names_the_first_failure(tmp_path: Path) -> None:
    (tmp_path / "test_cleanup.py").write_text(
        "def test_x():\n"
        "    try:\n"
        "        assert 1 == 2, 'the first failure'\n"
        "    finally:\n"
        "        raise TimeoutError('a clean-up wait')\n"
    )
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "testsupport.firstfailure", "-p", "no:cacheprovider",
                           "-q", "-rf", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    assert summary and "AssertionError: the first failure" in summary[0], proc.stdout
    assert "and then a clean-up failed: TimeoutError: a clean-up wait" in proc.stdout
