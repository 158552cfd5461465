"""The "restricted" Pod Security Standard (Kubernetes v1.37 rules, baseline included) as a pure check
of a pod spec, for the unit tests of the warm-up Job and the pod patch. The end-to-end tests prove the
same against a real API server that enforces the standard; this one names the rule and the container
that breaks it.

https://kubernetes.io/docs/concepts/security/pod-security-standards/
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

ALLOWED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                             "projected", "secret", "image"})
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
GOOD_PROFILES = frozenset({"RuntimeDefault", "Localhost"})
VOLUME_KEYS = frozenset({"name"})


def containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(kind) or []:
            yield f"{kind}[{container.get('name')}]", container


def restricted_violations(spec: Mapping[str, Any]) -> list[str]:
    """Every rule of the restricted profile that ``spec`` (a pod spec) breaks, with where."""
    out: list[str] = []
    pod = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"pod: {key}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - VOLUME_KEYS
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {volume.get('name')}: type {sorted(kinds - ALLOWED_VOLUMES)} not allowed")
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {sysctl.get('name')}")
    if (pod.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: hostProcess")
    out += _selinux("pod", pod)
    out += _apparmor("pod", pod)
    if pod.get("runAsUser") == 0:
        out.append("pod: runAsUser 0")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in GOOD_PROFILES:
        out.append(f"pod: seccompProfile {pod_seccomp}")
    for where, container in containers(spec):
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            out.append(f"{where}: privileged")
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: hostProcess")
        if context.get("procMount") not in (None, "Default"):
            out.append(f"{where}: procMount {context.get('procMount')}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}: hostPort {port['hostPort']}")
        out += _selinux(where, context)
        out += _apparmor(where, context)
        if context.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            out.append(f"{where}: capabilities must drop ALL")
        added = set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            out.append(f"{where}: capabilities add {sorted(added)}")
        non_root = context.get("runAsNonRoot")
        if non_root is False or (non_root is None and pod.get("runAsNonRoot") is not True):
            out.append(f"{where}: runAsNonRoot must be true")
        if context.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in GOOD_PROFILES:
            out.append(f"{where}: seccompProfile {seccomp}")
        if seccomp is None and pod_seccomp not in GOOD_PROFILES:
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
    return out


def _selinux(where: str, context: Mapping[str, Any]) -> list[str]:
    options = context.get("seLinuxOptions") or {}
    out = []
    if options.get("type", "") not in SELINUX_TYPES:
        out.append(f"{where}: seLinuxOptions.type {options['type']}")
    for key in ("user", "role"):
        if options.get(key):
            out.append(f"{where}: seLinuxOptions.{key}")
    return out


def _apparmor(where: str, context: Mapping[str, Any]) -> list[str]:
    kind = (context.get("appArmorProfile") or {}).get("type")
    return [f"{where}: appArmorProfile {kind}"] if kind not in (None, "RuntimeDefault", "Localhost") else []
