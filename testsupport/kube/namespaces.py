"""Test namespaces with a Pod Security level, as the API server enforces it (Pod Security Admission)."""

from __future__ import annotations

import uuid

from testsupport.kube.rest import KubeClient
from testsupport.wait import wait_for


def create_namespace(client: KubeClient, pod_security: str | None = "restricted", prefix: str = "e2e",
                     make_default_account: bool = False) -> str:
    """A fresh namespace whose Pod Security level (``enforce``, ``warn`` and ``audit``) is ``pod_security``:
    the API server itself refuses the pods that break it (None: no label, the cluster's default). Waits for its
    ``default`` ServiceAccount, which the controller manager makes; with ``make_default_account`` (an API server
    without a controller manager) makes it itself."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    labels = {f"pod-security.kubernetes.io/{mode}": pod_security for mode in ("enforce", "warn", "audit")}
    metadata = {"name": name, "labels": labels if pod_security else {}}
    client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata})

    def default_account_exists() -> bool:
        return client.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default")

    # The ServiceAccount admission plugin rejects pods until the namespace's default account exists.
    if make_default_account:
        client.post(f"/api/v1/namespaces/{name}/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    wait_for(default_account_exists, 30, f"the default ServiceAccount in {name}")
    return name


def delete_namespace(client: KubeClient, name: str) -> None:
    client.delete_if_present(f"/api/v1/namespaces/{name}")
