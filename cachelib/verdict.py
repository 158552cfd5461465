"""Why a graph started cold: the pod's graphs against the warm-up's recorded factors (:mod:`cachelib.in_image.factors`).

The pod (``cachelib.runtime.warm_start()`` starts :func:`start_watching`) compares each graph it
compiled with the warm-up's record of the same frame (:func:`compare`): a hit has no cause; a
miss gets a bounded ``cause`` (:data:`CAUSES`) and the differing factors, each with both values
(``inductor config max_autotune: False → True``). After each graph it writes :data:`WHY_NAME`
into its cache directory and the verdict's one line into its termination-message file.
``compilecache why`` reads the same records (:func:`explain`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from cachelib.in_image.factors import (
    FACTORS_NAME,
    FORMAT,
    FactorsError,
    Recorder,
    canonical_text,
    graph_break_reasons,
    guarded,
    install,
    process_factors,
    read_document,
    recorder,
    write_json,
)

WHY_NAME = "compilecache-why.json"
"""The pod's verdict, written beside the cache it read."""
WHY_KEY = "compilecache_why"
"""The verdict's key in the workload's termination message (read by the operator)."""
TERMINATION_LOG_ENV = "COMPILECACHE_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
CAUSES = (
    "none", "torch_version", "triton_version", "python_version", "device", "inductor_config",
    "dynamo_config", "functorch_config", "torch_setting", "env", "dtype", "shape", "graph_break",
    "source", "new_graph", "bypass", "engine_argument", "artifact_load", "unknown",
)  # fmt: skip
"""The bounded ``cause`` label, in the order of precedence when one graph differs in several. A vLLM pod's
verdict (:mod:`cachelib.vllmwatch`) uses ``engine_argument`` (an argument of its start that enters vLLM's key),
``env`` (a variable vLLM hashes), ``artifact_load`` (vLLM could not load the compiled artifact of the same key)
and ``unknown``."""
LABELS = {
    "torch_version": "torch", "triton_version": "Triton", "python_version": "Python", "device": "device",
    "inductor_config": "inductor config", "dynamo_config": "dynamo config",
    "functorch_config": "functorch config", "torch_setting": "torch setting", "env": "env",
    "dtype": "dtype of", "shape": "shape of", "graph_break": "graph breaks in", "source": "source",
}  # fmt: skip
DERIVED = frozenset({"source:graph code", "torch_version:source hash", "device:system info"})
"""Factors that follow from others (the traced code from the source and the inputs, torch's key
from its installed files, the system info from device and versions): reported only when no
other factor differs."""

SECONDARY = frozenset({"dynamo_config", "env"})
"""Said only when no factor of torch's keys differs: Dynamo's config enters no cache key (it shapes
the traced graph, which then differs), and an environment variable counts through the config it sets."""

PRECOMPILED_COUNTERS = "torch's FX-graph and AOTAutograd counters stay at 0 when nothing is compiled: no miss"
"""Said with a precompiled hit, whose inductor counters are empty: they would read as a cold start."""
NO_VERDICT = (
    "no pod verdict here ({name}): no process that used this cache directory called "
    "cachelib.runtime.warm_start(), which records each graph's lookup and writes the verdict beside the cache; "
    "call it before the first torch.compile (docs/operator.md, \"Why a pod started cold\")"
)
BUNDLE_NO_VERDICT = (
    "a bundle holds the warm-up's record only: for a pod's verdict run compilecache why on the cache "
    "directory that pod used (its TORCHINDUCTOR_CACHE_DIR)"
)

THIS_PROCESS = "this process (where compilecache why runs, not a pod)"

_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
ABSENT = "absent"
UNSET = "unset"



# -- comparing (pure) -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    cause: str
    name: str
    before: str
    after: str

    def text(self) -> str:
        label = LABELS.get(self.cause, self.cause)
        return f"{label} {self.name}: {self.before} → {self.after}"


