"""A second served version of the CRD, converted by the operator's webhook server on a real API server.

The CRD serves one version today (``conversion: None``). This is the path the first schema change takes: the test
serves a version of its own beside ``v1alpha1`` (its schema the same but ``spec.image`` named
``spec.containerImage``), registers its rename with the operator's conversion table
(:mod:`compilecache_operator.model.conversion`) in the operator process it starts, and points the CRD's
``spec.conversion.webhook`` at the operator's ``/convert``. An object stored as v1alpha1 is read as the new
version and back, one created as the new version is stored as v1alpha1, and storedVersions stays v1alpha1. The
CRD is put back as crds/ has it afterwards.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CRD_NAME, CRD_PATH, install_crd
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e]

CRDS_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
NEW = "v1alpha2test"
RENAMES = (("spec.image", "spec.containerImage"),)
REGISTER = (
    "import sys; from compilecache_operator import main; from compilecache_operator.model import conversion; "
    f"conversion.VERSIONS[{NEW!r}] = conversion.Version(renames={RENAMES!r}); sys.exit(main.main(sys.argv[1:]))"
)


class ConvertingOperator(e2e.OperatorProcess):
    """The operator with the test's version in its conversion table (as a release adding it would have)."""

    def argv(self) -> list[str]:
        own = super().argv()
        assert own[1:3] == ["-m", "compilecache_operator.main"]
        return [sys.executable, "-c", REGISTER, *own[3:]]


def with_new_version(crd_body: dict[str, Any], url: str, ca_bundle: str) -> dict[str, Any]:
    """The CRD serving NEW beside v1alpha1 (the storage version), converted by the webhook at ``url``."""
    out = copy.deepcopy(crd_body)
    (hub,) = out["spec"]["versions"]
    new = copy.deepcopy(hub)
    new.update(name=NEW, storage=False)
    spec = new["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["containerImage"] = spec["properties"].pop("image")
    spec["required"] = ["containerImage" if r == "image" else r for r in spec["required"]]
    assert "self.image" not in yaml.safe_dump(new), "a CEL rule names the renamed field: rename it there too"
    out["spec"]["versions"] = [hub, new]
    out["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"], "clientConfig": {"url": url, "caBundle": ca_bundle}}}
    return out


def put_crd(client: KubeClient, body: dict[str, Any]) -> None:
    current = client.get(f"{CRDS_API}/{CRD_NAME}")
    body = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    client.request("PUT", f"{CRDS_API}/{CRD_NAME}", body=body)


@pytest.fixture
def converting_operator(kube_cluster: LocalCluster, kube_client: KubeClient, kube_namespace: str, crd: None,
                        tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ConvertingOperator]:
    yield from e2e.run_operator(ConvertingOperator(kube_cluster.kubeconfig, kube_namespace, tmp_path / "operator"),
                            kube_client, request)


def test_a_stored_v1alpha1_object_is_read_as_a_second_version_and_back(
    converting_operator: ConvertingOperator, kube_client: KubeClient, kube_namespace: str,
) -> None:
    ns = kube_namespace
    config = kube_client.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                             f"{converting_operator.webhook_config}")
    client_config = config["webhooks"][0]["clientConfig"]  # the operator's own server and CA
    url = client_config["url"].rsplit("/", 1)[0] + "/convert"
    crd_body = yaml.safe_load(CRD_PATH.read_text())
    old_api, new_api = f"/apis/compilecache.io/v1alpha1/namespaces/{ns}/compilecaches", \
        f"/apis/compilecache.io/{NEW}/namespaces/{ns}/compilecaches"
    put_crd(kube_client, with_new_version(crd_body, url, client_config["caBundle"]))
    try:
        def served() -> bool:
            try:
                kube_client.get(new_api)
            except KubeAPIError as error:
                if error.status in (404, 503):
                    return False
                raise
            return True

        wait_for(served, 60, f"the CRD to serve {NEW}")
        kube_client.post(old_api, e2e.compile_cache("stored-old", {"image": "registry.example/app:1",
                                                               "model": {"target": "tiny_mlp"}}))
        as_new = kube_client.get(f"{new_api}/stored-old")
        assert as_new["apiVersion"] == f"compilecache.io/{NEW}"
        assert as_new["spec"]["containerImage"] == "registry.example/app:1" and "image" not in as_new["spec"]
        assert [i["metadata"]["name"] for i in kube_client.get(new_api)["items"]] == ["stored-old"]

        created = {**e2e.compile_cache("made-new", {"containerImage": "registry.example/app:2",
                                                "model": {"target": "tiny_mlp"}}),
                   "apiVersion": f"compilecache.io/{NEW}"}
        kube_client.post(new_api, created)
        as_old = kube_client.get(f"{old_api}/made-new")
        assert as_old["spec"]["image"] == "registry.example/app:2" and "containerImage" not in as_old["spec"]
        # a change through the new version lands on the stored object
        change = {"spec": {"containerImage": "registry.example/app:3"}}
        kube_client.request("PATCH", f"{new_api}/stored-old", body=change, content_type="application/merge-patch+json")
        assert kube_client.get(f"{old_api}/stored-old")["spec"]["image"] == "registry.example/app:3"
        stored = kube_client.get(f"{CRDS_API}/{CRD_NAME}")["status"]["storedVersions"]
        assert stored == ["v1alpha1"], stored
    finally:
        kube_client.delete_if_present(f"{old_api}/stored-old", f"{old_api}/made-new")
        install_crd(kube_client)  # back to crds/: one version, no conversion
