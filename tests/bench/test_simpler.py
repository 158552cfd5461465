"""bench/warm_start.py's comparison with the simpler ways (README.md): the shared cache directory row is measured
like the others, and `simpler` renders each way's first call, a row that did not hit every lookup saying so."""

from __future__ import annotations

from typing import Any

from bench import warm_start

HIT = {"inductor": {"fxgraph_cache_hit": 1}, "aot_autograd": {"autograd_cache_hit": 1}}
MISS = {"inductor": {"fxgraph_cache_miss": 1}, "aot_autograd": {"autograd_cache_miss": 1}}


def row(name: str, first: float, counters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"config": "gpt2", "name": name, "ok": True, "first_call_s": first, "counters": counters or HIT,
            "process_wall_s": first + 3}  # fmt: skip


def test_the_simpler_ways_render_side_by_side() -> None:
    rows = [row("eager", 0.05, {}), row("cold", 20.0, MISS), row("hot", 2.0), row("shared", 2.1),
            row("remote", 2.4, MISS), row("preloaded", 2.05),
            {"config": "gpt2", "name": "preload", "ok": True, "process_wall_s": 0.3}]  # fmt: skip
    summary = warm_start.summarise(rows)
    table = warm_start.render_simpler([{"summary": summary}])
    header, _, line = table.splitlines()
    assert header.split(" | ")[1:4] == ["eager (the floor)", "cold compile", "node's own hot cache"]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells == ["gpt2", "0.05", "20.00", "2.00", "2.10", "2.40 (MISS (2 miss, 0 hit))", "0.30 + 2.05 = 2.35"]


def test_shared_is_a_row_and_a_warm_one() -> None:
    assert "shared" in warm_start.ROWS and "shared" in warm_start.WARM_ROWS
    assert set(warm_start.SIMPLER) <= set(warm_start.ROWS)
