#!/usr/bin/env python3
"""Where the suite's time goes, by cause: docs/testing.md's table, made from a durations report.

    python scripts/suite_time.py ~/.cache/compilecache-test/reports/<time>/durations.json
    python scripts/suite_time.py ~/.cache/compilecache-test/reports/<time>/*/durations.json   # a split run

A run of the whole suite is two pytest sessions at once (scripts/test.sh: tests/e2e and the others), each with its
report in a folder of its own; given both, the rows add up the seconds of both sessions, and the wall is the
longer session's.

Every run of scripts/test.sh writes such a report (testsupport/timing.py). Each second of pytest's own time lands in
exactly one row: a fixture that starts something expensive once (an API server, the real node, helm's renders, a
store server, a shared warm-up) in its own row, taken out of the set-up of the test that paid for it; each test's
remaining time in the row of the first rule that matches it (its folder, its fixtures, the programs it started);
what no test holds (collection, imports, session teardown) in a row of its own. Standard library only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_FORMAT = 1
OVERHEAD = "collection, imports, session teardown"

FIXTURE_CAUSES: Mapping[str, str] = {
    "kube_cluster": "API-server starts",
    "oldest_cluster": "API-server starts",
    "real_node": "real-node starts (containerd, kubelet, images)",
    "renderings": "helm renders",
    "rendered": "helm renders",
    "rendered_oldest": "helm renders",
    "redis_server": "store servers (redis-server, moto)",
    "redis_cluster": "store servers (redis-server, moto)",
    "s3_server": "store servers (redis-server, moto)",
    "warmed": "torch compiles",
}
"""Fixtures that start something once (per session or module), by name."""

COMPILERS = ("python harness.py", "python -m cachelib.in_image.harness", "python compilestep.py",
             "python -m cachelib.cli",
             "python pod.py")
"""Programs that compile models (the harness, the CLI's warm-up and demo, the zoo's pod processes)."""


@dataclass(frozen=True)
class Rule:
    cause: str
    paths: tuple[str, ...] = ()
    fixtures: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()

    def matches(self, test: Mapping[str, Any]) -> bool:
        return (any(test["path"].startswith(p) for p in self.paths)
                or bool(set(self.fixtures) & set(test.get("fixtures", ())))
                or any(p in prog for p in self.programs for prog in test.get("programs", ())))


RULES: Sequence[Rule] = (
    Rule("the model zoo (torch compiles, both torch ends)", paths=("tests/zoo/",)),
    Rule("pods on the real node", fixtures=("real_node", "api_for_pods")),
    Rule("the API server, no pods", paths=("tests/e2e/",), fixtures=("kube_cluster", "kube_client")),
    Rule("torch compiles", fixtures=("warmed",), programs=COMPILERS),
    Rule("containers (podman)", programs=("podman", "buildah", "mmdebstrap")),
    Rule("manifest linters and promtool", fixtures=("linters",), programs=("promtool", "kubeconform", "kube-score")),
    Rule("helm renders", programs=("helm",), fixtures=("renderings", "rendered", "default_rendering")),
    Rule("store servers (redis-server, moto)", programs=("redis-server", "redis-cli", "moto_server"),
         fixtures=("redis_server", "s3_server", "redis_cluster", "store_url")),
    Rule("other processes", programs=("",)),
)
FALLBACK = "unit and property tests"


@dataclass
class Row:
    cause: str
    seconds: float = 0.0
    cpu: float = 0.0
    tests: set[str] = field(default_factory=set)


def cause_of(test: Mapping[str, Any]) -> str:
    return next((rule.cause for rule in RULES if rule.matches(test)), FALLBACK)


def by_cause(report: Mapping[str, Any]) -> list[Row]:
    """Rows sorted by seconds, the overhead row last; their seconds add up to pytest's own time."""
    rows: dict[str, Row] = {}
    paid: dict[str, float] = {}
    for fixture in report["fixtures"]:
        cause = FIXTURE_CAUSES.get(fixture["name"])
        if cause is None:
            continue
        row = rows.setdefault(cause, Row(cause))
        row.seconds += fixture["seconds"]
        paid[fixture["nodeid"]] = paid.get(fixture["nodeid"], 0.0) + fixture["seconds"]
    tested = 0.0
    for test in report["tests"]:
        total = test["setup"] + test["call"] + test["teardown"]
        tested += total
        row = rows.setdefault(cause_of(test), Row(cause_of(test)))
        row.seconds += total - paid.get(test["nodeid"], 0.0)
        row.cpu += test.get("cpu", 0.0)
        row.tests.add(test["nodeid"])
    ordered = sorted(rows.values(), key=lambda r: r.seconds, reverse=True)
    return [*ordered, Row(OVERHEAD, max(0.0, report["pytest_seconds"] - report.get("waited_for_builds", 0) - tested))]


