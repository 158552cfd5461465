"""bench/vllm_start.py's table (pure): warm ÷ cold of each mode from the same run, the verdict beside it."""

from __future__ import annotations

import json
from pathlib import Path

from bench import vllm_start

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "vllm-cpu-2026-11-27" / "results.json"


def test_the_table_says_each_ratio_from_the_same_run() -> None:
    results = json.loads(RESULTS.read_text())
    table = vllm_start.table(results)
    rows = [line for line in table.splitlines() if line.startswith("| aot") or line.startswith("| inductor")]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        cold, warm, ratio = (float(cells[1].removesuffix(" s")), float(cells[2].removesuffix(" s")), float(cells[3]))
        assert abs(warm / cold - ratio) < 0.005, row
    assert rows[0].endswith("| miss (artifact_load) |") and rows[1].endswith("| hit (none) |")
    assert table == (RESULTS.parent / "table.md").read_text()


def test_a_missing_figure_is_a_dash() -> None:
    assert vllm_start.ratio(None, 10.0) == "–" and vllm_start.ratio(5.0, 0.0) == "–"
    assert vllm_start.ratio(5.0, 10.0) == "0.50"
