"""End-to-end fixtures: a real control plane on loopback and one GPU node played by the local node agent.

- ``kube_cluster`` (session): a started ``LocalCluster``; skipped when the binaries are absent, unless
  CI=true, where their absence is an error. Build them with ``tests/infra/kube/build.sh``.
- ``kube_client`` (session): a dict-based admin ``KubeClient`` (``kube_cluster.api()`` gives the
  ``kubernetes`` client instead).
- ``node_agent`` (session): the node ``gpu-node-1`` labelled nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3.
  ``ghcr.io/compilecache/preloader*`` runs as a real container (podman) from the preloader image that
  tests/infra/images.py builds from images/preloader/Dockerfile: the preload (init container or native
  sidecar) and the warm-up's harness copy and publish steps, with their securityContext and volumes.
  Other images under ``ghcr.io/compilecache/`` run the project's CLI from the repository's virtualenv as
  uid 65532; images under
  ``compilecache.test/workload`` run the same virtualenv's Python (with torch), as root unless the pod
  says otherwise. Every process runs as the uid its pod spec gives it.
- ``kube_namespace`` (function): a fresh namespace enforcing the "restricted" Pod Security Standard,
  deleted afterwards; ``baseline_namespace`` enforces "baseline" only; ``namespace_factory(level)`` makes
  more, at any level (hostPath volumes need "privileged").

When an e2e test fails, the node agent's events and container logs are attached to the report. Set
COMPILECACHE_TEST_KEEP=1 to keep the control plane's directory (certificates, etcd data, process logs)
and the node agent's root (pod directories and container logs) after the session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.infra.kube.cluster import BinariesMissing, LocalCluster, find_binaries
from tests.infra.kube.namespaces import create_namespace, delete_namespace
from tests.infra.kube.rest import KubeClient
from tests.infra.nodeagent import NodeAgent, Runtime

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
GPU_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
NODE_NAME = "gpu-node-1"
PROJECT_IMAGE_PREFIX = "ghcr.io/compilecache/"
PRELOADER_IMAGE_PREFIX = "ghcr.io/compilecache/preloader"
IMAGE_UID = 65532  # the USER of our images
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


def preloader_runtime() -> Runtime | None:
    """The preloader image built by tests/infra/images.py, as a real container; None when it is not built
    (then the preloader runs as a local process, like the other project images). In CI it must be built."""
    from tests.infra.images import current_references, podman_usable

    reason = podman_usable()
    reference = None if reason else current_references().get("preloader")
    if reference:
        return Runtime(container_image=reference)
    why = reason or "the preloader image is not built for this checkout (python -m tests.infra.images)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {why}")
    print(f"\nthe preload runs as a local process, not a real container: {why}")
    return None


@pytest.fixture(scope="session")
def node_agent(kube_cluster: LocalCluster) -> Iterator[NodeAgent]:
    bin_dir = str(python_bin_dir())
    images = {
        PROJECT_IMAGE_PREFIX: Runtime(path=(bin_dir,), user=(IMAGE_UID, IMAGE_UID)),
        WORKLOAD_IMAGE_PREFIX: Runtime(path=(bin_dir,)),
    }
    preloader = preloader_runtime()
    if preloader is not None:
        images[PRELOADER_IMAGE_PREFIX] = preloader
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
def namespace_factory(kube_client: KubeClient) -> Iterator[Callable[[str | None], str]]:
    """Makes fresh namespaces at a Pod Security level ("restricted", "baseline", "privileged", None: no label);
    deletes them afterwards."""
    made: list[str] = []

    def make(pod_security: str | None) -> str:
        made.append(create_namespace(kube_client, pod_security))
        return made[-1]

    yield make
    for name in made:
        delete_namespace(kube_client, name)


@pytest.fixture
def pod_security_level() -> str:
    """The Pod Security level of ``kube_namespace``; a test picks another with
    ``@pytest.mark.parametrize("pod_security_level", ["baseline"])``."""
    return "restricted"


@pytest.fixture
def kube_namespace(namespace_factory: Callable[[str | None], str], pod_security_level: str) -> str:
    """A fresh namespace enforcing the "restricted" Pod Security Standard (or ``pod_security_level``),
    deleted afterwards."""
    return namespace_factory(pod_security_level)


@pytest.fixture
def baseline_namespace(namespace_factory: Callable[[str | None], str]) -> str:
    """A fresh namespace enforcing only the "baseline" Pod Security Standard, deleted afterwards."""
    return namespace_factory("baseline")
