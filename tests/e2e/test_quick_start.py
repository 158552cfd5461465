"""The README's quick start, run as written against the local cluster with the real node.

The commands come out of README.md's ``<!-- quick-start -->`` block and run one by one in bash, with helm and
kubectl on the PATH and the cluster's admin kubeconfig. What the test substitutes, and only that:

- ``REDIS_URL`` (the README's own variable): a redis-server the real node's pods reach;
- the published image in examples/minimal.yaml and examples/warm-pod.yaml: the e2e workload image (nothing can
  be pulled here); the commands read copies of the examples with that one string replaced;
- the operator: the chart's Deployment cannot reach the API server from a pod here (no kube-proxy; the API
  server listens on loopback), so after ``helm install`` the operator runs as a host process with the
  installed Deployment's own arguments, with a token of the chart's ServiceAccount (the chart's RBAC), its
  webhooks on loopback: the chart's Mutating- and ValidatingWebhookConfiguration keep every field but their
  clientConfig. The preloader image is the locally built one;
- so ``helm install`` gets ``--set startupCheck.enabled=false``: the chart's post-install hook waits until the
  operator's webhook answers, which here happens only after ``helm install`` has returned (the hook is tested
  where the operator runs as the chart's pod: tests/e2e/test_chart_operator_pod.py).

The quick start ends with a Ready CompileCache and a pod whose preload hit: it started warm.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from compilecache_operator.edge.certs import self_signed

from tests.chart.e2e_fixtures import CRDS_API, MWC_API, VWC_API
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.operator.e2e_support import OperatorProcess
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import install_crd
from testsupport.kube.namespaces import delete_namespace
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_IMAGE = re.compile(r"^(\s*image:\s*)(\S+)$", re.M)
COMMAND_TIMEOUT = 1800
# Flags of the chart's Deployment that name what only exists in its pod; the host process sets its own.
POD_ONLY = ("--all-namespaces", "--namespace", "--webhook-", "--metrics-", "--health-", "--preloader-image")


def quick_start_commands() -> list[str]:
    """The commands of README.md's quick-start block, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- quick-start -->"):].split("```sh\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip() and not c.startswith("#")]


def workspace(directory: Path) -> Path:
    """Where the commands run: the chart as it is, the examples with the published image replaced."""
    (directory / "examples").mkdir(parents=True)
    (directory / "charts").symlink_to(ROOT / "charts")
    for example in (ROOT / "examples").glob("*.yaml"):
        text = PUBLISHED_IMAGE.sub(lambda m: m.group(1) + WORKLOAD_IMAGE, example.read_text())
        (directory / "examples" / example.name).write_text(text)
    return directory


