"""Fixtures for the chart's e2e tests (tests/e2e/test_chart_*.py): helm against the local API server and
releases that are uninstalled after each test."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chart import CHART_DIR, helm, parse_manifests
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.namespaces import create_namespace, delete_namespace
from testsupport.kube.rest import KubeClient

__all__ = ["helm_bin", "helm_binaries", "kubectl_bin"]

CRDS_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MWC_API = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VWC_API = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CC_API = "/apis/compilecache.io/v1alpha1"


@dataclass
class Release:
    """One installed release of the chart."""

    name: str
    namespace: str
    helm_bin: Path
    env: dict[str, str]

    @property
    def fullname(self) -> str:
        return f"{self.name}-compilecache-operator"

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}"

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return helm(self.helm_bin, *args, "--namespace", self.namespace, env=self.env, check=check)

    def manifest(self) -> list[dict[str, Any]]:
        return parse_manifests(self.helm("get", "manifest", self.name).stdout)




@pytest.fixture
def helm_env(kube_cluster: LocalCluster, tmp_path: Path) -> dict[str, str]:
    """helm and kubectl talk to the local API server as admin; helm's own state stays in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
    env.update(KUBECONFIG=str(kube_cluster.kubeconfig), HELM_CACHE_HOME=str(tmp_path / "helm-cache"),
               HELM_CONFIG_HOME=str(tmp_path / "helm-config"), HELM_DATA_HOME=str(tmp_path / "helm-data"))
    return env


@pytest.fixture
def release_namespace(kube_client: KubeClient) -> Iterator[str]:
    """The release's namespace, enforcing the "restricted" Pod Security Standard like the workloads' ones."""
    name = create_namespace(kube_client, "restricted", prefix="ccs")
    yield name
    delete_namespace(kube_client, name)


@pytest.fixture
def install(helm_bin: Path, helm_env: dict[str, str], release_namespace: str
            ) -> Iterator[Callable[..., Release]]:
    """``install(*helm args)`` installs a release into release_namespace; every release is uninstalled after."""
    releases: list[Release] = []

    def _install(*args: str) -> Release:
        release = Release(f"r{uuid.uuid4().hex[:4]}", release_namespace, helm_bin, helm_env)
        # --take-ownership: the cluster-scoped CRD may already exist (other e2e tests install crds/ directly).
        # startupCheck off unless a test turns it on: its hook Job waits for an operator pod, which most of these
        # tests do not run (helm waits for a post-install hook whatever --wait says).
        release.helm("install", release.name, str(CHART_DIR), "--take-ownership", "--timeout", "60s",
                     "--set", "startupCheck.enabled=false", *args)
        releases.append(release)
        return release

    yield _install
    for release in releases:
        release.helm("uninstall", release.name, "--timeout", "60s", check=False)
