"""The whole suite's plugins and order.

- testsupport/timing.py: the durations report and the time budget.
- The order: the tests that need no build first, then those that need the manifest linters, then the end-to-end
  tests, then the oldest API server's: the order in which tests/infra/builds.sh makes them, so that on a machine
  without its builds cached the tests run while the builds do (testsupport/builds.py).
"""

from __future__ import annotations

import pytest

from testsupport.builds import in_build_order

pytest_plugins = ("testsupport.timing",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    described = [(str(item.path), str(item.path), frozenset(getattr(item, "fixturenames", ()))) for item in items]
    items[:] = [items[i] for i in in_build_order(described)]
