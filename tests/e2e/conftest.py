"""End-to-end fixtures: a real control plane on loopback, a real node (kubelet + containerd), and the node agent.

- ``kube_cluster`` (session): a started ``LocalCluster``; skipped when the binaries are absent, unless
  CI=true, where their absence is an error. Build them with ``tests/infra/kube/build.sh``.
- ``kube_client`` (session): a dict-based admin ``KubeClient`` (``kube_cluster.api()`` gives the
  ``kubernetes`` client instead).
- ``real_node`` (session): the node ``REAL_NODE_NAME``, a real kubelet with containerd and runc, its
  kube-scheduler and a CNI bridge (``tests/infra/node``; built by ``tests/infra/node/build.sh``), labelled
  nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 with 8 nvidia.com/gpu advertised (no GPU behind them: the
  workloads compile on the CPU). Our images run from ``podman save`` | ``ctr images import``:
  ``ghcr.io/compilecache/preloader:e2e`` and ``ghcr.io/compilecache/operator:e2e``; ``compilecache.test/workload``
  is the pybase image running the test virtualenv (mounted read-only) with the checkout on PYTHONPATH.
  Pods reach servers on the host at ``GATEWAY``: ``redis_server`` here binds it (test modules that import
  ``testsupport.servers.redis_server`` get a loopback one, for the node agent).
- ``node_agent`` (session): for the tests that have not moved to the real node (see docs/testing.md): the
  node ``gpu-node-1`` labelled nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3.
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

Both nodes can serve one session: the node agent only binds pods in the namespaces of the tests that ask
for it (its node is tainted, so the kube-scheduler never picks it), and the real node is cordoned while such
a test runs.

When an e2e test fails, the node's (or node agent's) events and container logs are attached to the report.
Set COMPILECACHE_TEST_KEEP=1 to keep the control plane's directory (certificates, etcd data, process logs),
the real node's work directory and the node agent's root (pod directories and container logs) after the
session.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.infra.kube.cluster import BinariesMissing, LocalCluster, find_binaries
from tests.infra.kube.namespaces import create_namespace, delete_namespace
from tests.infra.kube.rest import KubeClient
from tests.infra.node import (
    GATEWAY,
    PROJECT_TAGS,
    WORKLOAD_TAGS,
    NodeUnavailable,
    RealNode,
    Workload,
    ensure_workload_image,
)
from tests.infra.nodeagent import NodeAgent, Runtime
from testsupport.servers import RedisServer, start_redis

REPO_ROOT = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
GPU_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
NODE_NAME = "gpu-node-1"
REAL_NODE_NAME = "gpu-node-0"
STARTED_NODES: list[RealNode] = []
AGENT_TAINT = {"key": "compilecache.test/node-agent", "value": "true", "effect": "NoSchedule"}
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


def unavailable(reason: str) -> None:
    """Skip, or with CI=true fail: CI never passes by skipping."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


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
    node = funcargs.get("real_node")
    if report.failed and isinstance(node, RealNode):
        report.sections.append(("real node", node.describe(funcargs.get("kube_namespace"))))


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[LocalCluster]:
    try:
        binaries = find_binaries()
    except BinariesMissing as missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {missing}")
        pytest.skip(str(missing))
    with LocalCluster(binaries, keep_workdir=KEEP, kubelet_client=True) as cluster:
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


def workload() -> Workload:
    """The test virtualenv, the checkout and the byte-code cache: mounted read-only into every container."""
    pycache = os.environ.get("PYTHONPYCACHEPREFIX")
    return Workload(python_bin_dir().parent, REPO_ROOT, Path(pycache) if pycache and Path(pycache).is_dir() else None)


@pytest.fixture(scope="session")
def real_node(kube_cluster: LocalCluster) -> Iterator[RealNode]:
    from tests.infra.images import ImagesUnavailable, current_references

    try:
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
    except (NodeUnavailable, ImagesUnavailable) as reason:
        unavailable(str(reason))
    with node:
        STARTED_NODES.append(node)
        print(f"\nreal node {node.name} Ready in {node.times.ready:.1f}s (containerd {node.times.containerd:.1f}s, "
              f"images {node.times.images:.1f}s; {node.workdir})")
        yield node


@pytest.fixture(scope="session")
def redis_server(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """redis-server on loopback and on the bridge's gateway; its URLs name the gateway, which pods and the host
    both reach."""
    # Protected mode refuses clients from other addresses (the pods) while the default user has no password.
    extra = ("--bind", f"127.0.0.1 {GATEWAY}", "--protected-mode", "no")
    with start_redis(tmp_path_factory.mktemp("redis-node"), extra=extra) as server:
        yield dataclasses.replace(server, host=GATEWAY)


@pytest.fixture(scope="session")
def _node_agent_session(kube_cluster: LocalCluster) -> Iterator[NodeAgent]:
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
        namespaces=set(),
    )
    with agent:
        client = kube_cluster.client()
        try:
            client.merge_patch(f"/api/v1/nodes/{NODE_NAME}", {"spec": {"taints": [AGENT_TAINT]}})
        finally:
            client.close()
        yield agent


@pytest.fixture
def node_agent(_node_agent_session: NodeAgent, kube_client: KubeClient, request: pytest.FixtureRequest
               ) -> Iterator[NodeAgent]:
    """The node agent, serving the namespaces this test makes; the real node (if started) is cordoned meanwhile."""
    node = f"/api/v1/nodes/{REAL_NODE_NAME}"
    real = bool(STARTED_NODES)
    if real:
        kube_client.merge_patch(node, {"spec": {"unschedulable": True}})
    try:
        yield _node_agent_session
    finally:
        _node_agent_session.namespaces = set()
        if real:
            kube_client.merge_patch(node, {"spec": {"unschedulable": None}})


@pytest.fixture
def namespace_factory(kube_client: KubeClient, request: pytest.FixtureRequest) -> Iterator[Callable[[str | None], str]]:
    """Makes fresh namespaces at a Pod Security level ("restricted", "baseline", "privileged", None: no label);
    deletes them afterwards. In a test that asks for ``node_agent``, the agent serves them."""
    made: list[str] = []
    agent = request.getfixturevalue("node_agent") if "node_agent" in request.fixturenames else None

    def make(pod_security: str | None) -> str:
        made.append(create_namespace(kube_client, pod_security))
        if agent is not None:
            assert agent.namespaces is not None
            agent.namespaces.add(made[-1])
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
