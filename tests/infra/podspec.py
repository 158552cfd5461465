"""Pure functions the node agent uses to read pod specs and write pod status, the way a kubelet does."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

JSON = dict[str, Any]
TERMINATION_MESSAGE_LIMIT = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
DEFAULT_SCHEDULER = "default-scheduler"
TERMINAL_PHASES = ("Succeeded", "Failed")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- scheduling ----------------------------------------------------------------------------------------


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        try:
            actual, bound = int(labels[key]), int(values[0])
        except (KeyError, IndexError, ValueError):
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def node_affinity_matches(affinity: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """requiredDuringSchedulingIgnoredDuringExecution: any term matches, every expression of a term matches."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])
        and not term.get("matchFields")
        for term in terms
    )


def pod_fits_node(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether the default scheduler could put ``pod`` on a node with ``labels`` (taints and resources ignored)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName", DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
        return False
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    return node_affinity_matches(spec.get("affinity"), labels)


# -- paths and variables -------------------------------------------------------------------------------


def path_table(mounts: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """(container path, host path) pairs, longest container path first, trailing slashes dropped."""
    cleaned = [(c.rstrip("/"), h.rstrip("/") or "/") for c, h in mounts if c.rstrip("/")]
    return sorted(cleaned, key=lambda pair: len(pair[0]), reverse=True)


def _translate_path(value: str, table: Sequence[tuple[str, str]]) -> str | None:
    for container_path, host_path in table:
        if value == container_path or value == container_path + "/":
            return host_path
        if value.startswith(container_path + "/"):
            return host_path + value[len(container_path) :]
    return None


def translate(value: str, table: Sequence[tuple[str, str]]) -> str:
    """Rewrite a value that is (or starts with) a container path, also in ``--flag=PATH`` form."""
    translated = _translate_path(value, table)
    if translated is not None:
        return translated
    if value.startswith("-") and "=" in value:
        flag, rest = value.split("=", 1)
        translated = _translate_path(rest, table)
        if translated is not None:
            return f"{flag}={translated}"
    return value


_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables are replaced, unknown ones kept, $$ escapes $."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VARIABLE.sub(replace, value)


def field_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The value of a downward-API fieldRef; raise ValueError for an unsupported path."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        items = (meta.get(field_path.split(".")[1]) or {}).items()
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items))
    raise ValueError(f"unsupported fieldRef fieldPath {field_path!r}")


# -- status --------------------------------------------------------------------------------------------


def tail_of_log(data: bytes, lines: int = FALLBACK_LOG_LINES, limit: int = FALLBACK_LOG_BYTES) -> str:
    """The last ``lines`` lines, at most ``limit`` bytes, of a container's output."""
    tail = b"\n".join(data.rstrip(b"\n").split(b"\n")[-lines:])[-limit:]
    return tail.decode("utf-8", "replace")


def termination_message(file_content: bytes, log: bytes, policy: str, exit_code: int) -> str:
    """What the kubelet puts in ``state.terminated.message``."""
    message = file_content[:TERMINATION_MESSAGE_LIMIT].decode("utf-8", "replace")
    if not message and policy == "FallbackToLogsOnError" and exit_code != 0:
        return tail_of_log(log)
    return message


def exit_code_of(returncode: int) -> int:
    """Popen's returncode as a container exit code (killed by signal N → 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_state(exit_code: int, started_at: str, message: str, reason: str | None = None) -> JSON:
    state: JSON = {
        "exitCode": exit_code,
        "reason": reason or ("Completed" if exit_code == 0 else "Error"),
        "startedAt": started_at,
        "finishedAt": now_rfc3339(),
    }
    if message:
        state["message"] = message
    return state


def condition(kind: str, ok: bool, since: str, reason: str | None = None, message: str | None = None) -> JSON:
    entry: JSON = {"type": kind, "status": "True" if ok else "False", "lastProbeTime": None,
                   "lastTransitionTime": since}
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    return entry


def unready_message(kind: str, names: Sequence[str]) -> str:
    return f"containers with {kind} status: [{' '.join(names)}]"


# -- identity and volumes, as a kubelet applies them -------------------------------------------------------


def is_native_sidecar(container: Mapping[str, Any]) -> bool:
    """An init container with ``restartPolicy: Always`` (Kubernetes 1.29+): it keeps running beside the app."""
    return container.get("restartPolicy") == "Always"


def pod_fs_group(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    return None if value is None else int(value)


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
