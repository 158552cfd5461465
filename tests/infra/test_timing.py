"""The suite's own measurement: the durations report, the time budget, the build stages the tests wait for, and the
table by cause that docs/testing.md shows (testsupport/timing.py, testsupport/builds.py, scripts/suite_time.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testsupport import builds, timing

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("args", "name"), [
    (["/usr/bin/helm", "template", "x"], "helm"),
    ("podman run --rm x", "podman"),
    ([sys.executable, "-m", "cachelib.cli", "publish"], "python -m cachelib.cli"),
    ([sys.executable, "/src/cachelib/in_image/harness.py", "--target", "tiny_mlp"], "python harness.py"),
    (["python3", "-u", "-c", "print(1)"], "python -c"),
    (["/usr/bin/setpriv", "--pdeathsig", "KILL", "--", "/cache/kube-apiserver", "--v=1"], "kube-apiserver"),
    (["nice", "-n", "10", "/opt/bin/kubelet"], "kubelet"),
    ([Path("/usr/bin/redis-server"), "--port", "0"], "redis-server"),
    ([], "?"),
])
def test_a_started_program_is_named_by_what_it_runs(args: object, name: str) -> None:
    assert timing.program_of(args) == name


@given(st.floats(0, 1e5), st.floats(0, 1e4), st.floats(1, 1e5))
def test_the_budget_counts_pytest_s_own_time_only(pytest_seconds: float, waited: float, budget: float) -> None:
    fits, line = timing.budget_verdict(pytest_seconds, waited, budget)
    assert fits == (pytest_seconds - waited <= budget)
    assert f"{budget:.0f}s" in line
    assert ("exceeded" in line) != fits


def test_setup_steps_are_read_from_the_tsv(tmp_path: Path) -> None:
    path = tmp_path / "setup.tsv"
    assert timing.read_setup_steps(path) == []
    path.write_text("apt\t3\nbuild kube\t886\nvenv\t12.5\n")
    assert timing.read_setup_steps(path) == [timing.SetupStep("apt", 3), timing.SetupStep("build kube", 886),
                                             timing.SetupStep("venv", 12.5)]
    lines = timing.format_steps(timing.read_setup_steps(path), 100)
    # The Go builds run beside the other steps (in the background): they are not added to them.
    assert lines[-1].split() == ["16s", "set-up", "in", "all;", "pytest", "100s;", "the", "Go", "builds", "886s"]


@pytest.mark.parametrize(("lines", "alive", "state"), [
    ([], True, "pending"),
    (["linters", "kube"], True, "done"),
    (["linters", "failed kube"], True, "failed"),
    (["linters"], False, "failed"),   # the builder died before it got there
    (["linters", "kube", "node", "oldest", "all"], False, "done"),
    (["linters", "all"], False, "failed"),
])
def test_a_build_step_s_state_comes_from_the_progress_file(lines: list[str], alive: bool, state: str) -> None:
    assert builds.step_state(lines, "kube", alive) == state


def test_a_wait_for_a_build_does_not_count_against_the_test_s_timeout(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-timeout's signal method arms ITIMER_REAL for the test: a wait longer than the alarm's time left goes
    through, and the alarm is armed again afterwards with what it had left."""
    progress = tmp_path / "builds.done"
    progress.write_text("linters\n")
    monkeypatch.setenv("COMPILECACHE_BUILDS", str(progress))
    monkeypatch.setenv("COMPILECACHE_BUILDS_PID", str(os.getpid()))

    class Alarm(Exception):
        pass

    def ring(signum: int, frame: object) -> None:
        raise Alarm

    previous_handler = signal.signal(signal.SIGALRM, ring)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        def finish() -> None:
            with progress.open("a") as out:
                out.write("kube\n")

        threading.Timer(0.6, finish).start()
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # the test's time left: shorter than the build
        assert builds.wait_for_build("kube", log=lambda _: None, poll=0.05) >= 0.5
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 0.2, left  # armed again with what it had left
        with pytest.raises(Alarm):  # and it still rings
            time.sleep(1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)


