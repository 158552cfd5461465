"""Reinstalling under another release name while the CRD was kept (``crds.keep``), with real helm on a real API
server, as docs/install.md says: the new install is refused on the kept CRD's ownership metadata, and either
documented way lets it adopt the CRD (the kubectl re-annotation, or ``helm install --take-ownership``)."""

from __future__ import annotations

import re
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.chart.chart import CHART_DIR, REPO_ROOT
from tests.chart.e2e_fixtures import CRDS_API, Release
from testsupport.kube.crd import CRD_NAME
from testsupport.kube.rest import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

QUICK = ("--set", "webhook.enabled=false", "--set", "startupCheck.enabled=false", "--timeout", "60s")


def documented_handover(new: str, namespace: str) -> list[list[str]]:
    """The kubectl commands of docs/install.md's reinstall paragraph, for release ``new`` in ``namespace``."""
    text = (REPO_ROOT / "docs" / "install.md").read_text()
    block = text[text.index("**Reinstalling under another release name**"):].split("```sh\n", 1)[1].split("```")[0]
    commands = [shlex.split(c) for c in re.sub(r"\\\n\s*", " ", block).strip().splitlines()]
    assert [c[:2] for c in commands] == [["kubectl", "annotate"], ["kubectl", "label"]], commands
    return [[a.replace("<release>", new).replace("<namespace>", namespace) for a in c] for c in commands]


def test_a_new_release_adopts_the_kept_crd_as_documented(
    kube_client: KubeClient, helm_bin: Path, kubectl_bin: Path, helm_env: dict[str, str], release_namespace: str,
) -> None:
    first, second, third = (Release(f"r{n}{uuid.uuid4().hex[:4]}", release_namespace, helm_bin, helm_env)
                            for n in "abc")
    first.helm("install", first.name, str(CHART_DIR), "--take-ownership", *QUICK)  # the session may hold the CRD
    first.helm("uninstall", first.name, "--timeout", "60s")
    crd = kube_client.get(f"{CRDS_API}/{CRD_NAME}")["metadata"]
    assert crd["annotations"]["meta.helm.sh/release-name"] == first.name  # kept, still the first release's

    refused = second.helm("install", second.name, str(CHART_DIR), *QUICK, check=False)
    assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, refused.stderr

    for command in documented_handover(second.name, release_namespace):
        proc = subprocess.run([str(kubectl_bin), *command[1:]], capture_output=True, text=True, env=helm_env,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
    try:
        second.helm("install", second.name, str(CHART_DIR), *QUICK)
    finally:
        second.helm("uninstall", second.name, "--timeout", "60s", check=False)

    # kubectl's field manager now owns the two annotations: helm 4's server-side apply must force them
    conflict = third.helm("install", third.name, str(CHART_DIR), "--take-ownership", *QUICK, check=False)
    assert conflict.returncode != 0 and 'conflict with "kubectl-annotate"' in conflict.stderr, conflict.stderr
    third.helm("uninstall", third.name, "--timeout", "60s", check=False)
    try:
        third.helm("install", third.name, str(CHART_DIR), "--take-ownership", "--force-conflicts", *QUICK)
        assert kube_client.get(f"{CRDS_API}/{CRD_NAME}")["metadata"]["annotations"][
            "meta.helm.sh/release-name"] == third.name
    finally:
        third.helm("uninstall", third.name, "--timeout", "60s", check=False)