@dataclass(frozen=True)
class GraphVerdict:
    graph: str
    result: str
    cause: str
    differences: tuple[str, ...] = ()
    hint: str | None = None
    """What to do about the miss, where the factors alone do not say it (a shape: the job id)."""

    def to_dict(self) -> dict[str, Any]:
        done = {"graph": self.graph, "result": self.result, "cause": self.cause, "differences": list(self.differences)}
        return done | ({"hint": self.hint} if self.hint else {})


@dataclass(frozen=True)
class Diagnosis:
    """A pod's verdict: one per graph, and the pod's cause and one-line reason."""

    graphs: tuple[GraphVerdict, ...]
    result: str
    cause: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "result": self.result, "cause": self.cause, "reason": self.reason,
            "graphs": [g.to_dict() for g in self.graphs],
        }  # fmt: skip

    def causes(self) -> Counter[tuple[str, str]]:
        """(result, cause) -> graphs."""
        return Counter((g.result, g.cause) for g in self.graphs)


def differences(before: Mapping[str, str], after: Mapping[str, str]) -> list[Difference]:
    """The differing factors, primary ones only unless none differs (pure).

    Source lines count only where both sides traced the same file and line (a graph that covers
    more lines is no change of source); a configuration option that follows an environment
    variable which also differs is said once, under the variable; a variable that differs with
    nothing it explains is said only when nothing else differs."""
    found: list[Difference] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, ABSENT), after.get(key, ABSENT)
        if old == new or canonical_text(old) == canonical_text(new):
            continue
        cause, _, name = key.partition(":")
        if cause == "source" and key not in DERIVED and ABSENT in (old, new):
            continue
        if cause == "env":
            old, new = before.get(key, UNSET), after.get(key, UNSET)
        found.append(Difference(cause, name, old, new))
    derived = [d for d in found if f"{d.cause}:{d.name}" in DERIVED]
    rest = [d for d in found if f"{d.cause}:{d.name}" not in DERIVED]
    envs = [d for d in rest if d.cause == "env"]
    keyed = [d for d in rest if d.cause not in SECONDARY]
    dynamo = [d for d in rest if d.cause == "dynamo_config"]
    return _fold_env(keyed, envs, False) or _fold_env(dynamo, envs, True) or derived


def _fold_env(found: list[Difference], envs: list[Difference], unlinked: bool) -> list[Difference]:
    """``found`` with each config difference that an also differing variable explains said under
    the variable; variables that explain none kept only when ``unlinked``."""
    explained: dict[str, list[Difference]] = {}
    kept = []
    for d in found:
        option = d.name.rsplit(".", 1)[-1].upper()
        owner = next((e for e in envs if d.cause.endswith("_config") and e.name.endswith("_" + option)), None)
        if owner is None:
            kept.append(d)
        else:
            explained.setdefault(owner.name, []).append(d)
    folded = []
    for e in envs:
        if e.name in explained:
            said = ", ".join(f"{LABELS[d.cause]} {d.name}: {d.before} → {d.after}" for d in explained[e.name])
            folded.append(Difference("env", e.name, e.before, f"{e.after} ({said})"))
        elif unlinked:
            folded.append(e)
    return folded + kept


def grouped(found: Sequence[Difference]) -> list[str]:
    """Texts of the differences, inputs that changed alike said once (``dtype float32 → float64 (x, w)``)."""
    texts: list[str] = []
    alike: dict[tuple[str, str, str], list[str]] = {}
    for d in found:
        if d.cause in ("dtype", "shape") or (d.cause == "device" and d.name.startswith("l_")):
            alike.setdefault((d.cause, d.before, d.after), []).append(d.name)
        else:
            texts.append(d.text())
    for (cause, old, new), names in alike.items():
        if len(names) == 1:
            texts.append(f"{LABELS.get(cause, cause)} {names[0]}: {old} → {new}")
        else:
            texts.append(f"{cause} {old} → {new} ({', '.join(names)})")
    return texts