class ChartOperator(OperatorProcess):
    """The operator with the installed Deployment's arguments, its webhook external (the chart's configuration)."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path, chart_args: list[str], cert_dir: Path,
                 operator_namespace: str, webhook_config: str) -> None:
        super().__init__(kubeconfig, namespace, workdir, *chart_args)
        self.webhook_config = webhook_config  # the chart's, which start() waits to see pointing at this process
        self.cert_dir = cert_dir
        self.operator_namespace = operator_namespace

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--webhook-config") + 1] = "external"
        return [*argv, "--webhook-cert-dir", str(self.cert_dir), "--operator-namespace", self.operator_namespace]

    def start(self, client: KubeClient, timeout: float = 60) -> None:
        """Started and ready: its webhooks answer (the chart's check of CompileCaches fails closed)."""
        super().start(client, timeout)
        wait_for(self.ready, timeout, "the operator ready, its webhooks listening")


def chart_arguments(client: KubeClient, deployment: dict[str, Any], scratch: Path) -> list[str]:
    """The Deployment's operator arguments a host process can use: files mounted from Secrets are read from the
    API and written under ``scratch``."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "operator"]
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    namespace = deployment["metadata"]["namespace"]
    args = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if flag.startswith(POD_ONLY):
            continue
        if value.startswith("/") and os.path.dirname(value) in mounts:
            secret = volumes[mounts[os.path.dirname(value)]]["secret"]["secretName"]
            data = client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret}")["data"]
            local = scratch / os.path.basename(value)
            local.write_bytes(base64.b64decode(data[os.path.basename(value)]))
            arg = f"{flag}={local}"
        args.append(arg)
    return args


def token_kubeconfig(cluster: LocalCluster, client: KubeClient, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount (TokenRequest, as a pod's projected token)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    token = client.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)["status"]["token"]
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in doc["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def adopt_crd(client: KubeClient, release: str, namespace: str) -> None:
    """An existing CRD (other e2e tests install crds/ directly) is handed to the release, as helm's own
    --take-ownership would; on a fresh cluster there is none and helm creates it."""
    with contextlib.suppress(KubeAPIError):
        client.request("PATCH", f"{CRDS_API}/compilecaches.compilecache.io", body={"metadata": {
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace}}},
            content_type="application/merge-patch+json")


@pytest.fixture
def cleanup(kube_client: KubeClient) -> Iterator[list[str]]:
    """Namespaces the quick start creates, deleted afterwards; and the CRD put back as the other e2e tests
    install it, without the release's annotations :func:`adopt_crd` wrote (a later ``helm install
    --take-ownership`` would find those fields owned by this test's client and refuse to apply)."""
    namespaces: list[str] = []
    yield namespaces
    for name in namespaces:
        delete_namespace(kube_client, name)
    install_crd(kube_client)


def test_the_readme_quick_start_works_as_written(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, redis_server: RedisServer,
    helm_bin: Path, kubectl_bin: Path, cleanup: list[str], tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    commands = quick_start_commands()
    assert commands[0].startswith("export REDIS_URL="), commands[0]
    install = next(c for c in commands if c.startswith("helm install "))
    words = shlex.split(install)
    release, release_ns = words[2], words[words.index("--namespace") + 1]
    (work_ns,) = [c.split()[-1] for c in commands if c.startswith("kubectl create namespace ")]
    cleanup += [work_ns, release_ns]

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
    env.update(KUBECONFIG=str(kube_cluster.kubeconfig), REDIS_URL=redis_server.store_url(),
               PATH=os.pathsep.join([str(helm_bin.parent), str(kubectl_bin.parent), env.get("PATH", "")]),
               HELM_CACHE_HOME=str(tmp_path / "helm-cache"), HELM_CONFIG_HOME=str(tmp_path / "helm-config"),
               HELM_DATA_HOME=str(tmp_path / "helm-data"))
    cwd = workspace(tmp_path / "quick-start")
    adopt_crd(kube_client, release, release_ns)

    operator: ChartOperator | None = None
    outputs: list[str] = []
    try:
        for command in commands[1:]:
            run = f"{command} --set startupCheck.enabled=false" if command is install else command
            proc = subprocess.run(["bash", "-c", run], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT)
            assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
            outputs.append(proc.stdout)
            if command is install:
                operator = start_chart_operator(kube_cluster, kube_client, release, release_ns, work_ns, tmp_path)
        result = json.loads(outputs[-1])
        assert result["result"] == "hit", result
        cache = kube_client.get(f"/apis/compilecache.io/v1alpha1/namespaces/{work_ns}/compilecaches/tiny-mlp")
        assert cache["status"]["bundles"][0]["key"] in result["hits"], (cache["status"], result)
    finally:
        if operator is not None:
            operator.stop()
            request.node.add_report_section("teardown", "operator log", operator.log_tail())
        subprocess.run(["helm", "uninstall", release, "--namespace", release_ns, "--timeout", "60s"], cwd=cwd,
                       env=env, capture_output=True, timeout=120)


def start_chart_operator(cluster: LocalCluster, client: KubeClient, release: str, release_ns: str, work_ns: str,
                         tmp_path: Path) -> ChartOperator:
    fullname = f"{release}-compilecache-operator"
    deployment = client.get(f"/apis/apps/v1/namespaces/{release_ns}/deployments/{fullname}")
    scratch = tmp_path / "chart-files"
    scratch.mkdir()
    cert_dir = tmp_path / "webhook-tls"
    cert_dir.mkdir()
    files = self_signed(["127.0.0.1"], cert_dir)
    assert files.ca is not None
    kubeconfig = token_kubeconfig(cluster, client, release_ns, fullname, tmp_path / "operator.kubeconfig")
    operator = ChartOperator(kubeconfig, work_ns, tmp_path / "operator", chart_arguments(client, deployment, scratch),
                             cert_dir, release_ns, fullname)
    for api, path in ((MWC_API, "inject-pods"), (VWC_API, "validate-caches")):
        config = client.get(f"{api}/{fullname}")
        for hook in config["webhooks"]:
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{operator.webhook_port}/{path}",
                                    "caBundle": base64.b64encode(files.ca.read_bytes()).decode()}
        client.request("PUT", f"{api}/{fullname}", body=config)
    operator.start(client)
    return operator
