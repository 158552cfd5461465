"""Every values scenario as the API server itself judges it: ``helm template`` for the control plane's version,
then ``kubectl apply --server-side --dry-run=server`` of every object, the release's namespace enforcing the
"restricted" Pod Security level. The server runs its defaulting, validation (CRD schemas and CEL rules included)
and admission on each object, warns of nothing, and keeps nothing. Objects of other projects' CRDs (cert-manager's)
are not served here and are left to the schema checks of tests/chart/test_manifest_lint.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart import scenario_files
from tests.e2e.chart_releases import assert_the_server_accepts
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.helm]


@pytest.mark.parametrize("scenario", sorted(scenario_files()))
def test_the_api_server_accepts_every_scenario(scenario: str, kube_cluster: LocalCluster, kube_client: KubeClient,
                                               helm_bin: Path, kubectl_bin: Path, tmp_path: Path) -> None:
    assert_the_server_accepts(kube_cluster, kube_client, helm_bin, kubectl_bin, scenario, tmp_path)
