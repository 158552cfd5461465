"""Whether a vLLM pod started warm: the verdict of the ``compilecache-vllm-watch`` sidecar.

vLLM cannot be asked from outside whether it loaded its compiled artifact, and nothing in the user's image is
ours, so the sidecar the webhook adds beside a vLLM pod watches the cache directory it shares with vLLM (the
preloaded bundle) and the pod's network namespace:

- vLLM computed another key: a hash directory the bundle does not hold appears under
  ``torch_compile_cache/`` -- it compiles afresh (``miss``), for the argument or variable the webhook found
  different at admission (``engine_argument``, ``env``; ``unknown`` when the pod spec showed none);
- vLLM opened the bundle's artifact (inotify on ``rank_<r>_<dp>/model``) and then wrote it again: it could not
  load it and compiled again (``miss``, ``artifact_load``; vLLM 0.32's CPU build does that to every artifact,
  see docs/operator.md), with the kernels it found in the preloaded Inductor cache;
- vLLM listens on its port (it opens it only once its engine is built, compile included): with the artifact
  opened and not written again, it loaded it (``hit``); without an AOT artifact (``VLLM_USE_AOT_COMPILE=0``),
  a hit when Inductor saved no graph afresh.

The verdict is the same as a torch workload's (:mod:`cachelib.verdict`): ``{"compilecache_why": {result,
cause, reason}}``, written to :data:`cachelib.verdict.WHY_NAME` in the cache directory and to the container's
termination message. Then the sidecar exits, once: the kubelet starts it again (a native sidecar always is),
and its status keeps the verdict (``lastState.terminated.message``), where the operator reads it as soon as it
is there; the second run finds the verdict delivered and waits for the pod's end, and says it again then.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachelib.handoff import read_done
from cachelib.in_image import podcontract
from cachelib.in_image.vllmargs import Invocation, differences
from cachelib.in_image.vllmwarm import AOT_DIR, MANIFEST_NAME, ROOT_SUBDIR
from cachelib.verdict import WHY_KEY, WHY_NAME

HIT, MISS = "hit", "miss"
KERNEL_SUFFIXES = (".so", ".cubin", ".hsaco", ".ptx", ".spv")
GRAPH_DIRS = ("fxgraph", "aotautograd")
POLL_SECONDS = 0.25
DEFAULT_DEADLINE = 6 * 3600.0
DELIVERED = "delivered"
_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Tree:
    """What of the cache directory tells how vLLM started: its hash directories, the digest of each compiled
    artifact, and the files of the Inductor caches."""

    aot_hashes: frozenset[str] = frozenset()
    hashes: frozenset[str] = frozenset()
    artifacts: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    """Relative path -> (size, modification time)."""
    inductor_files: frozenset[str] = frozenset()


def observe(cache_dir: Path) -> Tree:
    """The tree as it is now."""
    root = cache_dir / ROOT_SUBDIR
    aot = root / AOT_DIR
    aot_hashes = frozenset(p.name for p in _dirs(aot))
    hashes = frozenset(p.name for p in _dirs(root / "torch_compile_cache") if p.name != "torch_aot_compile")
    artifacts = {}
    for h in aot_hashes:
        for model in (aot / h).glob("rank_*/model"):
            with contextlib.suppress(OSError):
                info = model.stat()
                artifacts[model.relative_to(cache_dir).as_posix()] = (info.st_size, info.st_mtime)
    return Tree(aot_hashes, hashes, artifacts, frozenset(_inductor_files(cache_dir)))


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:
        return []


def _inductor_files(cache_dir: Path) -> list[str]:
    """Files of Inductor's caches: the cache directory's own (vLLM without AOT) and each hash's ``inductor_cache``;
    vLLM's own files, lock files and compilecache's files left out."""
    found = []
    for directory, dirnames, filenames in os.walk(cache_dir):
        parts = Path(directory).relative_to(cache_dir).parts
        dirnames[:] = sorted(d for d in dirnames if d != "locks")
        if parts[:1] == (ROOT_SUBDIR,) and "inductor_cache" not in parts:
            if len(parts) == 1:
                dirnames[:] = [d for d in dirnames if d == "torch_compile_cache"]
            continue  # vLLM's artifacts and model inspection: not Inductor's
        found += [
            (Path(*parts) / n).as_posix() for n in filenames
            if not n.endswith(".lock") and not n.startswith((".", "compilecache"))
        ]  # fmt: skip
    return found


# -- judging (pure) ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    result: str
    cause: str
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def message(self) -> dict[str, Any]:
        """The termination message's line (the operator reads ``result``, ``cause``, ``reason``)."""
        return {WHY_KEY: {"result": self.result, "cause": self.cause, "reason": self.reason[:1000],
                          "engine": "vllm", **self.details}}  # fmt: skip


