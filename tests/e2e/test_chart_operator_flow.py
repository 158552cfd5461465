"""The operator's whole flow with nothing but the chart's RBAC.

The chart is installed watching one namespace; the operator runs as a local process that authenticates as the
chart's ServiceAccount (in a pod it could not reach the API server: there is no kube-proxy, so the
``kubernetes`` Service's ClusterIP does not route, and the API server listens on loopback). The pods it makes
run on the real node. The chart's own
MutatingWebhookConfiguration is pointed at the operator on loopback (the only change: its clientConfig), the
CompileCache names a Redis password Secret (read through the RoleBinding of rbac.secretNamespaces), and the flow
runs: warm-up Job, bundle in Redis, Ready, labelled pod injected through the chart's webhook, preload hit,
counted. Nothing in the operator's log may have been refused. A storage Secret in a namespace the chart's RBAC
does not reach is bound by the command the CompileCache's condition prints.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from compilecache_operator.edge.certs import self_signed

from tests.chart.e2e_fixtures import VWC_API, Release
from tests.e2e.chart_releases import ChartOperator, point_webhook_at
from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.node import GATEWAY, RealNode
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer, start_redis
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm, pytest.mark.slow]

WARM_UP_TIMEOUT = 420
REDIS_PASSWORD = "s3cret-for-e2e"
# How a refused API call shows in the operator's log: its client's errors, Kopf's and the API server's wording.
REFUSED = re.compile(r"HTTP 403\b|\bForbidden\b|Not enough permissions|APIForbiddenError")


@pytest.fixture
def password_redis(real_node: RealNode, tmp_path: Path) -> Iterator[RedisServer]:
    with start_redis(tmp_path / "redis", password=REDIS_PASSWORD, extra=("--bind", f"127.0.0.1 {GATEWAY}")) as server:
        yield dataclasses.replace(server, host=GATEWAY)  # the address pods reach the host at


def test_operator_flow_under_the_charts_rbac(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str,
    install: Callable[..., Release], password_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    ns = kube_namespace
    release = install("--set", f"operator.watchNamespaces={{{ns}}}", "--set", f"rbac.secretNamespaces={{{ns}}}",
                      "--set", f"confinement.storeHosts={{{password_redis.host}:{password_redis.port}}}",
                      "--set", "confinement.storeSecrets={store}")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store"},
              "stringData": {"password": REDIS_PASSWORD}}
    kube_client.post(f"/api/v1/namespaces/{ns}/secrets", secret)

    cert_dir = tmp_path / "webhook-tls"
    cert_dir.mkdir()
    files = self_signed(["127.0.0.1"], cert_dir)
    assert files.ca is not None
    kubeconfig = kube_cluster.write_kubeconfig(
        release.service_account, ("system:serviceaccounts", f"system:serviceaccounts:{release.namespace}"))
    operator = ChartOperator(kubeconfig, ns, tmp_path / "operator", release.fullname, cert_dir,
                             "--check-caches-at-admission")
    hook = point_webhook_at(kube_client, release.fullname,
                            f"https://127.0.0.1:{operator.webhook_port}/inject-pods", files.ca.read_bytes())
    assert hook["webhooks"][0]["failurePolicy"] == "Ignore"
    point_webhook_at(kube_client, release.fullname, f"https://127.0.0.1:{operator.webhook_port}/validate-caches",
                     files.ca.read_bytes(), VWC_API)

    operator.start(kube_client)
    try:
        store_url = f"redis://{password_redis.host}:{password_redis.port}/0?prefix=t{uuid.uuid4().hex[:12]}"
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
            "image": WORKLOAD_IMAGE,
            "model": {"target": "tiny_mlp"},
            "storage": {"url": store_url, "secretRef": {"name": "store"}},
        }))
        cache = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "True", WARM_UP_TIMEOUT)
        (bundle,) = cache["status"]["bundles"]

        app = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", "pass"]}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "app", "labels": {"compilecache.io/cache": "mlp"}},
               "spec": restricted({"restartPolicy": "Never", "containers": [app]})}
        created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", pod)
        assert [c["name"] for c in created["spec"]["initContainers"]] == ["compilecache-preload"]
        assert ["--key", bundle["key"]] == created["spec"]["initContainers"][0]["command"][4:6]

        finished = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "app"), WARM_UP_TIMEOUT,
                            "the app pod to finish")
        assert finished["status"]["phase"] == "Succeeded", finished["status"]
        wait_for(lambda: operator.sample("compilecache_preloads_total", namespace=ns, cache="mlp", result="hit") == 1,
                 30, "the hit in /metrics")
        refused = REFUSED.findall(operator.log_tail(limit=10_000_000))
        assert not refused, f"the operator was refused something under the chart's RBAC: {refused[:5]}"
    finally:
        operator.stop()
        request.node.add_report_section("teardown", "operator log", operator.log_tail())


def test_a_storage_secret_the_charts_rbac_does_not_reach_is_bound_by_the_command_its_condition_prints(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode, kube_namespace: str,
    install: Callable[..., Release], kubectl_bin: Path, helm_env: dict[str, str], password_redis: RedisServer,
    tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    """A new team's namespace, not in rbac.secretNamespaces: the operator may not read its storage Secret. The
    CompileCache says so (SecretForbidden) with the kubectl command that binds the chart's secret-reader ClusterRole
    there; that command, run as printed by the namespace's admin, lets the operator read it: no Helm change."""
    ns = kube_namespace
    release = install("--set", f"operator.watchNamespaces={{{ns}}}",
                      "--set", f"confinement.storeHosts={{{password_redis.host}:{password_redis.port}}}",
                      "--set", "confinement.storeSecrets={store}",
                      # no webhook server here: CompileCaches are not sent to a check nobody answers
                      "--set", "confinement.admissionPolicy.enabled=false")
    deployment = kube_client.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{release.fullname}")
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    identity = [a for a in container["args"] if a.startswith(("--secret-reader-role=", "--service-account="))]
    assert len(identity) == 2, container["args"]
    kube_client.post(f"/api/v1/namespaces/{ns}/secrets", {"apiVersion": "v1", "kind": "Secret",
                                                          "metadata": {"name": "store"},
                                                          "stringData": {"password": REDIS_PASSWORD}})

    kubeconfig = kube_cluster.write_kubeconfig(
        release.service_account, ("system:serviceaccounts", f"system:serviceaccounts:{release.namespace}"))
    operator = e2e.OperatorProcess(kubeconfig, ns, tmp_path / "operator", "--webhook-config", "off", *identity)
    operator.spawn()
    try:
        wait_for(operator.ready, 60, "the operator ready")
        store_url = f"redis://{password_redis.host}:{password_redis.port}/0?prefix=t{uuid.uuid4().hex[:12]}"
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache("mlp", {
            "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"},
            "storage": {"url": store_url, "secretRef": {"name": "store"}}}))
        forbidden = e2e.wait_condition(kube_client, ns, "mlp", "Ready", "False", 60, reason="SecretForbidden")
        message = str(e2e.condition(forbidden, "Ready")["message"])
        assert message.startswith(f"spec.storage.secretRef.name: the operator may not read Secret 'store' in "
                                  f"namespace '{ns}'"), message
        command = shlex.split(message.split("allow it with: ", 1)[1])
        assert command[:3] == ["kubectl", "create", "rolebinding"], command
        subprocess.run([str(kubectl_bin), *command[1:]], env=helm_env, check=True, capture_output=True, timeout=60)

        def reason() -> str:
            return str(e2e.condition(kube_client.get(e2e.cache_path(ns, "mlp")), "Ready").get("reason", ""))

        wait_for(lambda: reason() not in ("", "SecretForbidden"), 60, "the Secret read once the binding exists")
        wait_for(lambda: e2e.jobs_of(kube_client, ns, "mlp"), 60, "a warm-up Job")
        assert REDIS_PASSWORD not in operator.log_tail(limit=10_000_000)
    finally:
        operator.stop()
        request.node.add_report_section("teardown", "operator log", operator.log_tail())
