"""Whether a pod will start warm, said at admission (pure): the webhook's view of a cache handed to
:func:`cachelib.prediction.predict`, which compares what the pod spec shows (image, pinned GPU, key-factor
variables, job id, precompile, a vLLM start) with what the cache's bundles recorded of their warm-up.

The webhook turns a cold prediction into an admission warning (``compilecache: this pod will compile: env
TORCHINDUCTOR_MAX_AUTOTUNE: unset → 1``), an annotation and a metric; with ``spec.preload.onPredictedCold:
Deny`` it refuses the pod with the same text. When the pod's verdict arrives (:mod:`compilecache_operator.
coldstarts`) the prediction is checked against it.

A vLLM cache's start is compared by :func:`cachelib.prediction.predict_vllm` against ``spec.model.vllm`` (the
warm-up ran exactly that); the sidecar that watches the pod
(:mod:`compilecache_operator.decisions.vllmpod`) is handed the
differences so that its verdict names the same factor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cachelib import prediction
from cachelib.prediction import CAUSES, VllmPrediction
from compilecache_operator.decisions.cacheview import CacheView
from compilecache_operator.model.spec import VllmSpec

Prediction = VllmPrediction
"""One vLLM container's start against the warm-up's (what the watch sidecar is handed)."""
PREDICTION_CAUSES = CAUSES
"""The bounded ``cause`` of a prediction (a metric label)."""


def predict_vllm(containers: Sequence[Mapping[str, Any]], spec: VllmSpec) -> list[VllmPrediction]:
    """A prediction for each app container that starts vLLM (its image's entrypoint taken to be the cache's
    command when it sets none); none for the others."""
    return prediction.predict_vllm(containers, spec.argv(), dict(spec.env), spec.command)


def predict_pod(
    pod: Mapping[str, Any], view: CacheView, vllm: Sequence[VllmPrediction] = ()
) -> prediction.Prediction:
    """The pod's prediction against ``view``'s bundles (and its vLLM containers' starts)."""
    return prediction.predict(pod, view.prediction_cache, vllm)