def predicted_cause(prediction: Sequence[Mapping[str, str]]) -> str:
    """``engine_argument`` when an argument differed at admission, ``env`` when only variables did, else
    ``unknown``."""
    kinds = {str(d.get("kind", "argument")) for d in prediction}
    return "engine_argument" if "argument" in kinds else "env" if kinds else "unknown"


def said(prediction: Sequence[Mapping[str, str]], limit: int = 4) -> str:
    texts = []
    for d in prediction[:limit]:
        before, after = d.get("before", ""), d.get("after", "")
        texts.append(f"env {d['factor']}: {before} → {after}" if d.get("kind") == "env"
                     else f"{d['factor']} {before} → {after}")  # fmt: skip
    if len(prediction) > limit:
        texts.append(f"and {len(prediction) - limit} more")
    return "; ".join(texts)


def new_kernels(before: Tree, now: Tree) -> tuple[int, int]:
    """(graphs, kernels) Inductor saved since ``before``: FX-graph and AOTAutograd entries, compiled kernels."""
    added = now.inductor_files - before.inductor_files
    graphs = sum(1 for f in added if any(part in GRAPH_DIRS for part in f.split("/")[:-1]))
    kernels = sum(1 for f in added if f.endswith(KERNEL_SUFFIXES))
    return graphs, kernels


def judge(
    manifest: Mapping[str, Any] | None,
    before: Tree,
    now: Tree,
    *,
    opened: bool | None,
    ready: bool,
    prediction: Sequence[Mapping[str, str]] = (),
    preload: Mapping[str, Any] | None = None,
) -> Verdict | None:
    """The verdict once the evidence decides it (None: not yet). ``opened``: whether vLLM opened the bundle's
    artifact (None: not known); ``ready``: vLLM listens on its port."""
    if manifest is None:
        return _without_bundle(preload) if ready else None
    shipped = set(manifest.get("aot_hashes") or [])
    graphs, kernels = new_kernels(before, now)
    counts = {"graphs_compiled": graphs, "kernels_compiled": kernels}
    early = _another_key(shipped, before, now, prediction, counts) or _loaded_again(manifest, before, now, counts)
    if early is not None or not ready:
        return early
    return _once_ready(shipped, opened, prediction, counts)


def _with_prediction(reason: str, prediction: Sequence[Mapping[str, str]]) -> str:
    return reason + (f": {said(prediction)}" if prediction else "")


def _without_bundle(preload: Mapping[str, Any] | None) -> Verdict:
    why = f"the preload brought no vLLM bundle ({(preload or {}).get('result', 'no result')}: " \
          f"{(preload or {}).get('reason') or 'no reason given'})"
    return Verdict(MISS, "unknown", f"{why}; vLLM compiled at start-up as without compilecache")


def _another_key(shipped: set[str], before: Tree, now: Tree, prediction: Sequence[Mapping[str, str]],
                 counts: Mapping[str, int]) -> Verdict | None:  # fmt: skip
    """vLLM wrote a hash directory the bundle did not bring: it compiled under another key."""
    fresh = sorted((now.aot_hashes - before.aot_hashes - shipped) | (now.hashes - before.hashes))
    if not fresh:
        return None
    theirs = ", ".join(h[:12] for h in sorted(shipped)) or "none"
    reason = f"vLLM compiled afresh under another key ({fresh[0][:12]}; the bundle's: {theirs})"
    reason += f": {said(prediction)}" if prediction else (
        ": no argument or VLLM_* variable of the pod spec differs from the warm-up's (a value from a ConfigMap "
        "or Secret, another image, or vLLM's own defaults on this node)")  # fmt: skip
    return Verdict(MISS, predicted_cause(prediction), reason, {"hash": fresh[0], **counts})


