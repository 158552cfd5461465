"""Where the suite's time goes: a pytest plugin that writes every test's durations to a report outside the
checkout, prints the slowest tests and the set-up's steps, and holds pytest's own time to a stated budget.

Loaded for every run by ``tests/conftest.py``. It writes only when asked, with ``--timing-report DIR``
(``scripts/test.sh`` passes ``$COMPILECACHE_TEST_CACHE/reports/<time>/``):

- ``DIR/durations.json``: the run (start, end, pytest's own seconds, exit status, the machine's cores and load,
  the CPU seconds the whole machine was busy and those of the real node's pods (:func:`note_cpu`), the set-up's
  steps), each test (node id, outcome, setup/call/teardown seconds, the CPU seconds of the test process and its
  children, its markers and fixtures, the programs it started) and each fixture set-up that took time (its name,
  scope and the test that paid for it);
- ``DIR/setup.tsv`` (or ``DIR/../setup.tsv``, for the sessions of a split run): read, not written: the set-up's steps
  as ``scripts/test.sh`` timed them (``step<TAB>seconds``).

``scripts/suite_time.py DIR/durations.json`` turns a report into the "where the time goes" table of
docs/testing.md.

The budget (``time_budget`` in pyproject.toml's pytest section, seconds) is checked with ``--check-time-budget``:
the session fails when pytest's own time, less what it waited for binaries still being built
(:func:`note_build_wait`), is over it.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

REPORT_FORMAT = 1
SLOWEST_DEFAULT = 30
FIXTURE_FLOOR_SECONDS = 0.05
"""Fixture set-ups quicker than this are not recorded (most are microseconds)."""
_BUILD_WAITS: list[float] = []
_CPU_OF: dict[str, float] = {}
WRAPPERS = frozenset({"setpriv", "env", "nice", "timeout", "sudo", "unshare", "nsenter", "setsid"})
"""Programs that run another: a started command is named after what they run."""


@dataclass
class TestTiming:
    nodeid: str
    path: str
    outcome: str = "passed"
    setup: float = 0.0
    call: float = 0.0
    teardown: float = 0.0
    cpu: float = 0.0
    markers: list[str] = field(default_factory=list)
    fixtures: list[str] = field(default_factory=list)
    programs: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


@dataclass(frozen=True)
class FixtureTiming:
    name: str
    scope: str
    seconds: float
    nodeid: str


@dataclass(frozen=True)
class SetupStep:
    step: str
    seconds: float


# -- pure parts --------------------------------------------------------------------------------------
def program_of(args: object) -> str:
    """A short name for a started command: the executable's base name, and for Python what it runs
    (``python -m cachelib.cli``, ``python harness.py``, ``python -c``)."""
    if isinstance(args, (str, bytes, os.PathLike)):
        parts = [os.fsdecode(args)] if not isinstance(args, str) else args.split()
    else:
        parts = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]  # type: ignore[attr-defined,unused-ignore]
    while parts and Path(parts[0]).name in WRAPPERS:
        parts = parts[parts.index("--", 1) + 1:] if "--" in parts[1:] else parts[1:]
        while parts and (parts[0].startswith("-") or "=" in parts[0] or parts[0].isdigit()):
            parts = parts[1:]
    if not parts:
        return "?"
    name = Path(parts[0]).name
    if not name.startswith("python"):
        return name
    rest = parts[1:]
    while rest and rest[0] in {"-u", "-I", "-E", "-s", "-S", "-B", "-X"}:
        rest = rest[2:] if rest[0] == "-X" else rest[1:]
    if not rest:
        return "python"
    if rest[0] == "-m" and len(rest) > 1:
        return f"python -m {rest[1]}"
    if rest[0] == "-c":
        return "python -c"
    return f"python {Path(rest[0]).name}"


def read_setup_steps(path: Path) -> list[SetupStep]:
    """The ``step<TAB>seconds`` lines scripts/test.sh wrote (none when the file is absent)."""
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        name, _, seconds = line.rpartition("\t")
        if name and seconds.strip():
            steps.append(SetupStep(name, float(seconds)))
    return steps


def slowest(tests: Sequence[TestTiming], count: int) -> list[TestTiming]:
    return sorted(tests, key=lambda t: t.total, reverse=True)[:count]


def format_slowest(tests: Sequence[TestTiming], count: int) -> list[str]:
    lines = [f"{count} slowest tests (set-up + call + teardown; CPU of the test process and its children):"]
    for test in slowest(tests, count):
        lines.append(f"{test.total:8.1f}s  cpu {test.cpu:7.1f}s  {test.nodeid}")
    return lines


BUILD_PREFIX = "build "
"""Steps of tests/infra/builds.sh: in the background unless COMPILECACHE_TEST_OVERLAP=0, so not added to the others."""


def format_steps(steps: Sequence[SetupStep], pytest_seconds: float) -> list[str]:
    if not steps:
        return []
    lines = ["the set-up's steps (scripts/test.sh):"]
    lines += [f"{step.seconds:8.0f}s  {step.step}" for step in steps]
    own = sum(s.seconds for s in steps if not s.step.startswith(BUILD_PREFIX))
    built = sum(s.seconds for s in steps if s.step.startswith(BUILD_PREFIX))
    lines.append(f"{own:8.0f}s  set-up in all; pytest {pytest_seconds:.0f}s"
                 + (f"; the Go builds {built:.0f}s" if built else ""))
    return lines


def budget_verdict(pytest_seconds: float, waited_for_builds: float, budget: float) -> tuple[bool, str]:
    """Whether pytest's own time (less what it waited for builds) fits ``budget``, and the line that says so."""
    own = pytest_seconds - waited_for_builds
    waited = f" ({waited_for_builds:.0f}s waiting for builds left out)" if waited_for_builds else ""
    if own <= budget:
        return True, f"time budget: pytest took {own:.0f}s{waited} of its {budget:.0f}s budget"
    return False, (f"time budget exceeded: pytest took {own:.0f}s{waited}, over its {budget:.0f}s budget "
                   "(pyproject.toml's time_budget; docs/testing.md says how to raise it as a decision)")