def test_a_test_waits_for_its_build_and_the_wait_is_not_pytest_s_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    progress = tmp_path / "builds.done"
    progress.write_text("linters\n")
    monkeypatch.setenv("COMPILECACHE_BUILDS", str(progress))
    monkeypatch.setenv("COMPILECACHE_BUILDS_PID", str(os.getpid()))
    assert builds.wait_for_build("linters", log=lambda _: None) == 0.0

    def finish() -> None:
        time.sleep(0.3)
        with progress.open("a") as out:
            out.write("kube\n")

    threading.Thread(target=finish).start()
    before = list(timing._BUILD_WAITS)
    waited = builds.wait_for_build("kube", log=lambda _: None, poll=0.05)
    assert waited >= 0.25 and timing._BUILD_WAITS[len(before):] == [waited]
    monkeypatch.setenv("COMPILECACHE_BUILDS_PID", "999999999")  # the builder is gone: node never comes
    with pytest.raises(builds.BuildFailed, match="build of node failed or did not run"):
        builds.wait_for_build("node", log=lambda _: None, poll=0.01)
    monkeypatch.delenv("COMPILECACHE_BUILDS")
    assert builds.wait_for_build("oldest") == 0.0  # no background build: nothing to wait for
    with pytest.raises(ValueError, match="unknown build step"):
        builds.wait_for_build("everything")


def test_modules_run_in_the_order_their_builds_come() -> None:
    items = [
        ("tests/e2e/test_a.py", "tests/e2e/test_a.py", frozenset()),
        ("tests/chart/test_lint.py", "tests/chart/test_lint.py", frozenset({"linters"})),
        ("tests/chart/test_lint.py", "tests/chart/test_lint.py", frozenset()),
        ("tests/cachelib/test_x.py", "tests/cachelib/test_x.py", frozenset({"tmp_path"})),
        ("tests/e2e/test_old.py", "tests/e2e/test_old.py", frozenset({"oldest_cluster"})),
        ("tests/e2e/test_old.py", "tests/e2e/test_old.py", frozenset()),
        ("tests/chart/test_e2e_fixture.py", "tests/chart/test_e2e_fixture.py", frozenset({"kube_client"})),
        ("tests/stores/test_y.py", "tests/stores/test_y.py", frozenset()),
    ]
    order = builds.in_build_order(items)
    assert [items[i][0] for i in order] == [
        "tests/cachelib/test_x.py", "tests/stores/test_y.py",            # no build, in collection order
        "tests/chart/test_lint.py", "tests/chart/test_lint.py",          # a whole module with the linters
        "tests/e2e/test_a.py", "tests/chart/test_e2e_fixture.py",        # the control plane and the node
        "tests/e2e/test_old.py", "tests/e2e/test_old.py",                # the oldest API server, last
    ]


INNER_TESTS = """
import subprocess, time
import pytest

@pytest.fixture(scope="session")
def server():
    started = time.process_time()
    while time.process_time() - started < 0.3:  # a server starting: CPU work the machine's busy seconds count
        pass
    yield "up"

def test_quick():
    pass

def test_starts_a_program(server):
    subprocess.run(["true"], check=True)

def test_sleeps():
    time.sleep({sleep})

def test_skipped():
    pytest.skip("not here")
"""


def inner_run(tmp_path: Path, *args: str, budget: float = 0, sleep: float = 0.2) -> tuple[int, str]:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS).replace("{sleep}", str(sleep)))
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntime_budget = {budget}\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "testsupport.timing", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), str(tmp_path), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env={**os.environ, "CI": ""})
    return proc.returncode, proc.stdout + proc.stderr


def test_a_run_writes_every_test_s_durations_and_prints_the_slowest(tmp_path: Path) -> None:
    report = tmp_path / "report"
    report.mkdir()
    (report / "setup.tsv").write_text("apt\t2\nbuild kube\t886\n")
    (tmp_path / "suite").mkdir()
    code, out = inner_run(tmp_path / "suite", "--timing-report", str(report), "--slowest", "2")
    assert code == 0, out
    data = timing.load_report(report / "durations.json")
    tests = {t["nodeid"].rsplit("::", 1)[1]: t for t in data["tests"]}
    assert set(tests) == {"test_quick", "test_starts_a_program", "test_sleeps", "test_skipped"}
    assert tests["test_sleeps"]["call"] >= 0.2 and tests["test_skipped"]["outcome"] == "skipped"
    assert tests["test_starts_a_program"]["programs"] == ["true"] and "server" in tests["test_starts_a_program"][
        "fixtures"]
    assert [(f["name"], f["scope"]) for f in data["fixtures"]] == [("server", "session")]
    assert data["setup"] == [{"step": "apt", "seconds": 2.0}, {"step": "build kube", "seconds": 886.0}]
    assert data["pytest_seconds"] >= 0.5 and data["machine"]["cpus"] == os.cpu_count()
    assert data["machine"]["busy_cpu_seconds"] >= 0.2 and data["cpu_of"] == {}  # the server's CPU at least
    slowest = out.split("2 slowest tests", 1)[1].splitlines()[1:3]
    assert [line.rsplit("::", 1)[1] for line in slowest] == ["test_starts_a_program", "test_sleeps"], out
    assert "2s  set-up in all" in out and "the Go builds 886s" in out and str(report / "durations.json") in out


