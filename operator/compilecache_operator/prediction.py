"""Whether a pod will start warm, said before it starts (pure): what the pod spec shows against what the warm-up
recorded, each differing key factor with both values.

For a vLLM cache that is the pod's vLLM command line and ``VLLM_*`` variables against the warm-up's
(``spec.model.vllm``: the warm-up ran exactly that), compared by :func:`cachelib.vllmargs.differences`. The
webhook turns a cold prediction into an admission warning (``compilecache: this pod will compile:
--max-model-len 8192 → 4096``), an annotation and a metric, and never refuses the pod for it; the pod's verdict
(:mod:`cachelib.vllmwatch`) says afterwards what happened, naming the same factor.

A value the pod spec does not show (a variable from ``valueFrom`` or ``envFrom``) cannot be compared: it is
listed in ``unknown`` and said with the prediction, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache_operator.spec import VllmSpec

from cachelib import vllmargs
from cachelib.vllm_options import HASHED_ENV

WARM, COLD = "warm", "cold"
DEFAULT_PORT = 8000
ARGUMENT_CAUSE, ENV_CAUSE, NONE_CAUSE = "engine_argument", "env", "none"
PREDICTION_CAUSES = (NONE_CAUSE, ARGUMENT_CAUSE, ENV_CAUSE)
"""The bounded ``cause`` of a prediction (a metric label): the kind of the first factor that differs."""


@dataclass(frozen=True)
class Prediction:
    """One app container's start against the warm-up's."""

    container: str
    differences: tuple[vllmargs.Difference, ...] = ()
    unknown: tuple[str, ...] = ()
    """Key factors whose value the pod spec does not show (``VLLM_X from a ConfigMap``)."""
    port: int = DEFAULT_PORT
    """Where the container's vLLM serves (``--port``): where its readiness shows."""

    @property
    def outcome(self) -> str:
        return COLD if self.differences else WARM

    @property
    def cause(self) -> str:
        if not self.differences:
            return NONE_CAUSE
        return ENV_CAUSE if all(d.kind == "env" for d in self.differences) else ARGUMENT_CAUSE

    def detail(self) -> str:
        said = vllmargs.summary(self.differences) if self.differences else "every key factor matches the warm-up"
        return said + (f" (not compared: {', '.join(self.unknown)})" if self.unknown else "")

    def warning(self, several: bool = False) -> str | None:
        """The admission warning: cold, or warm with factors it could not compare; None when warm for sure."""
        where = f" (container {self.container!r})" if several else ""
        if self.differences:
            return f"compilecache: this pod will compile{where}: {self.detail()}"
        if self.unknown:
            return f"compilecache: whether this pod starts warm cannot be told{where}: {self.detail()}"
        return None

    def to_json(self) -> list[dict[str, str]]:
        """The differences as the pod's verdict reads them (``compilecache vllm-watch --prediction``)."""
        return [d.to_dict() for d in self.differences]


def container_argv(container: Mapping[str, Any], image_command: Sequence[str]) -> list[str]:
    """What a container runs: its ``command`` (else the image's entrypoint, taken to be ``image_command``) and
    its ``args``."""
    command = container.get("command")
    args = container.get("args")
    head = [str(w) for w in command] if isinstance(command, list) and command else list(image_command)
    return head + ([str(w) for w in args] if isinstance(args, list) else [])


def container_env(container: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The container's variables with a value in the spec, and the names of those it takes from elsewhere
    (``valueFrom``; ``envFrom`` sources, whose names are not known at admission)."""
    values: dict[str, str] = {}
    elsewhere: list[str] = []
    for entry in container.get("env") or []:
        name = str(entry.get("name", ""))
        if "valueFrom" in entry:
            elsewhere.append(name)
            values.pop(name, None)
        else:
            values[name] = str(entry.get("value", ""))
    for source in container.get("envFrom") or []:
        kind = "configMap" if "configMapRef" in source else "secret" if "secretRef" in source else "source"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        elsewhere.append(f"envFrom {kind} {ref.get('name', '')}".strip())
    return values, elsewhere


def predict_vllm(containers: Sequence[Mapping[str, Any]], spec: VllmSpec) -> list[Prediction]:
    """A prediction for each app container that starts vLLM (its image's entrypoint taken to be the cache's
    command when it sets none); none for the others."""
    warmup = vllmargs.parse(spec.argv(), dict(spec.env))
    assert warmup is not None, "spec.model.vllm was checked to start vLLM"
    found = []
    for container in containers:
        values, elsewhere = container_env(container)
        pod = vllmargs.parse(container_argv(container, spec.command), values)
        if pod is None:
            continue
        unknown = tuple(
            f"{name} from valueFrom" if not name.startswith("envFrom") else f"{name} (VLLM_* variables there)"
            for name in elsewhere if name.startswith(("VLLM_", "envFrom")) or name in HASHED_ENV
        )  # fmt: skip
        port = pod.options.get("--port", str(DEFAULT_PORT))
        found.append(Prediction(
            str(container.get("name", "")), tuple(vllmargs.differences(warmup, pod)), unknown,
            int(port) if port.isdigit() else DEFAULT_PORT,
        ))  # fmt: skip
    return found