def _loaded_again(manifest: Mapping[str, Any], before: Tree, now: Tree, counts: Mapping[str, int]) -> Verdict | None:
    """vLLM wrote a shipped artifact again: it could not load it."""
    rewritten = sorted(p for p, stat in now.artifacts.items() if p in before.artifacts and stat != before.artifacts[p])
    if not rewritten:
        return None
    kernels = counts["kernels_compiled"]
    hit_kernels = "and Inductor compiled no kernel afresh" if kernels == 0 else f"and compiled {kernels} kernels"
    reason = (f"vLLM {manifest.get('vllm', '')} could not load its compiled artifact {rewritten[0]} and compiled "
              f"the model again (it traced again; the preloaded kernels served {hit_kernels})")  # fmt: skip
    if manifest.get("aot_load_failures"):
        reason += f"; the warm-up's own reload failed the same way: {manifest['aot_load_failures'][0]}"
    return Verdict(MISS, "artifact_load", reason, {"artifact": rewritten[0], **counts})


def _once_ready(shipped: set[str], opened: bool | None, prediction: Sequence[Mapping[str, str]],
                counts: Mapping[str, int]) -> Verdict:  # fmt: skip
    """vLLM listens and wrote nothing under another key: whether it loaded the artifact, or hit the kernels."""
    cause = predicted_cause(prediction)
    if shipped and opened is False:
        reason = "vLLM did not open the bundle's compiled artifact (it compiled nothing, or nothing it keeps)"
        return Verdict(MISS, cause, _with_prediction(reason, prediction), counts)
    if shipped:
        hashes = ", ".join(h[:12] for h in sorted(shipped))
        return Verdict(HIT, "none", f"vLLM loaded its compiled artifact ({hashes}) from the preloaded bundle",
                       {"hash": sorted(shipped)[0], **counts})  # fmt: skip
    graphs, kernels = counts["graphs_compiled"], counts["kernels_compiled"]
    if graphs or kernels:
        reason = f"Inductor compiled {graphs} graphs and {kernels} kernels afresh"
        return Verdict(MISS, cause, _with_prediction(reason, prediction), counts)
    return Verdict(HIT, "none", "every graph vLLM compiled hit the preloaded Inductor cache", counts)


# -- watching (I/O) ---------------------------------------------------------------------------------------------
def listening(port: int, proc: Path = Path("/proc/net")) -> bool:
    """Whether a socket of this network namespace listens on ``port`` (the pod's: a sidecar shares it)."""
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


class Opened:
    """Whether any of some files was read: opened since this watch began (inotify ``IN_OPEN``), or read before it
    (an access time past the modification time the preload gave it: the file systems of a kubelet's volumes update
    it on the first read); None where neither can be known."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK, IN_CLOEXEC = 0x1, 0x20, 0o4000, 0o2000000

    def __init__(self, paths: Sequence[Path]) -> None:
        self.seen: bool | None = None
        self.fd = -1
        self.paths = list(paths)
        if not paths:
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self.fd = libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
            watched = [libc.inotify_add_watch(self.fd, str(p).encode(), self.IN_OPEN | self.IN_ACCESS) for p in paths]
        except (OSError, AttributeError):
            return
        if self.fd >= 0 and all(w >= 0 for w in watched):
            self.seen = False

    def poll(self) -> bool | None:
        if self.seen is False:
            try:
                if os.read(self.fd, 4096):
                    self.seen = True
            except BlockingIOError:
                pass
            except OSError:
                self.seen = None
        if self.seen is not True and self.read_before():
            self.seen = True
        return self.seen

    def read_before(self) -> bool:
        for path in self.paths:
            with contextlib.suppress(OSError):
                info = path.stat()
                if info.st_atime_ns > info.st_mtime_ns:
                    return True
        return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_manifest(cache_dir: Path) -> dict[str, Any] | None:
    try:
        found = json.loads((cache_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@dataclass
class Watch:
    cache_dir: Path
    port: int
    prediction: Sequence[Mapping[str, str]] = ()
    deadline: float = DEFAULT_DEADLINE
    poll: float = POLL_SECONDS
    is_listening: Callable[[int], bool] = listening


def watch(request: Watch, clock: Callable[[], float] = time.monotonic) -> Verdict | None:
    """Watch until the verdict is decided (None when the deadline passes first)."""
    manifest = read_manifest(request.cache_dir)
    before = observe(request.cache_dir)
    opened = Opened([request.cache_dir / p for p in before.artifacts])
    preload = read_done(request.cache_dir / podcontract.DONE_FILE_NAME)
    started = clock()
    try:
        while clock() - started < request.deadline:
            ready = request.is_listening(request.port)
            found = judge(manifest, before, observe(request.cache_dir), opened=opened.poll(), ready=ready,
                          prediction=request.prediction, preload=preload)  # fmt: skip
            if found is not None:
                return found
            time.sleep(request.poll)
    finally:
        opened.close()
    return None


def delivered(cache_dir: Path) -> dict[str, Any] | None:
    """The verdict an earlier run of the sidecar delivered, if any."""
    try:
        found = json.loads((cache_dir / WHY_NAME).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get(DELIVERED) else None


def record(cache_dir: Path, verdict: Verdict) -> None:
    """The verdict into the cache directory (for ``compilecache why``) and the termination message."""
    document = {**verdict.message()[WHY_KEY], "at": round(time.time(), 3), DELIVERED: True}
    partial = cache_dir / f".{WHY_NAME}.partial"
    with contextlib.suppress(OSError):
        partial.write_text(json.dumps(document, sort_keys=True) + "\n")
        os.chmod(partial, 0o644)
        os.replace(partial, cache_dir / WHY_NAME)
    podcontract.write_termination_message(verdict.message())


def run(request: Watch) -> int:
    """The sidecar: the verdict once (then exit, for the kubelet to keep it in the status), or, when an earlier run
    delivered it, wait for the pod's end and say it again."""
    earlier = delivered(request.cache_dir)
    if earlier is not None:
        message = {WHY_KEY: {k: v for k, v in earlier.items() if k not in ("at", DELIVERED)}}
        print(json.dumps(message, sort_keys=True), flush=True)
        _hold_until_terminated()
        podcontract.write_termination_message(message)
        return 0
    verdict = watch(request)
    if verdict is None:
        print(json.dumps({"result": "undecided", "reason": f"no verdict within {request.deadline:g} s"}), flush=True)
        _hold_until_terminated()
        return 0
    record(request.cache_dir, verdict)
    print(json.dumps(verdict.message(), sort_keys=True), flush=True)
    return 0