def base_function(qualname: str) -> str:
    """The user's function a Dynamo resume function continues (``M.forward`` for its resumes)."""
    prefix, _, name = qualname.rpartition(".")
    while (match := _RESUME.fullmatch(name)) is not None:
        name = match["fn"]
    return f"{prefix}.{name}" if prefix else name


def graph_breaks(graphs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(file, function) -> the lines where its graphs broke, from the resume functions compiled."""
    lines: dict[tuple[str, str], set[int]] = {}
    for g in graphs:
        name = str(g["function"]).rpartition(".")[2]
        where = (os.path.basename(str(g["file"])), base_function(str(g["function"])))
        lines.setdefault(where, set())
        if (match := _RESUME.fullmatch(name)) is not None:
            lines[where].add(int(match["line"]))
    return {k: ", ".join(f"line {n}" for n in sorted(v)) or "none" for k, v in lines.items()}


def graph_identity(g: Mapping[str, Any]) -> tuple[str, str]:
    """A graph's frame as both sides name it: file name and function (not the directory, which an
    image may install elsewhere; not the line, which an edit above it moves)."""
    return os.path.basename(str(g["file"])), str(g["function"])


def graph_name(g: Mapping[str, Any]) -> str:
    return f"{g['function']} ({os.path.basename(str(g['file']))}:{g['line']})"


def compare(warmup: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> Diagnosis:
    """Each graph the pod compiled against the warm-up's record of the same frame (pure)."""
    if not pod.get("recorded", True):
        return _unrecorded(pod, f"the factors were not recorded here: {pod.get('problem')}")
    if warmup is None:
        return _unrecorded(pod, f"the cache carries no {FACTORS_NAME} (the warm-up recorded no factors)")
    if not warmup.get("recorded", True):
        return _unrecorded(pod, f"the warm-up recorded no graphs: {warmup.get('problem')}", warmup)
    theirs_breaks, ours_breaks = graph_breaks(warmup["graphs"]), graph_breaks(pod["graphs"])
    verdicts = []
    for g in pod["graphs"]:
        name = graph_name(g)
        if g.get("result") == "hit":
            verdicts.append(GraphVerdict(name, "hit", "none"))
            continue
        where = (graph_identity(g)[0], base_function(str(g["function"])))
        breaks = Difference("graph_break", where[1], theirs_breaks.get(where, "none"), ours_breaks.get(where, "none"))
        found = [breaks] if breaks.before != breaks.after else []
        candidates = [w for w in warmup["graphs"] if graph_identity(w) == graph_identity(g)]
        if candidates and not found:
            found = min(
                (differences({**warmup["process"], **w["factors"]}, {**pod["process"], **g["factors"]})
                 for w in candidates), key=len,
            )  # fmt: skip
        if g.get("result") == "bypass" and not found:
            verdicts.append(GraphVerdict(name, "miss", "bypass", ("torch did not cache it (bypass)",)))
        elif not candidates and not found:
            verdicts.append(GraphVerdict(name, "miss", "new_graph", (f"a graph the warm-up did not compile: {name}",)))
        elif not found:
            verdicts.append(GraphVerdict(name, "miss", "unknown", ("no recorded factor differs",)))
        else:
            cause = min((d.cause for d in found), key=CAUSES.index)
            hint = shape_hint(warmup.get("job_id"), pod.get("job_id"), candidates) if cause == "shape" else None
            verdicts.append(GraphVerdict(name, "miss", cause, tuple(grouped(found)), hint))
    new_breaks = sorted(set(pod.get("graph_breaks", [])) - set(warmup.get("graph_breaks", [])))
    return summarise(tuple(verdicts), new_breaks, int(pod.get("precompiled") or 0))


