"""The CompileCache CRD on a test control plane: where its API is, and installing the repository's own."""

from __future__ import annotations

from pathlib import Path

import yaml

from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "compilecache.io_compilecaches.yaml"
CRD_NAME = "compilecaches.compilecache.io"
CC_API = "/apis/compilecache.io/v1alpha1"


def install_crd(client: KubeClient) -> None:
    """Create or replace the canonical CRD and wait until it is established."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    try:
        client.post(path, crd)
    except KubeAPIError as error:
        if error.status != 409:
            raise
        current = client.get(f"{path}/{CRD_NAME}")
        crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        client.request("PUT", f"{path}/{CRD_NAME}", body=crd)

    def established() -> bool:
        conditions = client.get(f"{path}/{CRD_NAME}").get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, 30, "the CompileCache CRD to be established")
