"""Logging in: in a pod, the API server's address as client-go takes it; outside a cluster, the kubeconfig,
with ``exec`` credential plugins.

Kopf's service-account login always names ``https://kubernetes.default.svc``, which needs the cluster's
DNS; client-go's in-cluster configuration uses ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``,
which the kubelet sets in every pod (:func:`in_cluster_server`), so the operator does the same.

Kopf's own kubeconfig login reads static credentials only; EKS, GKE and AKS kubeconfigs get a
token from a command (``aws eks get-token``, ``gke-gcloud-auth-plugin``, ``kubelogin``). This
runs that command as kubectl does (``client.authentication.k8s.io`` ExecCredential, the
``KUBERNETES_EXEC_INFO`` variable, the user entry's ``env``) and hands Kopf the token or client
certificate with its expiry, after which Kopf and :class:`compilecache_operator.edge.kube.KubeAPI`
log in again.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import yaml

EXEC_TIMEOUT = 60.0


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """``https://HOST:PORT`` from ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT`` (an IPv6 host in
    brackets), as client-go's in-cluster configuration; None unless both are set."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", "").strip(), env.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


class ExecCredentialError(Exception):
    """The kubeconfig's exec plugin could not give credentials; the message says why."""


def current_user(kubeconfig: str | None = None) -> Mapping[str, Any]:
    """The ``user`` entry of the current context (the first file of ``KUBECONFIG`` that names it wins)."""
    paths = [os.path.expanduser(p.strip()) for p in (kubeconfig or _kubeconfig_paths()).split(os.pathsep) if p.strip()]
    current: str | None = None
    contexts: dict[str, Any] = {}
    users: dict[str, Any] = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle) or {}
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item["name"], item.get("context") or {})
        for item in config.get("users") or []:
            users.setdefault(item["name"], item.get("user") or {})
    context = contexts.get(current or "", {})
    return dict(users.get(context.get("user", ""), {}))


def _kubeconfig_paths() -> str:
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def run_exec_plugin(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run the ``exec`` entry of a kubeconfig user; its ExecCredential ``status``."""
    command = spec.get("command")
    if not command:
        raise ExecCredentialError("kubeconfig user exec: no command")
    api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    env = dict(os.environ)
    env.update({str(e["name"]): str(e["value"]) for e in spec.get("env") or []})
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    argv = [str(command), *(str(a) for a in spec.get("args") or [])]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExecCredentialError(f"kubeconfig user exec {command!r}: {exc}") from exc
    if done.returncode != 0:
        raise ExecCredentialError(
            f"kubeconfig user exec {command!r} exited with {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    try:
        status = json.loads(done.stdout)["status"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ExecCredentialError(f"kubeconfig user exec {command!r} printed no ExecCredential status: {exc}") from exc
    if not isinstance(status, dict) or not (status.get("token") or status.get("clientCertificateData")):
        raise ExecCredentialError(f"kubeconfig user exec {command!r}: the ExecCredential has no token or certificate")
    return status


def exec_credentials(user: Mapping[str, Any]) -> dict[str, Any]:
    """The ConnectionInfo fields an ``exec`` user gives (empty for other users)."""
    spec = user.get("exec")
    if not isinstance(spec, Mapping):
        return {}
    status = run_exec_plugin(spec)
    fields: dict[str, Any] = {}
    if status.get("token"):
        fields["token"] = str(status["token"])
    if status.get("clientCertificateData"):
        fields["certificate_data"] = str(status["clientCertificateData"]).encode()
        fields["private_key_data"] = str(status.get("clientKeyData") or "").encode()
    if status.get("expirationTimestamp"):
        fields["expiration"] = datetime.fromisoformat(str(status["expirationTimestamp"]).replace("Z", "+00:00"))
    return fields