def test_the_budget_fails_a_run_that_passed_only_when_asked(tmp_path: Path) -> None:
    code, out = inner_run(tmp_path, "--check-time-budget", budget=0.01, sleep=0.1)
    assert code == 1 and "time budget exceeded" in out and "passed" in out, out
    code, out = inner_run(tmp_path, budget=0.01, sleep=0.1)
    assert code == 0 and "time budget" not in out, out
    code, out = inner_run(tmp_path, "--check-time-budget", budget=600, sleep=0.1)
    assert code == 0 and "of its 600s budget" in out, out
    code, out = inner_run(tmp_path, "--check-time-budget", budget=0, sleep=0.1)  # no budget stated
    assert code == 4 and "needs the ini option time_budget" in out, out


def test_the_table_by_cause_adds_up_to_the_report(tmp_path: Path) -> None:
    report = {
        "format": timing.REPORT_FORMAT, "started": "2026-11-27T10:00:00+00:00", "pytest_seconds": 1000.0,
        "waited_for_builds": 0, "exitstatus": 0, "machine": {"cpus": 2, "load": [1, 1, 1], "load_at_start": [1, 1, 1]},
        "setup": [{"step": "build kube", "seconds": 886}],
        "tests": [
            {"nodeid": "tests/zoo/test_zoo.py::test_case[hf_bert]", "path": "tests/zoo/test_zoo.py", "setup": 0,
             "call": 300, "teardown": 0, "cpu": 290, "fixtures": [], "programs": ["python harness.py"],
             "markers": [], "outcome": "passed"},
            {"nodeid": "tests/e2e/test_flow.py::test_pod", "path": "tests/e2e/test_flow.py", "setup": 60,
             "call": 100, "teardown": 5, "cpu": 20, "fixtures": ["real_node", "kube_cluster"], "programs": [],
             "markers": ["e2e"], "outcome": "passed"},
            {"nodeid": "tests/chart/test_render.py::test_r", "path": "tests/chart/test_render.py", "setup": 40,
             "call": 1, "teardown": 0, "cpu": 2, "fixtures": ["renderings"], "programs": ["helm"], "markers": [],
             "outcome": "passed"},
            {"nodeid": "tests/cachelib/test_keys.py::test_k", "path": "tests/cachelib/test_keys.py", "setup": 0,
             "call": 2, "teardown": 0, "cpu": 2, "fixtures": [], "programs": [], "markers": [], "outcome": "passed"},
        ],
        "fixtures": [
            {"name": "kube_cluster", "scope": "session", "seconds": 10, "nodeid": "tests/e2e/test_flow.py::test_pod"},
            {"name": "real_node", "scope": "session", "seconds": 45, "nodeid": "tests/e2e/test_flow.py::test_pod"},
            {"name": "renderings", "scope": "session", "seconds": 40, "nodeid": "tests/chart/test_render.py::test_r"},
        ],
    }
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(report))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_time.py"), str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| cause") and "---" not in line}
    assert rows["the model zoo (torch compiles, both torch ends)"] == "300"
    assert rows["API-server starts"] == "10" and rows["real-node starts (containerd, kubelet, images)"] == "45"
    assert rows["pods on the real node"] == "110"  # 165 less the two starts paid in its set-up
    assert rows["helm renders"] == "41"
    assert rows["unit and property tests"] == "2"
    assert rows["collection, imports, session teardown"] == "492"
    total = sum(float(v) for v in rows.values() if v)
    assert abs(total - 1000) < 1, proc.stdout  # every second of pytest's time, once
    # A split run: the e2e session and the others, at once; the rows add up both, the wall is the longer one.
    e2e = {**report, "pytest_seconds": 400.0, "tests": report["tests"][1:2], "fixtures": report["fixtures"][:2]}
    rest = {**report, "pytest_seconds": 700.0, "tests": [report["tests"][i] for i in (0, 2, 3)],
            "fixtures": report["fixtures"][2:]}
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))
    (tmp_path / "rest.json").write_text(json.dumps(rest))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_time.py"), str(tmp_path / "e2e.json"),
                           str(tmp_path / "rest.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pytest 700 s (sessions at once: 400 s, 700 s)" in proc.stdout
    split = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in proc.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| cause") and "---" not in line}
    assert {k: v for k, v in split.items() if k != "collection, imports, session teardown"} == {
        k: v for k, v in rows.items() if k != "collection, imports, session teardown"}
    assert split["collection, imports, session teardown"] == str(400 - 165 + 700 - 343)
    assert "CPU:" not in proc.stdout  # reports without the machine's busy seconds
    # The machine's CPU over the longest session, and what the tests' processes and the node's pods used of it.
    rest["machine"] = {**rest["machine"], "busy_cpu_seconds": 1050.0}
    e2e["cpu_of"] = {"the real node's pods": 500.0}
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))
    (tmp_path / "rest.json").write_text(json.dumps(rest))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_time.py"), str(tmp_path / "e2e.json"),
                           str(tmp_path / "rest.json")], capture_output=True, text=True, timeout=60)
    assert ("CPU: the machine busy 1,050 s of the 1,400 s its cores had (75%); of it the tests' processes and their "
            "children 314 s, the real node's pods 500 s") in proc.stdout, proc.stdout


