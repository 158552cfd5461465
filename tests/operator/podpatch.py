"""The pod as the API server will hold it after the webhook's patch (test helper)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from compilecache_operator.builders import PodPatch


def apply_pod_patch(pod: Mapping[str, Any], patch: PodPatch) -> dict[str, Any]:
    """The pod as it will be after ``patch``."""
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    if patch.init_containers is not None:
        spec["initContainers"] = copy.deepcopy(patch.init_containers)
    if patch.containers is not None:
        spec["containers"] = copy.deepcopy(patch.containers)
    if patch.volumes is not None:
        spec["volumes"] = copy.deepcopy(patch.volumes)
    if patch.annotations:
        out.setdefault("metadata", {}).setdefault("annotations", {}).update(patch.annotations)
    return out
