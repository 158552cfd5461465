"""What `compilecache why` and a pod's verdict say where a reader would otherwise guess: a precompiled hit
(torch's inductor counters stay at 0), no verdict at all (no warm_start()), the pod's process rather than the
one running `why`, equal sets printed in another order, a shape miss that a job id fixes, a --command
warm-up (process factors only)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cachelib import verdict
from cachelib.in_image import factors
from tests.cachelib.helpers import ROOT


def graph(function: str, result: str, **found: str) -> dict[str, Any]:
    return {"file": "/app/m.py", "function": function, "line": 10, "result": result, "factors": dict(found)}


def doc(*graphs: dict[str, Any], job_id: str | None = None, **process: str) -> dict[str, Any]:
    return {"format": 1, "recorded": True, "process": dict(process), "graphs": list(graphs), "graph_breaks": [],
            "job_id": job_id}  # fmt: skip


# -- sets -----------------------------------------------------------------------------------------------
members = st.frozensets(st.text(min_size=1, max_size=8), min_size=2, max_size=8)


@given(members, st.randoms())
def test_a_set_reads_the_same_whatever_order_it_was_built_in(items: frozenset[str], random: Any) -> None:
    shuffled = list(items)
    random.shuffle(shuffled)
    assert factors.value_text(set(shuffled)) == factors.value_text(set(sorted(items)))
    assert factors.value_text({"nested": (frozenset(shuffled),)}) == factors.value_text({"nested": (items,)})


@given(members, st.randoms())
def test_sets_recorded_in_another_order_are_no_difference(items: frozenset[str], random: Any) -> None:
    """Records written before sets were sorted: the comparison reads the literal, not the text."""
    shuffled = list(items)
    random.shuffle(shuffled)
    one, other = repr(set(shuffled)), "{" + ", ".join(map(repr, sorted(items))) + "}"
    key = "dynamo_config:allowed_functions_module_string_ignorelist"
    warm, pod = doc(graph("M.forward", "miss", **{key: one})), doc(graph("M.forward", "miss", **{key: other}))
    assert verdict.compare(warm, pod).cause == "unknown", "no factor differs"
    assert verdict.differences({key: one}, {key: "{'x'}"}) != []


def test_a_set_of_strings_reads_the_same_under_every_hash_seed() -> None:
    """String hashing changes between processes (PYTHONHASHSEED): the text must not."""
    members = "{'torch._refs', 'torch.testing', 'torch.distributions', 'torch._prims'}"
    code = f"from cachelib.in_image import factors; print(factors.value_text({members}))"
    def text(seed: int) -> str:
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    seen = {text(seed) for seed in range(6)}
    assert len(seen) == 1, seen


# -- a precompiled hit ----------------------------------------------------------------------------------
def test_a_precompiled_hit_says_so_and_why_the_counters_are_zero() -> None:
    alone = verdict.compare(doc(graph("M.forward", "miss")), doc() | {"precompiled": 3})
    assert alone.result == "hit" and alone.reason.startswith("precompiled hit: 3 precompiled Dynamo entries loaded")
    assert "counters stay at 0" in alone.reason and "no miss" in alone.reason
    mixed = verdict.compare(doc(graph("M.forward", "miss")), doc(graph("M.forward", "hit")) | {"precompiled": 1})
    assert mixed.result == "hit" and "precompiled hit: 1 precompiled" in mixed.reason


# -- no verdict ----------------------------------------------------------------------------------------
def test_without_a_pod_verdict_why_says_why_and_what_to_do() -> None:
    warm = doc(graph("M.forward", "miss"), **{"torch_version:version": "2.13.0"})
    here = {"torch_version:version": "2.13.0"}
    text = "\n".join(verdict.explain_lines(verdict.explain(warm, here, None, verdict.NO_VERDICT.format(
        name=verdict.WHY_NAME))))  # fmt: skip
    assert "no pod verdict here (compilecache-why.json)" in text
    assert "cachelib.runtime.warm_start()" in text and "before the first torch.compile" in text
    bundle = "\n".join(verdict.explain_lines(verdict.explain(warm, here, None, verdict.BUNDLE_NO_VERDICT)))
    assert "a bundle holds the warm-up's record only" in bundle


# -- whose process -------------------------------------------------------------------------------------
def test_with_a_pod_verdict_the_pod_s_process_is_compared_never_the_one_running_why() -> None:
    warm = doc(graph("M.forward", "miss"), **{"env:TORCHINDUCTOR_FREEZING": "1", "device:device": "cpu"})
    pod_process = {"env:TORCHINDUCTOR_FREEZING": "1", "device:device": "cpu"}
    here = {"env:TORCHINDUCTOR_MAX_AUTOTUNE": "1", "device:device": "cpu"}  # the shell where `why` runs
    pod = {"result": "hit", "cause": "none", "reason": "all 1 graphs hit", "graphs": [], "process": pod_process}
    text = "\n".join(verdict.explain_lines(verdict.explain(warm, here, pod)))
    assert "the pod's process against the warm-up: none" in text
    assert "TORCHINDUCTOR_MAX_AUTOTUNE" not in text and "this process" not in text
    alone = "\n".join(verdict.explain_lines(verdict.explain(warm, here, None)))
    assert "this process (where compilecache why runs, not a pod) against the warm-up: env" in alone


# -- shapes and the job id -----------------------------------------------------------------------------
def test_a_shape_miss_of_a_dynamic_warm_up_names_the_job_id_to_set() -> None:
    """The warm-up compiled batches 4 and 8: the second with a dynamic batch dimension (torch's automatic
    dynamic), kept under its job id; a pod without that job id compiles batch 16 as a static shape."""
    warm = doc(graph("M.forward", "miss", **{"shape:l_x_": "[4, 8]"}),
               graph("M.forward", "miss", **{"shape:l_x_": "['s0', 8]"}), job_id="compilecache-default.multi")
    pod = doc(graph("M.forward", "miss", **{"shape:l_x_": "[16, 8]"}), job_id=None)
    diagnosis = verdict.compare(warm, pod)
    (missed,) = diagnosis.graphs
    assert diagnosis.cause == "shape" and len(missed.differences) == 1, missed
    assert missed.hint is not None and missed.hint.startswith("set TORCH_COMPILE_JOB_ID=compilecache-default.multi")
    assert "set TORCH_COMPILE_JOB_ID=compilecache-default.multi in the pod (the warm-up's job id; here unset)" in \
        diagnosis.reason
    text = "\n".join(verdict.explain_lines({"pod": diagnosis.to_dict()}))
    assert "miss, shape: shape of l_x_: [4, 8] → [16, 8]; set TORCH_COMPILE_JOB_ID=" in text
    same = verdict.compare(warm, doc(graph("M.forward", "miss", **{"shape:l_x_": "[16, 8]"}),
                                     job_id="compilecache-default.multi"))  # fmt: skip
    assert "TORCH_COMPILE_JOB_ID" not in same.reason and "warm this one up too" in same.reason
    static = doc(graph("M.forward", "miss", **{"shape:l_x_": "[4, 8]"}), job_id="compilecache-default.multi")
    assert "TORCH_COMPILE_JOB_ID" not in verdict.compare(static, pod).reason, "no profile to read: a static warm-up"


# -- a --command warm-up -------------------------------------------------------------------------------
def test_a_command_warm_up_s_process_factors_explain_a_pod_s_miss() -> None:
    warm = doc(**{"torch_version:version": "2.13.0"}) | {"recorded": False, "problem": "a --command warm-up …"}
    pod = doc(graph("M.forward", "miss"), **{"torch_version:version": "2.15.0"})
    diagnosis = verdict.compare(warm, pod)
    assert diagnosis.cause == "torch_version" and "torch version: 2.13.0 → 2.15.0" in diagnosis.reason
    unexplained = verdict.compare(warm, doc(graph("M.forward", "miss"), **{"torch_version:version": "2.13.0"}))
    assert unexplained.cause == "unknown" and "a --command warm-up" in unexplained.reason