def _hold_until_terminated() -> None:
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    signal.sigwait(stop)


# -- compilecache why ---------------------------------------------------------------------------------------------
def warmup_invocation(manifest: Mapping[str, Any]) -> Invocation | None:
    """The warm-up's start as its manifest recorded it."""
    given = manifest.get("invocation")
    if not isinstance(given, Mapping):
        return None
    return Invocation(
        tuple(given.get("launcher") or ()), given.get("model"), dict(given.get("options") or {}),
        dict(given.get("env") or {}),
    )  # fmt: skip


def explain(
    manifest: Mapping[str, Any], pod_verdict: Mapping[str, Any] | None, here: Invocation | None = None
) -> dict[str, Any]:
    """What ``compilecache why`` says of a vLLM cache: the warm-up's start and hash directories, a start to check
    against it (``--vllm``) with every key factor that differs, and the verdict a pod left (pure)."""
    warmup = warmup_invocation(manifest)
    report: dict[str, Any] = {
        "engine": "vllm", "vllm": manifest.get("vllm"),
        "warmup": warmup.to_dict() if warmup is not None else None,
        "hashes": list(manifest.get("aot_hashes") or []) + list(manifest.get("hashes") or []),
        "artifacts": len(manifest.get("artifacts") or []), "pod": pod_verdict,
    }  # fmt: skip
    if here is not None and warmup is not None:
        found = differences(warmup, here)
        report["this_start"] = [d.to_dict() for d in found]
        report["cause"] = predicted_cause([d.to_dict() for d in found]) if found else "none"
    return report


def explain_lines(report: Mapping[str, Any]) -> list[str]:
    """``compilecache why`` of a vLLM cache as text (pure)."""
    warmup = report.get("warmup") or {}
    options = " ".join(f"{k} {v}" if v not in ("true", "") else k for k, v in (warmup.get("options") or {}).items())
    env = ", ".join(f"{k}={v}" for k, v in (warmup.get("env") or {}).items()) or "none hashed"
    lines = [f"vLLM warm-up: vLLM {report.get('vllm')}, model {warmup.get('model')}, {options or 'no options'}; "
             f"variables: {env}"]  # fmt: skip
    hashes = report.get("hashes") or []
    lines.append(f"  compiled into {', '.join(hashes) or 'no hash directory (VLLM_USE_AOT_COMPILE=0)'}"
                 f" ({report.get('artifacts', 0)} artifacts)")  # fmt: skip
    if "this_start" in report:
        found = report["this_start"]
        lines.append(f"this start against the warm-up: {report.get('cause')}")
        lines += [f"  {said([d])}" for d in found] or ["  every key factor matches: vLLM computes the same key"]
    pod = report.get("pod")
    if pod is not None:
        lines.append(f"the pod's verdict ({WHY_NAME}): {pod.get('result')} ({pod.get('cause')}): {pod.get('reason')}")
    return lines
