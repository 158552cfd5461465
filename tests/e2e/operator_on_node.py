"""The operator as a process beside the real node, and kubectl against the session's control plane."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.infra.node import RealNode
from tests.operator.e2e_support import (
    OperatorProcess,
)
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient


def kubectl(cluster: LocalCluster, *args: str) -> str:
    from tests.infra.helm import ensure_binaries

    binary = ensure_binaries()["kubectl"]
    proc = subprocess.run([str(binary), "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def start_operator(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str, crd: None,
    tmp_path: Path, request: pytest.FixtureRequest,
) -> Iterator[Callable[..., OperatorProcess]]:
    """``start_operator(*flags)``: the operator for the test's namespace with extra flags; one at a time (a
    new call stops the previous one), all stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(*flags: str) -> OperatorProcess:
        if started:
            started[-1].stop()
        process = OperatorProcess(kube_cluster.kubeconfig, kube_namespace, tmp_path / f"operator{len(started)}",
                                  *flags)  # fmt: skip
        started.append(process)
        process.start(kube_client)
        return process

    yield start
    for process in started:
        process.stop()
        request.node.add_report_section("teardown", f"operator log {process.workdir.name}", process.log_tail())
    if started:
        started[-1].delete_webhook_config(kube_client)
