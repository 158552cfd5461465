"""Pod specs as the tests write them: the "restricted" form of a pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]

RESTRICTED_CONTAINER_CONTEXT: JSON = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted(pod_spec: Mapping[str, Any], uid: int = 1000, gid: int = 1000, fs_group: int | None = None) -> JSON:
    """``pod_spec`` made compliant with the "restricted" Pod Security Standard, running as ``uid``:``gid``
    (a pod of a careful user; what the tests' workloads look like in restricted namespaces)."""
    context: JSON = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid,
                     "seccompProfile": {"type": "RuntimeDefault"}}
    if fs_group is not None:
        context["fsGroup"] = fs_group
    spec = dict(pod_spec)
    spec["securityContext"] = {**context, **(pod_spec.get("securityContext") or {})}
    for kind in ("initContainers", "containers"):
        if kind in spec:
            spec[kind] = [{**c, "securityContext": {**RESTRICTED_CONTAINER_CONTEXT, **(c.get("securityContext") or {})}}
                          for c in spec[kind]]
    return spec