def shape_hint(warmup_job: str | None, pod_job: str | None, warmed: Sequence[Mapping[str, Any]]) -> str:
    """What to do about a graph whose input shapes the warm-up did not compile (pure). Where the warm-up
    compiled the frame with a dynamic dimension (a symbol in a shape), torch keeps which dimensions it
    found dynamic (its automatic-dynamic profile) in the cache directory under the job id: a pod with
    another job id compiles the first shape it meets as a static one, and misses."""
    dynamic = any(k.startswith("shape:") and "'" in v for g in warmed for k, v in g["factors"].items())
    if dynamic and warmup_job and warmup_job != pod_job:
        return (f"set TORCH_COMPILE_JOB_ID={warmup_job} in the pod (the warm-up's job id; here "
                f"{pod_job or 'unset'}): torch reads which dimensions the warm-up found dynamic under it")  # fmt: skip
    return "the warm-up compiled other shapes: warm this one up too, or compile with dynamic=True"


def _unrecorded(pod: Mapping[str, Any], why: str, warmup: Mapping[str, Any] | None = None) -> Diagnosis:
    """The verdict where the warm-up's graphs were not recorded: a miss is explained by the process
    factors when the warm-up recorded those (a ``--command`` warm-up), else its cause is unknown."""
    found = differences(warmup["process"], pod.get("process", {})) if warmup and warmup.get("process") else []
    cause = min((d.cause for d in found), key=CAUSES.index) if found else "unknown"
    said = tuple(grouped(found)) or (why,)
    verdicts = tuple(
        GraphVerdict(graph_name(g), "hit", "none") if g.get("result") == "hit"
        else GraphVerdict(graph_name(g), "miss", cause, said)
        for g in pod.get("graphs", [])
    )  # fmt: skip
    precompiled = int(pod.get("precompiled") or 0)
    if not verdicts and not precompiled:
        return Diagnosis((), "unknown", "unknown", why)
    return summarise(verdicts, (), precompiled)


def summarise(verdicts: tuple[GraphVerdict, ...], new_breaks: Sequence[str] = (), precompiled: int = 0) -> Diagnosis:
    """The pod's result, cause and one-line reason out of its graphs' verdicts and the number of
    Dynamo's precompiled entries it loaded (frames neither traced nor compiled: hits) (pure)."""
    missed = [v for v in verdicts if v.result == "miss"]
    loaded = f"{precompiled} precompiled Dynamo entries loaded" if precompiled else ""
    if not verdicts:
        return (
            Diagnosis((), "hit", "none", f"precompiled hit: {loaded}, no graph compiled ({PRECOMPILED_COUNTERS})")
            if precompiled
            else Diagnosis((), "none", "none", "no graph compiled yet")
        )
    if not missed:
        hits = f"all {len(verdicts)} graphs hit the warm-up's cache"
        return Diagnosis(verdicts, "hit", "none", f"{hits}; precompiled hit: {loaded}" if loaded else hits)
    counts = Counter(v.cause for v in missed)
    cause = min(counts, key=lambda c: (-counts[c], CAUSES.index(c)))
    first = next(v for v in missed if v.cause == cause)
    details = list(first.differences[:4])
    if cause == "graph_break" and new_breaks:
        details.append(f"reason: {new_breaks[0]}")
    more = len(first.differences) - 4
    reason = f"{len(missed)} of {len(verdicts)} graphs compiled afresh ({cause}): {first.graph}: " + "; ".join(details)
    if more > 0:
        reason += f"; and {more} more"
    if first.hint:
        reason += f"; {first.hint}"
    return Diagnosis(verdicts, "miss", cause, reason)


def read_bundle_member(path: Path, name: str, limit: int = 1 << 26) -> bytes | None:
    """One top-level file of a bundle file's ``cachedir`` part (None when it has none)."""
    import tarfile

    from cachelib.bundle import CACHEDIR_PART
    from cachelib.bundlereader import BundleReader

    with open(path, "rb") as stream:
        reader = BundleReader(stream)
        with reader.open_part(CACHEDIR_PART) as part, tarfile.open(fileobj=cast(IO[bytes], part), mode="r|") as tar:
            for member in tar:
                if member.isfile() and os.path.normpath(member.name) == name:
                    extracted = tar.extractfile(member)
                    return None if extracted is None else extracted.read(limit)
    return None


