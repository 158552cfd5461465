"""Why a pod started cold: one factor changed at a time between a real warm-up and a real workload.

The warm-up is the harness compiling a small model on the CPU (real ``torch.compile``); each
workload is a fresh process that restores the warm-up's cache directory, calls
``cachelib.runtime.warm_start()`` and compiles the same model with exactly one thing changed. The
diagnosis, the metric, ``compilecache-why.json`` and ``compilecache why`` must name that factor
with both values and nothing else; an unchanged workload hits and names no cause. The comparison
itself is also checked on generated factor sets (pure).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cachelib import verdict
from cachelib.in_image import factors
from tests.zoo.ends import interpreter

ROOT = Path(__file__).resolve().parents[2]

MODEL = '''"""A model whose dtype, rows and graph break the test's environment picks."""
import os

import torch

BREAK = os.environ.get("WHY_BREAK") == "1"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x).relu()
        if BREAK:
            torch._dynamo.graph_break()
        return y * 2


def warmup():
    torch.manual_seed(0)
    dtype = getattr(torch, os.environ.get("WHY_DTYPE", "float32"))
    rows = int(os.environ.get("WHY_ROWS", "4"))
    return [(Net().to(dtype), (torch.randn(rows, 8, dtype=dtype),))]
'''

WORKLOAD = """import json, sys
from pathlib import Path

import torch
import torch._inductor.config as inductor_config

from cachelib import runtime

for name, value in json.loads(sys.argv[1]).items():
    owner = inductor_config
    *parents, leaf = name.split(".")
    for part in parents:
        owner = getattr(owner, part)
    setattr(owner, leaf, value)
runtime.warm_start()
import whymodel

for fn, args in whymodel.warmup():
    with torch.no_grad():
        torch.compile(fn)(*args)
cache = Path(sys.argv[2])
print(json.dumps({
    "why": runtime.why().to_dict(),
    "file": json.loads((cache / "compilecache-why.json").read_text()),
    "metrics": runtime.metrics_text(),
}))
"""


@dataclass(frozen=True)
class Change:
    """One factor changed in the workload: how, and what the diagnosis must say."""

    name: str
    cause: str
    says: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    source: tuple[str, str] | None = None


CONFIGS = (("epilogue_fusion", True, False), ("size_asserts", True, False))
"""Inductor options the workload sets otherwise than the warm-up: (name, the warm-up's, the pod's)."""
ENV_OPTIONS = (("TORCHINDUCTOR_NAN_ASSERTS", "nan_asserts"), ("TORCHINDUCTOR_USE_FAST_MATH", "use_fast_math"))
"""Variables that set an Inductor option when "1": (variable, option)."""
CHANGES = [
    *(
        Change(f"inductor config {name}", "inductor_config", (f"inductor config {name}: {old!r} → {new!r}",),
               config={name: new})
        for name, old, new in CONFIGS
    ),
    *(
        Change(f"env {var}", "env", (f"env {var}: unset → 1", f"inductor config {option}: False → True"),
               env={var: "1"})
        for var, option in ENV_OPTIONS
    ),
    Change("dtype", "dtype", ("dtype float32 → float64",), env={"WHY_DTYPE": "float64"}),
    Change("shape", "shape", ("shape of l_x_: [4, 8] → [16, 8]",), env={"WHY_ROWS": "16"}),
    Change("graph break", "graph_break", ("graph breaks in Net.forward: none → line 17",), env={"WHY_BREAK": "1"}),
    Change("source", "source", ("source whymodel.py:15: y = self.lin(x).relu() → y = self.lin(x).sigmoid()",),
           source=("self.lin(x).relu()", "self.lin(x).sigmoid()")),
]  # fmt: skip


@dataclass(frozen=True)
class Warm:
    out: Path
    python: str


@pytest.fixture(scope="module", params=["oldest", "newest"])
def warm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Warm]:
    """One real warm-up of the model on each end of the torch range: the harness output directory."""
    python = interpreter(request.param)
    base = tmp_path_factory.mktemp("why")
    (base / "model").mkdir()
    (base / "model" / "whymodel.py").write_text(MODEL)
    (base / "workload.py").write_text(WORKLOAD)
    out = base / "out"
    run = subprocess.run(
        [python, "-m", "cachelib.in_image.harness", "--target", "whymodel:warmup", "--out", str(out),
         "--namespace", "default", "--name", "why"],
        env=_env(base / "model"), cwd=base, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    yield Warm(out, python)


def _env(model_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "WHY_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(model_dir)])
    return env | (extra or {})


def workload(warm: Warm, tmp_path: Path, change: Change | None) -> dict[str, Any]:
    """Run the workload on a copy of the warm-up's cache with ``change`` applied; what it reported."""
    cache = tmp_path / "cache"
    shutil.copytree(warm.out / "cachedir", cache)
    model_dir = warm.out.parent / "model"
    if change is not None and change.source is not None:
        model_dir = tmp_path / "model"
        model_dir.mkdir()
        (model_dir / "whymodel.py").write_text(MODEL.replace(*change.source))
    ours = {"TORCHINDUCTOR_CACHE_DIR": str(cache), verdict.TERMINATION_LOG_ENV: str(tmp_path / "termination-log")}
    env = _env(model_dir, ours | (change.env if change else {}))
    config = json.dumps(change.config if change else {})
    run = subprocess.run([warm.python, str(warm.out.parent / "workload.py"), config, str(cache)],
                         env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    report["cache"] = cache
    report["termination"] = (tmp_path / "termination-log").read_text()
    return report


def fleet(termination: str, pods: int = 3) -> dict[str, Any]:
    """What the operator makes of ``pods`` pods that ended with this termination message: the
    verdict it reads, and status.coldStarts with the ColdStarts condition."""
    from compilecache_operator.decisions import coldstarts

    verdict = coldstarts.parse_verdict(termination, "app")
    assert verdict is not None
    cold: dict[str, Any] | None = None
    for _ in range(pods):
        cold = coldstarts.tally(cold, verdict)
    condition = coldstarts.condition(cold)
    assert condition is not None
    return {"verdict": verdict, "cold": cold, "condition": condition}


def graphs_metric(metrics: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith("compilecache_runtime_graphs_total{"):
            labels = dict(part.split("=") for part in line[line.index("{") + 1 : line.index("}")].split(","))
            out[labels["result"].strip('"'), labels["cause"].strip('"')] = float(line.rsplit(" ", 1)[1])
    return out


def test_an_unchanged_workload_hits_and_names_no_cause(warm: Warm, tmp_path: Path) -> None:
    report = workload(warm, tmp_path, None)
    why = report["why"]
    assert why["result"] == "hit" and why["cause"] == "none", why
    assert why["graphs"] and all(g["result"] == "hit" and not g["differences"] for g in why["graphs"])
    assert report["file"]["cause"] == "none"
    seen = fleet(report["termination"])
    assert seen["cold"]["cold"] == 0 and not seen["cold"]["causes"] and not seen["condition"].status
    metric = graphs_metric(report["metrics"])
    assert metric[("hit", "none")] == len(why["graphs"])
    assert all(v == 0 for k, v in metric.items() if k[0] == "miss")
    argv = [warm.python, "-m", "cachelib.cli", "why", str(report["cache"])]
    env = _env(warm.out.parent / "model")
    as_json, as_yaml = (subprocess.run([*argv, "-o", out], env=env, capture_output=True, text=True, timeout=300)
                        for out in ("json", "yaml"))  # fmt: skip
    assert as_json.returncode == 0 and as_yaml.returncode == 0, as_json.stderr + as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


DEFAULT_LANE_OF_ITS_KIND = {"inductor config epilogue_fusion", "env TORCHINDUCTOR_NAN_ASSERTS"}
"""The default lane names one Inductor option and one variable that sets one (the factors that follow torch's own
config) on both torch ends, and every other kind of change (dtype, shape, graph break, source) on the suite's torch;
the second option and the second variable, and those other kinds on the newest torch, are breadth: every change on
both ends runs in the full lane (COMPILECACHE_LANE=full)."""


def in_full_lane(params: dict[str, Any]) -> bool:
    """The cases of this module that belong to the full lane (tests/conftest.py asks): every change beyond
    DEFAULT_LANE_OF_ITS_KIND on the newest end, and the second of a kind on the suite's torch."""
    change = params.get("change")
    if not isinstance(change, Change) or change.name in DEFAULT_LANE_OF_ITS_KIND:
        return False
    return params.get("warm") == "newest" or change.cause in ("inductor_config", "env")


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_one_changed_factor_is_named_with_both_values(warm: Warm, tmp_path: Path, change: Change) -> None:
    report = workload(warm, tmp_path, change)
    why = report["why"]
    assert why["result"] == "miss" and why["cause"] == change.cause, why
    missed = [g for g in why["graphs"] if g["result"] == "miss"]
    assert missed
    for graph in missed:
        assert graph["cause"] == change.cause, graph
        assert len(graph["differences"]) == 1, graph  # the factor, and nothing else
        assert all(text in graph["differences"][0] for text in change.says), graph
    assert all(text in why["reason"] for text in change.says)
    assert report["file"]["reason"] == why["reason"]
    seen = fleet(report["termination"])
    assert seen["cold"]["causes"][0]["cause"] == change.cause and seen["condition"].status
    assert all(text in seen["condition"].message for text in change.says)
    metric = graphs_metric(report["metrics"])
    assert metric[("miss", change.cause)] == len(missed)
    assert sum(v for (result, _), v in metric.items() if result == "miss") == len(missed)
    argv = [warm.python, "-m", "cachelib.cli", "why", str(report["cache"])]
    cli = subprocess.run(argv, env=_env(warm.out.parent / "model"), capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert change.cause in cli.stdout and all(text in cli.stdout for text in change.says), cli.stdout


# -- the comparison alone (pure) -------------------------------------------------------------------------
def _graph(function: str, result: str, **found: str) -> dict[str, Any]:
    return {"file": "/app/m.py", "function": function, "line": 10, "result": result, "factors": dict(found)}


def _doc(*graphs: dict[str, Any], **process: str) -> dict[str, Any]:
    return {"format": 1, "recorded": True, "process": dict(process), "graphs": list(graphs), "graph_breaks": []}


names = st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True)
texts = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
causes = st.sampled_from(["inductor_config", "dynamo_config", "functorch_config", "torch_setting"])


@given(st.dictionaries(st.tuples(causes, names), texts, min_size=1, max_size=30), st.data())
def test_compare_names_exactly_the_one_changed_factor(base: dict[tuple[str, str], str], data: st.DataObject) -> None:
    before = {f"{c}:{n}": v for (c, n), v in base.items()}
    key = data.draw(st.sampled_from(sorted(before)))
    new = data.draw(texts.filter(lambda t: factors.canonical_text(t) != factors.canonical_text(before[key])))
    after = before | {key: new}
    diagnosis = verdict.compare(_doc(_graph("M.forward", "miss", **before)), _doc(_graph("M.forward", "miss", **after)))
    cause, _, name = key.partition(":")
    assert diagnosis.cause == cause
    assert diagnosis.graphs[0].differences == (f"{verdict.LABELS[cause]} {name}: {before[key]} → {new}",)


def test_compare_prefers_primary_factors_over_derived_ones() -> None:
    warm = _doc(
        _graph("M.forward", "miss", **{"source:graph code": "a", "shape:l_x_": "[4]"}),
        **{"torch_version:version": "2.13.0"},
    )
    pod = _doc(
        _graph("M.forward", "miss", **{"source:graph code": "b", "shape:l_x_": "[4]"}),
        **{"torch_version:version": "2.13.1"},
    )
    assert verdict.compare(warm, pod).graphs[0].differences == ("torch version: 2.13.0 → 2.13.1",)
    alone = _doc(
        _graph("M.forward", "miss", **{"source:graph code": "b", "shape:l_x_": "[4]"}),
        **{"torch_version:version": "2.13.0"},
    )
    found = verdict.compare(warm, alone)
    assert found.cause == "source" and found.graphs[0].differences == ("source graph code: a → b",)


def test_an_unexplained_environment_variable_is_said_only_when_nothing_else_differs() -> None:
    warm = _doc(_graph("M.forward", "miss", **{"inductor_config:max_autotune": "False"}), **{"env:TORCH_X": "1"})
    pod = _doc(_graph("M.forward", "miss", **{"inductor_config:max_autotune": "True"}), **{"env:TORCH_X": "2"})
    assert verdict.compare(warm, pod).graphs[0].differences == ("inductor config max_autotune: False → True",)
    same = _doc(_graph("M.forward", "miss", **{"inductor_config:max_autotune": "False"}), **{"env:TORCH_X": "2"})
    assert verdict.compare(warm, same).graphs[0].differences == ("env TORCH_X: 1 → 2",)


def test_without_a_record_the_cause_is_unknown_and_a_hit_stays_a_hit() -> None:
    pod = _doc(_graph("M.forward", "miss"), _graph("M.other", "hit"))
    diagnosis = verdict.compare(None, pod)
    assert diagnosis.cause == "unknown" and factors.FACTORS_NAME in diagnosis.reason
    assert [g.result for g in diagnosis.graphs] == ["miss", "hit"]
    unrecorded = verdict.compare(_doc(), pod | {"recorded": False, "problem": "torch 3.0 is outside"})
    assert unrecorded.cause == "unknown" and "torch 3.0 is outside" in unrecorded.reason
    assert verdict.compare(_doc(), _doc()).result == "none"


def test_a_graph_the_warm_up_never_compiled() -> None:
    diagnosis = verdict.compare(_doc(_graph("M.forward", "miss")), _doc(_graph("M.helper", "miss")))
    assert diagnosis.cause == "new_graph" and "M.helper (m.py:10)" in diagnosis.reason


def test_stack_lines_and_base_functions() -> None:
    trace = '  File "/x/m.py", line 3, in f\n    return x.relu()\n  File "/x/n.py", line 9, in g\n    y = f(x)\n'
    assert factors.stack_lines(trace) == {"m.py:3": "return x.relu()", "n.py:9": "y = f(x)"}
    assert verdict.base_function("M.torch_dynamo_resume_in_torch_dynamo_resume_in_forward_at_5_at_9") == "M.forward"
    assert factors.value_text(lambda: 1) is None and factors.value_text(object()) is None
    assert factors.value_text(b"\x01") == "01" and factors.value_text(True) == "True"


def test_secret_named_variables_are_recorded_as_digests() -> None:
    found = factors.env_factors({"TORCH_HUB_TOKEN": "s3cr3t", "TORCHINDUCTOR_MAX_AUTOTUNE": "1", "HOME": "/root",
                                 "TORCHINDUCTOR_CACHE_DIR": "/c"})  # fmt: skip
    assert found["env:TORCHINDUCTOR_MAX_AUTOTUNE"] == "1"
    assert found["env:TORCH_HUB_TOKEN"].startswith("sha256:") and "s3cr3t" not in json.dumps(found)
    assert "env:HOME" not in found and "env:TORCHINDUCTOR_CACHE_DIR" not in found


@pytest.mark.parametrize("name", sorted(factors.ENV_PER_RUN))
def test_where_files_go_is_no_factor(name: str) -> None:
    """A warm-up with a read-only root writes Triton's home under /tmp; a pod leaves it unset: no difference."""
    warmup = factors.env_factors({name: "/tmp", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    pod = factors.env_factors({"TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    assert warmup == pod == {"env:TORCHINDUCTOR_MAX_AUTOTUNE": "1"}


def test_without_the_recorder_the_metric_counts_misses_as_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachelib import metrics

    monkeypatch.setattr(factors.recorder, "installed", False)
    counts = metrics.graph_counts({"inductor": {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 3}})
    assert counts[("hit", "none")] == 2 and counts[("miss", "unknown")] == 3
    assert set(counts) == {("hit", "none")} | {("miss", c) for c in verdict.CAUSES if c != "none"}
    assert sum(counts.values()) == 5


def test_the_harness_copied_into_an_image_without_cachelib_records_the_factors(tmp_path: Path) -> None:
    """The warm-up Job's copy of the harness (and of this module beside it) records the same factors."""
    from compilecache_operator.decisions import warmup_job

    beside = tmp_path / "harness"
    beside.mkdir()
    subprocess.run([sys.executable, "-c", warmup_job.COPY_HARNESS, str(beside / "harness.py")], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TORCHINDUCTOR_")}
    argv = [sys.executable, str(beside / "harness.py"), "--target", "tiny_mlp", "--out", str(tmp_path / "out"),
            "--namespace", "default", "--name", "copied"]  # fmt: skip
    run = subprocess.run(argv, cwd=beside, env=env | {"TORCHINDUCTOR_NAN_ASSERTS": "1"},
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    recorded = factors.read_document(tmp_path / "out" / "cachedir" / factors.FACTORS_NAME)
    assert recorded is not None and recorded["recorded"] and recorded["graphs"]
    assert recorded["process"]["env:TORCHINDUCTOR_NAN_ASSERTS"] == "1"  # masking.py came along
    assert recorded["process"]["torch_version:installed files"] != "none"  # and warmstart.py
    graph = recorded["graphs"][0]
    assert graph["result"] == "miss" and graph["factors"]["inductor_config:nan_asserts"] == "True"
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["factors"] == {"file": factors.FACTORS_NAME, "graphs": len(recorded["graphs"]), "problem": None}


def test_precompiled_entries_loaded_are_hits() -> None:
    """With caching precompile, a frame loaded from Dynamo's entry is neither traced nor compiled."""
    loaded = verdict.compare(_doc(_graph("M.forward", "miss")), _doc() | {"precompiled": 2})
    assert loaded.result == "hit" and loaded.cause == "none" and "2 precompiled" in loaded.reason
    assert verdict.compare(None, _doc() | {"precompiled": 1}).result == "hit"


PLAIN = """import json, torch
import whymodel
from torch._dynamo.utils import counters
for fn, args in whymodel.warmup():
    with torch.no_grad():
        torch.compile(fn)(*args)
print(json.dumps({g: dict(counters[g]) for g in ("inductor", "aot_autograd")}))
"""


def test_recording_in_the_warm_up_leaves_torch_s_keys_alone(warm: Warm, tmp_path: Path) -> None:
    """A workload that records nothing (no warm_start) hits the recorded warm-up's FX-graph and
    AOTAutograd caches alike: the recorder reads the graph without making torch's keys differ."""
    cache = tmp_path / "cache"
    shutil.copytree(warm.out / "cachedir", cache)
    (tmp_path / "plain.py").write_text(PLAIN)
    env = _env(warm.out.parent / "model", {"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    run = subprocess.run([warm.python, str(tmp_path / "plain.py")], env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    counters = json.loads(run.stdout.strip().splitlines()[-1])
    aot, inductor = counters["aot_autograd"], counters["inductor"]
    assert aot.get("autograd_cache_hit") and not aot.get("autograd_cache_miss"), counters
    assert inductor.get("fxgraph_cache_hit") and not inductor.get("fxgraph_cache_miss"), counters


@pytest.mark.parametrize("theirs", ['{"done": true}', "finished: 42 items\n"])
def test_the_verdict_never_replaces_a_termination_message_the_workload_wrote(tmp_path: Path, theirs: str) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    verdict.write_verdict(environ={verdict.TERMINATION_LOG_ENV: str(log)})
    ours = log.read_text()
    assert ours.startswith('{"' + verdict.WHY_KEY + '"')
    verdict.write_verdict(environ={verdict.TERMINATION_LOG_ENV: str(log)})  # our own line is refreshed
    assert log.read_text().startswith('{"' + verdict.WHY_KEY + '"')
    log.write_text(theirs)  # the workload's own message, written after ours
    verdict.write_verdict(environ={verdict.TERMINATION_LOG_ENV: str(log)})
    assert log.read_text() == theirs