@given(ticks=st.lists(st.integers(0, 10**9), min_size=10, max_size=10), hz=st.sampled_from([100, 250, 1000]))
def test_the_machine_s_busy_time_leaves_out_idle_and_iowait(ticks: list[int], hz: int) -> None:
    user, nice, system, _idle, _iowait, irq, softirq, steal, _guest, _guest_nice = ticks
    stat = f"cpu  {' '.join(map(str, ticks))}\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 5\n"
    assert timing.busy_cpu_seconds(stat, hz) == (user + nice + system + irq + softirq + steal) / hz
    with pytest.raises(ValueError, match="no cpu line"):
        timing.busy_cpu_seconds("intr 5\n", hz)


def test_the_node_s_pods_cpu_is_read_from_either_cgroup_version(tmp_path: Path) -> None:
    from tests.infra.node import pods_cpu_seconds

    assert pods_cpu_seconds(tmp_path) == 0.0
    v2 = tmp_path / "v2" / "kubepods"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert pods_cpu_seconds(tmp_path / "v2") == 2.5
    v1 = tmp_path / "v1" / "cpuacct" / "kubepods"
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("1441370000000\n")
    assert pods_cpu_seconds(tmp_path / "v1") == 1441.37
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_time.py"), str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "not a durations report" in proc.stderr


class _Item:
    """What tests/conftest.py reads of a collected test: its closest full_lane mark, its module, its parameters."""

    def __init__(self, marked: bool, module: object = None, params: dict[str, object] | None = None) -> None:
        self.marked, self.module = marked, module
        if params is not None:
            self.callspec = type("CallSpec", (), {"params": params})()

    def get_closest_marker(self, name: str) -> object:
        return object() if self.marked and name == "full_lane" else None


def test_the_full_lane_takes_marked_tests_and_the_cases_a_module_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import conftest
    from tests.cachelib import test_factors

    module = type("Module", (), {"in_full_lane": staticmethod(lambda params: params.get("end") == "newest")})()
    assert conftest.in_full_lane(_Item(True))
    assert not conftest.in_full_lane(_Item(False))
    assert conftest.in_full_lane(_Item(False, module, {"end": "newest"}))
    assert not conftest.in_full_lane(_Item(False, module, {"end": "oldest"}))
    assert not conftest.in_full_lane(_Item(False, module))  # not parametrized
    # The changed factors: breadth beyond one of each kind per torch end; each kind of change stays in the default.
    def default_lane(end: str) -> list[test_factors.Change]:
        return [c for c in test_factors.CHANGES if not test_factors.in_full_lane({"warm": end, "change": c})]

    assert {c.name for c in default_lane("newest")} == test_factors.DEFAULT_LANE_OF_ITS_KIND
    assert sorted(c.cause for c in default_lane("oldest")) == sorted({c.cause for c in test_factors.CHANGES})
    assert {c.name for c in default_lane("oldest")} >= test_factors.DEFAULT_LANE_OF_ITS_KIND
    monkeypatch.setenv("COMPILECACHE_LANE", "full")
    assert conftest.lane() == "full"
    monkeypatch.setenv("COMPILECACHE_LANE", "quick")
    with pytest.raises(pytest.UsageError, match="the lanes are default, full"):
        conftest.lane()
