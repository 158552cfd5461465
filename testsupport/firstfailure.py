"""A test's first failure stays its headline when a clean-up raises over it.

A ``finally:`` (or a context manager's exit) that fails while a test's failure is on its way out replaces that
failure: Python keeps the first only as the second's ``__context__``, and pytest's summary line names the second
("timed out waiting for the old CRD to go") instead of what went wrong first. :func:`raised_over` finds that case
from the exceptions alone: the later exception was raised, uncaused, while the earlier one was being handled, and
its traceback leaves through a line of a ``finally:`` block. This module's report hook (a plugin of the whole
suite: tests/conftest.py) then reports the first failure, with each clean-up failure as a note on it. An exception
raised on purpose in an ``except`` block (``except KeyError: raise AssertionError(...)``) is not a clean-up, and is
left alone.
"""

from __future__ import annotations

import ast
import functools
import linecache
from collections.abc import Generator
from types import TracebackType

import pytest


def raised_over(exc: BaseException) -> list[BaseException]:
    """The failures ``exc`` hides, the first one first: each one whose clean-up raised the next (empty when ``exc``
    was raised on its own)."""
    hidden: list[BaseException] = []
    current = exc
    while (earlier := _hidden_by(current)) is not None and earlier not in hidden:
        hidden.insert(0, earlier)
        current = earlier
    return hidden


def first_failure(exc: BaseException) -> BaseException:
    """The failure to report for ``exc``: the first one a clean-up raised over, with the clean-ups' failures as notes
    (once); ``exc`` itself when nothing was raised over."""
    hidden = raised_over(exc)
    if not hidden:
        return exc
    first = hidden[0]
    for later in [*hidden[1:], exc]:
        note = f"and then a clean-up failed: {type(later).__name__}: {later}"
        if note not in getattr(first, "__notes__", ()):
            first.add_note(note)
    return first


def _hidden_by(exc: BaseException) -> BaseException | None:
    earlier = exc.__context__
    if earlier is None or exc.__cause__ is not None or exc.__suppress_context__:
        return None
    return earlier if _leaves_through_finally(exc.__traceback__) else None


def _leaves_through_finally(tb: TracebackType | None) -> bool:
    while tb is not None:
        code = tb.tb_frame.f_code
        if tb.tb_lineno in _finally_lines(code.co_filename, code.co_firstlineno, code.co_name):
            return True
        tb = tb.tb_next
    return False


@functools.lru_cache(maxsize=512)
def _finally_lines(filename: str, first_line: int, name: str) -> frozenset[int]:
    """The lines of the ``finally:`` blocks of the function named ``name`` that starts at ``first_line`` of
    ``filename`` (empty when its source cannot be read)."""
    source = "".join(linecache.getlines(filename))
    if not source:
        return frozenset()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name and _starts_at(
            node, first_line
        ):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Try | ast.TryStar):
                    for statement in inner.finalbody:
                        lines.update(range(statement.lineno, (statement.end_lineno or statement.lineno) + 1))
    return frozenset(lines)


def _starts_at(node: ast.FunctionDef | ast.AsyncFunctionDef, first_line: int) -> bool:
    """Whether the code object that starts at ``first_line`` is this function's (its decorators come first)."""
    starts = [node.lineno, *(d.lineno for d in node.decorator_list)]
    return first_line in starts


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, None]:
    if call.excinfo is not None:
        first = first_failure(call.excinfo.value)
        if first is not call.excinfo.value:
            call.excinfo = pytest.ExceptionInfo.from_exception(first)
    yield
