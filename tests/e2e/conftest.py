"""End-to-end fixtures: a real control plane on loopback and one GPU node played by the local node agent.

- ``kube_cluster`` (session): a started ``LocalCluster``; skipped when the binaries are absent, unless
  CI=true, where their absence is an error. Build them with ``tests/infra/kube/build.sh``.
- ``kube_client`` (session): a dict-based admin ``KubeClient`` (``kube_cluster.api()`` gives the
  ``kubernetes`` client instead).
- ``node_agent`` (session): the node ``gpu-node-1`` labelled nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3.
  Images under ``ghcr.io/compilecache/`` run the project's CLI from the repository's virtualenv (with the
  harness at /opt/compilecache/harness.py); images under ``compilecache.test/workload`` run the same
  virtualenv's Python (with torch).
- ``kube_namespace`` (function): a fresh namespace, deleted afterwards.

When an e2e test fails, the node agent's events and container logs are attached to the report. Set
COMPILECACHE_TEST_KEEP=1 to keep the control plane's directory (certificates, etcd data, process logs)
and the node agent's root (pod directories and container logs) after the session.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infra.kube.cluster import BinariesMissing, LocalCluster, find_binaries
from tests.infra.kube.rest import KubeAPIError, KubeClient
from tests.infra.nodeagent import NodeAgent, Runtime
from tests.infra.wait import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
GPU_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
NODE_NAME = "gpu-node-1"
PROJECT_IMAGE_PREFIX = "ghcr.io/compilecache/"
WORKLOAD_IMAGE_PREFIX = "compilecache.test/workload"
WORKLOAD_IMAGE = f"{WORKLOAD_IMAGE_PREFIX}:cpu"
KEEP = os.environ.get("COMPILECACHE_TEST_KEEP") == "1"


def python_bin_dir() -> Path:
    """The repository's virtualenv bin directory, or the running interpreter's when there is none."""
    venv = REPO_ROOT / ".venv" / "bin"
    return venv if (venv / "python").exists() else Path(sys.executable).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    agent = funcargs.get("node_agent")
    if report.failed and isinstance(agent, NodeAgent):
        report.sections.append(("node agent", agent.describe(funcargs.get("kube_namespace"))))


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[LocalCluster]:
    try:
        binaries = find_binaries()
    except BinariesMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing}")
        pytest.skip(str(missing))
    with LocalCluster(binaries, keep_workdir=KEEP) as cluster:
        print(f"\nlocal control plane at {cluster.server} ready in {cluster.startup_seconds:.1f}s ({cluster.workdir})")
        yield cluster


@pytest.fixture(scope="session")
def kube_client(kube_cluster: LocalCluster) -> Iterator[KubeClient]:
    client = kube_cluster.client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def node_agent(kube_cluster: LocalCluster) -> Iterator[NodeAgent]:
    bin_dir = str(python_bin_dir())
    images = {
        PROJECT_IMAGE_PREFIX: Runtime(
            path=(bin_dir,),
            image_paths={"/opt/compilecache/harness.py": str(REPO_ROOT / "cachelib" / "harness.py")},
        ),
        WORKLOAD_IMAGE_PREFIX: Runtime(path=(bin_dir,)),
    }
    agent = NodeAgent(
        kube_cluster.kubeconfig,
        NODE_NAME,
        labels={GPU_LABEL: GPU_PRODUCT},
        capacity={"nvidia.com/gpu": "8"},
        images=images,
        keep_root=KEEP,
    )
    with agent:
        yield agent


@pytest.fixture
def kube_namespace(kube_client: KubeClient) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kube_client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def default_account_has_token() -> bool:
        account = kube_client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
        return bool(account.get("secrets"))

    # The ServiceAccount admission plugin rejects pods until the namespace's default token exists.
    wait_for(default_account_has_token, 30, f"the default ServiceAccount token in {name}")
    yield name
    try:
        kube_client.delete(f"/api/v1/namespaces/{name}")
    except KubeAPIError as error:
        if error.status != 404:
            raise