def note_build_wait(seconds: float) -> None:
    """Record time a test spent waiting for binaries still being built (it is not pytest's own time)."""
    _BUILD_WAITS.append(seconds)


def note_cpu(part: str, seconds: float) -> None:
    """The CPU seconds of a part of the run outside the tests' processes (the real node's pods), for the report."""
    _CPU_OF[part] = round(_CPU_OF.get(part, 0.0) + seconds, 1)


def busy_cpu_seconds(stat: str, ticks_per_second: int) -> float:
    """The seconds the machine's CPUs were busy since boot, from ``/proc/stat``'s ``cpu`` line: user, nice, system,
    irq, softirq and steal (not idle or iowait; guest time is counted in user already)."""
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(x) for x in fields[1:])
            return (user + nice + system + irq + softirq + (rest[0] if rest else 0)) / ticks_per_second
    raise ValueError("no cpu line in /proc/stat")


def machine_busy() -> float | None:
    """:func:`busy_cpu_seconds` of this machine (None where there is no /proc/stat)."""
    try:
        return busy_cpu_seconds(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None


def process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere): pytest's own time includes its start-up
    and the imports before any plugin runs."""
    try:
        stat = Path("/proc/self/stat").read_text()
        started_ticks = int(stat.rpartition(")")[2].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "load": [round(x, 2) for x in load], "python": platform.python_version(),
            "platform": platform.platform(), "node": platform.node()}


# -- the plugin ----------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("timing", "the suite's durations report and time budget (testsupport/timing.py)")
    group.addoption("--timing-report", metavar="DIR", default=None,
                    help="write durations.json into DIR and print the slowest tests and the set-up's steps")
    group.addoption("--slowest", type=int, default=SLOWEST_DEFAULT, metavar="N",
                    help=f"how many of the slowest tests to print with --timing-report (default {SLOWEST_DEFAULT})")
    group.addoption("--check-time-budget", action="store_true", default=False,
                    help="fail the session when pytest's own time is over the ini option time_budget")
    parser.addini("time_budget", "pytest's own time for the default lane, seconds (--check-time-budget)",
                  default="0")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("check_time_budget") and not float(config.getini("time_budget") or 0) > 0:
        raise pytest.UsageError("--check-time-budget needs the ini option time_budget (seconds, more than 0)")
    config.pluginmanager.register(TimingPlugin(config), "compilecache-timing")


class TimingPlugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.report_dir = Path(config.getoption("timing_report")) if config.getoption("timing_report") else None
        self.started_wall = datetime.now(UTC)
        self.started = time.monotonic() - process_age()
        self.load_at_start = machine()["load"]
        self.busy_at_start = machine_busy()
        self.tests: dict[str, TestTiming] = {}
        self.fixtures: list[FixtureTiming] = []
        self.current: TestTiming | None = None
        self.cpu_mark = 0.0
        self.finished: float | None = None

    # every started program, named per test
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        self.current = self.tests.setdefault(item.nodeid, TestTiming(
            item.nodeid, str(Path(str(item.path)).relative_to(self.config.rootpath))
            if Path(str(item.path)).is_relative_to(self.config.rootpath) else str(item.path),
            markers=sorted({m.name for m in item.iter_markers()} - {"parametrize", "usefixtures"}),
            fixtures=sorted(getattr(item, "fixturenames", ())),
        ))
        self.cpu_mark = _cpu_seconds()
        with _recording_programs(self.current.programs):
            yield
        self.current.cpu = round(_cpu_seconds() - self.cpu_mark, 2)
        self.current = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
                             ) -> Iterator[None]:
        started = time.monotonic()
        yield
        seconds = time.monotonic() - started
        if seconds >= FIXTURE_FLOOR_SECONDS:
            nodeid = request.node.nodeid if request.node is not None else ""
            self.fixtures.append(FixtureTiming(fixturedef.argname, fixturedef.scope, round(seconds, 3), nodeid))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        setattr(test, report.when, round(report.duration, 3))
        if report.failed:
            test.outcome = "failed" if report.when == "call" else "error"
        elif report.skipped and test.outcome == "passed":
            test.outcome = "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.finished = time.monotonic()
        seconds = self.finished - self.started
        if self.config.getoption("check_time_budget"):
            budget = float(self.config.getini("time_budget"))
            fits, line = budget_verdict(seconds, sum(_BUILD_WAITS), budget)
            self.budget_line = line
            if not fits and session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.report_dir is not None:
            self.write(seconds, int(session.exitstatus))

    def write(self, seconds: float, exitstatus: int) -> None:
        assert self.report_dir is not None
        self.report_dir.mkdir(parents=True, exist_ok=True)
        report = {
            "format": REPORT_FORMAT,
            "started": self.started_wall.isoformat(timespec="seconds"),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "pytest_seconds": round(seconds, 1),
            "waited_for_builds": round(sum(_BUILD_WAITS), 1),
            "exitstatus": exitstatus,
            "args": list(self.config.invocation_params.args),
            "ci": os.environ.get("CI", "").lower() == "true",
            "lane": os.environ.get("COMPILECACHE_LANE", "default"),
            "machine": {**machine(), "load_at_start": self.load_at_start, "busy_cpu_seconds": self.busy_seconds()},
            "cpu_of": dict(_CPU_OF),
            "setup": [asdict(s) for s in read_setup_steps(self.setup_tsv())],
            "tests": [asdict(t) for t in self.tests.values()],
            "fixtures": [asdict(f) for f in self.fixtures],
        }
        (self.report_dir / "durations.json").write_text(json.dumps(report, indent=1) + "\n")

    def busy_seconds(self) -> float | None:
        """The CPU seconds the whole machine was busy during the session (every process, not only this one's)."""
        now = machine_busy()
        return None if now is None or self.busy_at_start is None else round(now - self.busy_at_start, 1)

    def setup_tsv(self) -> Path:
        assert self.report_dir is not None
        here = self.report_dir / "setup.tsv"
        return here if here.is_file() else self.report_dir.parent / "setup.tsv"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        seconds = (self.finished or time.monotonic()) - self.started
        lines: list[str] = []
        if self.report_dir is not None:
            lines += format_slowest(list(self.tests.values()), int(self.config.getoption("slowest")))
            lines += format_steps(read_setup_steps(self.setup_tsv()), seconds)
            lines.append(f"durations report: {self.report_dir / 'durations.json'} "
                         f"(table by cause: scripts/suite_time.py {self.report_dir / 'durations.json'})")
        if getattr(self, "budget_line", None):
            lines.append(self.budget_line)
        if lines:
            terminalreporter.section("where the time went")
            for line in lines:
                terminalreporter.write_line(line)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class _recording_programs:
    """Within the block, every ``subprocess.Popen`` appends its program's short name to ``into`` (once each)."""

    original = subprocess.Popen.__init__

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def __enter__(self) -> None:
        into, original = self.into, _recording_programs.original

        def init(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            name = program_of(args)
            if name not in into:
                into.append(name)
            original(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = init  # type: ignore[method-assign,assignment]

    def __exit__(self, *_: object) -> None:
        subprocess.Popen.__init__ = _recording_programs.original  # type: ignore[method-assign]


def load_report(path: Path) -> Mapping[str, Any]:
    """A durations.json, checked for its format."""
    data = json.loads(path.read_text())
    if data.get("format") != REPORT_FORMAT:
        raise ValueError(f"{path}: not a durations report of format {REPORT_FORMAT}")
    return dict(data)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("load with pytest: tests/conftest.py registers it")
