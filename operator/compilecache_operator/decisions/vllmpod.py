"""What the webhook adds to a pod of a vLLM cache (pure): ``VLLM_CACHE_ROOT`` on the preloaded bundle, and the
``compilecache-vllm-watch`` sidecar that tells whether vLLM loaded it.

The preload unpacks a vLLM bundle into the inductor directory of the cache volume, with vLLM's cache root in its
``vllm/`` subdirectory (:mod:`cachelib.in_image.vllmwarm`). An app container gets ``VLLM_CACHE_ROOT`` there, beside the
``TORCHINDUCTOR_CACHE_DIR`` every app container gets (vLLM uses Inductor's own directory when its AOT compile is
off). A container that sets ``VLLM_CACHE_ROOT`` itself keeps it: the cache volume's ``inductor/vllm`` is mounted
there instead (``subPath``), as a container's own ``TORCHINDUCTOR_CACHE_DIR`` gets ``inductor``; one whose value
comes from ``valueFrom`` or is not an absolute path cannot be wired, and the pod is left alone with the reason,
as for torch's variable (:mod:`compilecache_operator.model.cache_readers`).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from compilecache_operator.decisions.prediction import Prediction
from compilecache_operator.model.cache_readers import (
    CACHE_DIR_ENV,
    CACHE_DIR_NOT_ABSOLUTE,
    CACHE_DIR_VALUE_FROM,
    Unwired,
)
from compilecache_operator.model.names import (
    CACHE_MOUNT,
    CACHE_VOLUME,
    INDUCTOR_DIR,
    INDUCTOR_SUBDIR,
    VLLM_CACHE_ROOT_ENV,
    VLLM_ROOT_SUBDIR,
    VLLM_WATCH_CONTAINER,
)

ROOT_SUB_PATH = f"{INDUCTOR_SUBDIR}/{VLLM_ROOT_SUBDIR}"


def _entry(container: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((e for e in container.get("env") or [] if e.get("name") == name), None)


def unwired_root(container: Mapping[str, Any]) -> Unwired | None:
    """Why ``container``'s own ``VLLM_CACHE_ROOT`` cannot be wired to the bundle, or None."""
    entry = _entry(container, VLLM_CACHE_ROOT_ENV)
    name = str(container.get("name", ""))
    if entry is None:
        return None
    if "valueFrom" in entry:
        return Unwired(name, CACHE_DIR_VALUE_FROM,
                       f"{VLLM_CACHE_ROOT_ENV} comes from valueFrom, so where vLLM looks for its cache is not known at "
                       "admission; set it with value: (or not at all) to get the preloaded cache")  # fmt: skip
    value = entry.get("value")
    if not isinstance(value, str) or not value.startswith("/"):
        return Unwired(name, CACHE_DIR_NOT_ABSOLUTE,
                       f"{VLLM_CACHE_ROOT_ENV}={value!r} is not an absolute path, so the cache cannot be mounted there")
    return None


def with_root(container: Mapping[str, Any], env: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[str]:
    """Wire ``container`` (its ``env`` and ``mounts``, changed in place) to vLLM's root in the bundle; the names of
    the variables added. Its own ``VLLM_CACHE_ROOT`` gets the volume's ``inductor/vllm`` mounted there; without
    one it gets the root under the inductor directory it sees (its own ``TORCHINDUCTOR_CACHE_DIR``, or ours)."""
    own = _entry(container, VLLM_CACHE_ROOT_ENV)
    if own is not None:
        point = posixpath.normpath(str(own.get("value")))
        if not any(m.get("name") == CACHE_VOLUME and m.get("mountPath") == point for m in mounts):
            mounts.append({"name": CACHE_VOLUME, "mountPath": point, "subPath": ROOT_SUB_PATH})
        return []
    inductor = _entry(container, CACHE_DIR_ENV)
    base = posixpath.normpath(str(inductor.get("value"))) if inductor is not None else INDUCTOR_DIR
    env.append({"name": VLLM_CACHE_ROOT_ENV, "value": f"{base}/{VLLM_ROOT_SUBDIR}"})
    return [VLLM_CACHE_ROOT_ENV]


def watch_command(prediction: Prediction) -> list[str]:
    """``compilecache vllm-watch`` for the pod's vLLM container: its port, and what the admission found."""
    return [
        "compilecache", "vllm-watch", "--cache-dir", INDUCTOR_DIR, "--port", str(prediction.port),
        "--prediction", json.dumps(prediction.to_json(), ensure_ascii=False, separators=(",", ":")),
    ]  # fmt: skip


def watch_container(
    prediction: Prediction, image: str, resources: Mapping[str, Any], security_context: Mapping[str, Any]
) -> dict[str, Any]:
    """The native sidecar that tells whether vLLM loaded the bundle (:mod:`cachelib.vllmwatch`): after the preload,
    on the cache volume, as the preload's user."""
    return {
        "name": VLLM_WATCH_CONTAINER,
        "image": image,
        "command": watch_command(prediction),
        "restartPolicy": "Always",
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}],
        "resources": dict(resources),
        "terminationMessagePolicy": "File",
        "securityContext": dict(security_context),
    }


def watched(predictions: Sequence[Prediction]) -> Prediction | None:
    """The vLLM container the sidecar watches: the first (a pod rarely runs two servers)."""
    return predictions[0] if predictions else None