def read_bundle_document(path: Path) -> dict[str, Any] | None:
    """The factors file inside a bundle file's ``cachedir`` part (None when it has none)."""
    found = read_bundle_member(path, FACTORS_NAME)
    if found is None:
        return None
    try:
        data = json.loads(found)
    except ValueError as exc:
        raise FactorsError(f"{path}: {FACTORS_NAME} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise FactorsError(f"{path}: {FACTORS_NAME} is not of format {FORMAT}")
    return data


def explain(
    warmup: Mapping[str, Any] | None,
    here: Mapping[str, str],
    verdict: Mapping[str, Any] | None,
    no_verdict: str | None = None,
) -> dict[str, Any]:
    """What ``compilecache why`` says: the warm-up's record against this process's factors, the
    verdict a pod left beside the cache with the pod's own process against the warm-up's, or why
    there is no verdict (``no_verdict``) (pure)."""
    report: dict[str, Any] = {"warmup": None, "this_process": [], "pod": verdict}
    if verdict is None and no_verdict:
        report["no_verdict"] = no_verdict
    if warmup is not None:
        process = warmup.get("process", {})
        report["warmup"] = {
            "graphs": [graph_name(g) for g in warmup.get("graphs", [])],
            "torch": process.get("torch_version:version"),
            "device": process.get("device:device"),
            "recorded": warmup.get("recorded", True),
            "problem": warmup.get("problem"),
            "job_id": warmup.get("job_id"),
        }
        found = differences(process, here)
        report["this_process"] = grouped(found)
        report["cause"] = _first_cause(found)
        if verdict is not None and verdict.get("process"):
            theirs = differences(process, verdict["process"])
            report["pod_process"] = {"cause": _first_cause(theirs), "differences": grouped(theirs)}
    return report


def _first_cause(found: Sequence[Difference]) -> str:
    return min((d.cause for d in found), key=CAUSES.index) if found else "none"


def explain_lines(report: Mapping[str, Any]) -> list[str]:
    """``compilecache why`` as text (pure)."""
    lines = []
    warmup = report.get("warmup")
    if warmup is None:
        lines.append(f"the warm-up recorded no factors here (no {FACTORS_NAME})")
    else:
        count = len(warmup["graphs"])
        graphs = f"{count} graph{'' if count == 1 else 's'}"
        lines.append(f"warm-up: {graphs}, torch {warmup['torch']}, device {warmup['device']}")
        if not warmup["recorded"]:
            lines.append(f"  its graphs were not recorded: {warmup['problem']}")
        for name in warmup["graphs"]:
            lines.append(f"  {name}")
    pod = report.get("pod")
    if pod is not None:
        lines.append(f"the pod's verdict ({WHY_NAME}): {pod.get('result')} ({pod.get('cause')}): {pod.get('reason')}")
        for graph in pod.get("graphs", []):
            said = "; ".join([*graph.get("differences", []), *([graph["hint"]] if graph.get("hint") else [])])
            lines.append(
                f"  {graph.get('graph')}: {graph.get('result')}, {graph.get('cause')}" + (f": {said}" if said else "")
            )
        theirs = report.get("pod_process")
        if theirs is not None:
            lines.append(f"the pod's process against the warm-up: {theirs['cause']}")
            lines.extend(f"  {text}" for text in theirs["differences"] or ["no factor of the process differs"])
    elif report.get("no_verdict"):
        lines.append(str(report["no_verdict"]))
    if warmup is not None and (pod is None or report.get("pod_process") is None):
        differing = report.get("this_process") or []
        lines.append(f"{THIS_PROCESS} against the warm-up: {report.get('cause')}")
        lines.extend(f"  {text}" for text in differing or ["no factor of the process differs"])
    return lines


# -- the pod ----------------------------------------------------------------------------------------
@dataclass
class Watch:
    """The pod side: the warm-up's record, and where the verdict goes."""

    cache_dir: Path | None = None
    warmup: dict[str, Any] | None = None
    error: str | None = None
    process: dict[str, str] | None = None


watch = Watch()


def pod_document() -> dict[str, Any]:
    """This process as :func:`compare` reads it (the process factors are taken once)."""
    if watch.process is None:
        watch.process = process_factors()
    return {
        "recorded": recorder.installed,
        "problem": recorder.problem,
        "process": watch.process,
        "graphs": list(recorder.graphs),
        "graph_breaks": graph_break_reasons(),
        "precompiled": precompiled_hits(),
        "job_id": job_id(),
    }


def job_id() -> str | None:
    """This process's compile job id (torch's config, else the variable torch reads it from)."""
    config = sys.modules.get("torch.compiler.config")
    given = getattr(config, "job_id", None) if config is not None else None
    return str(given) if given else os.environ.get("TORCH_COMPILE_JOB_ID") or None


def precompiled_hits() -> int:
    """Dynamo's precompiled entries this process loaded (``caching_precompile``)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return 0 if counters is None else int(counters["dynamo_cache"]["dynamo_cache_hit"])


def diagnose() -> Diagnosis:
    """This process's verdict so far, against the warm-up's record found by :func:`start_watching`."""
    if watch.error is not None:
        return _unrecorded(pod_document(), watch.error)
    return compare(watch.warmup, pod_document())


def start_watching(cache_dir: str | Path | None) -> str | None:
    """In the workload, before its first compile: record its graphs and, after each one, write
    :data:`WHY_NAME` into ``cache_dir``. Returns why nothing is recorded, or None."""
    problem = install()
    watch.cache_dir = Path(cache_dir) if cache_dir else None
    if watch.cache_dir is not None:
        try:
            watch.warmup = read_document(watch.cache_dir / FACTORS_NAME)
        except FactorsError as exc:
            watch.error = str(exc)
    if write_verdict not in recorder.on_graph:
        recorder.on_graph.append(write_verdict)
        atexit.register(guarded, write_verdict)  # a workload whose frames all loaded precompiled compiles none
    return problem


def write_verdict(_: Recorder | None = None, environ: Mapping[str, str] | None = None) -> None:
    """The verdict so far: as one JSON object in :data:`WHY_NAME` of the cache directory, and as one
    line ``{"compilecache_why": {result, cause, reason}}`` in the container's termination-message
    file (``$COMPILECACHE_TERMINATION_LOG``, else ``/dev/termination-log`` where the kubelet made
    it), which the operator reads from the pod's status once the container ends; never over a message
    the workload wrote there itself."""
    diagnosis = diagnose()
    with contextlib.suppress(OSError):
        if watch.cache_dir is not None:
            record = {**diagnosis.to_dict(), "at": round(time.time(), 3), "process": watch.process, "job_id": job_id()}
            write_json(watch.cache_dir / WHY_NAME, record)
        named = (os.environ if environ is None else environ).get(TERMINATION_LOG_ENV)
        path = Path(named or DEFAULT_TERMINATION_LOG)
        if (path.is_file() or (named and path.parent.is_dir())) and not foreign_message(path):
            line = {WHY_KEY: {"result": diagnosis.result, "cause": diagnosis.cause, "reason": diagnosis.reason[:1000]}}
            path.write_text(json.dumps(line, sort_keys=True) + "\n")


def foreign_message(path: Path) -> bool:
    """Whether the termination-message file holds what the workload wrote itself: it is the workload's
    to say, so the verdict never replaces it (the cache directory's copy and the metric still have it)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return False
    return bool(text) and not text.startswith('{"' + WHY_KEY + '"')
