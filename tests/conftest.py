"""The whole suite's plugins and order.

- testsupport/timing.py: the durations report and the time budget.
- testsupport/firstfailure.py: a test's first failure stays its headline when a clean-up (a ``finally:``) raises
  over it.
- The store servers (testsupport/servers.py): one redis-server, one Redis Cluster and one S3 endpoint per session.
- The lanes: a test marked ``full_lane`` (or a case its module's ``in_full_lane`` names) buys breadth (more models,
  more versions of a kind of behaviour the default lane checks once) and runs only with ``COMPILECACHE_LANE=full``
  (docs/testing.md); the default lane deselects it.
- The order: the tests that need no build first, then those that need the manifest linters, then the end-to-end
  tests, then the oldest API server's: the order in which tests/infra/builds.sh makes them, so that on a machine
  without its builds cached the tests run while the builds do (testsupport/builds.py).
"""

from __future__ import annotations

import os
import signal

import pytest

from testsupport.builds import in_build_order
from testsupport.servers import redis_cluster, redis_server, s3_server, store_url

pytest_plugins = ("testsupport.timing", "testsupport.firstfailure")
__all__ = ["redis_cluster", "redis_server", "s3_server", "store_url"]
"""The store servers, one of each per session for every folder (a fixture imported into several conftests would be
started once for each of them); tests/e2e/conftest.py has its own Redis, on the node's bridge."""


if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A suite started with SIGINT ignored (an asynchronous command of a shell without job control, as a CI runner
    # or `nohup cmd &` may start it) would pass that on to every process it starts, and the tests that interrupt
    # the command line (Ctrl-C: what it says it left where) would see their SIGINT ignored. Python's own default.
    signal.signal(signal.SIGINT, signal.default_int_handler)

LANES = ("default", "full")


def lane() -> str:
    """COMPILECACHE_LANE: ``default`` (every kind of behaviour) or ``full`` (and the breadth of the slow lane)."""
    chosen = os.environ.get("COMPILECACHE_LANE") or "default"
    if chosen not in LANES:
        raise pytest.UsageError(f"COMPILECACHE_LANE={chosen!r}: the lanes are {', '.join(LANES)}")
    return chosen


def in_full_lane(item: pytest.Item) -> bool:
    """Marked ``full_lane``, or a parametrized case its module's ``in_full_lane(params)`` puts there (for cases of a
    module-scoped parametrized fixture, which a mark on the test's own parameters cannot reach)."""
    if item.get_closest_marker("full_lane"):
        return True
    decide = getattr(getattr(item, "module", None), "in_full_lane", None)
    callspec = getattr(item, "callspec", None)
    return callable(decide) and callspec is not None and bool(decide(callspec.params))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if lane() != "full":
        breadth = [item for item in items if in_full_lane(item)]
        if breadth:
            config.hook.pytest_deselected(items=breadth)
            items[:] = [item for item in items if not in_full_lane(item)]
    described = [(item.nodeid.split("::")[0],) * 2 + (frozenset(getattr(item, "fixturenames", ())),) for item in items]
    items[:] = [items[i] for i in in_build_order(described)]