def table(rows: Iterable[Row], pytest_seconds: float) -> list[str]:
    lines = ["| cause | tests | seconds | share | CPU seconds (tests and their children) |", "|---|---|---|---|---|"]
    for row in rows:
        share = f"{100 * row.seconds / pytest_seconds:.0f} %" if pytest_seconds else ""
        tests = str(len(row.tests)) if row.tests else ""
        cpu = f"{row.cpu:.0f}" if row.tests else ""
        lines.append(f"| {row.cause} | {tests} | {row.seconds:.0f} | {share} | {cpu} |")
    return lines


def setup_table(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    if not steps:
        return []
    lines = ["| set-up step | seconds |", "|---|---|"]
    lines += [f"| {s['step']} | {s['seconds']:.0f} |" for s in steps]
    return lines


def load(path: Path) -> dict[str, Any]:
    report = json.loads(path.read_text())
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise ValueError(f"format {report.get('format') if isinstance(report, dict) else None!r}")
    return report


def rows_of(reports: Sequence[Mapping[str, Any]]) -> list[Row]:
    """The rows of every session, added up by cause (the overhead row last)."""
    merged: dict[str, Row] = {}
    for report in reports:
        for row in by_cause(report):
            into = merged.setdefault(row.cause, Row(row.cause))
            into.seconds += row.seconds
            into.cpu += row.cpu
            into.tests |= row.tests
    overhead = merged.pop(OVERHEAD)
    return [*sorted(merged.values(), key=lambda r: r.seconds, reverse=True), overhead]


def cpu_line(reports: Sequence[Mapping[str, Any]]) -> str | None:
    """The machine's CPU over the longest session (the sessions of a split run overlap, so its busy seconds span
    the others'): busy seconds of those the cores had, and of them the tests' processes' and the parts the report
    names (the real node's pods). None for a report without the machine's busy seconds."""
    longest = max(reports, key=lambda r: float(r["pytest_seconds"]))
    busy = longest.get("machine", {}).get("busy_cpu_seconds")
    if busy is None:
        return None
    had = float(longest["machine"].get("cpus") or 1) * float(longest["pytest_seconds"])
    tests = sum(float(t.get("cpu") or 0) for r in reports for t in r["tests"])
    parts = {"the tests' processes and their children": tests}
    for report in reports:
        for part, seconds in report.get("cpu_of", {}).items():
            parts[part] = parts.get(part, 0.0) + float(seconds)
    named = ", ".join(f"{part} {seconds:,.0f} s" for part, seconds in parts.items())
    return f"CPU: the machine busy {busy:,.0f} s of the {had:,.0f} s its cores had ({busy / had:.0%}); of it {named}"


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    reports = []
    for name in argv:
        try:
            reports.append(load(Path(name)))
        except (OSError, ValueError) as error:
            print(f"{name}: not a durations report of format {REPORT_FORMAT} ({error})", file=sys.stderr)
            return 2
    sessions = [r["pytest_seconds"] - r.get("waited_for_builds", 0) for r in reports]
    tests = [t for r in reports for t in r["tests"]]
    passed = sum(t["outcome"] == "passed" for t in tests)
    first = min(reports, key=lambda r: str(r["started"]))
    machine = first.get("machine", {})
    split = f" (sessions at once: {', '.join(f'{s:.0f} s' for s in sessions)})" if len(reports) > 1 else ""
    print(f"{len(tests)} tests ({passed} passed), pytest {max(sessions):.0f} s{split}, started {first['started']}, "
          f"{machine.get('cpus')} cores, load {machine.get('load_at_start')} at the start, {machine.get('load')} at "
          "the end")
    cpu = cpu_line(reports)
    if cpu:
        print(cpu)
    print()
    print("\n".join(table(rows_of(reports), sum(sessions))))
    steps = setup_table(next((r["setup"] for r in reports if r.get("setup")), []))
    if steps:
        print()
        print("\n".join(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
