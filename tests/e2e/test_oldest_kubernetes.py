"""The chart on the oldest Kubernetes it supports: ``helm install`` against a control plane of
versions.env's KUBE_OLDEST_VERSION (its API server alone, built by testsupport/kube/build.sh beside the newest; etcd
shared; no controller manager: nothing here needs a controller, no pod runs),
the CRD's validation rules in force there, and the chart's check of CompileCaches at admission (a validating
webhook with matchConditions) refusing there as on the newest: the operator runs as a host process against that
API server, the chart's webhook configurations pointed at it (no node runs its pod here)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from compilecache_operator.edge.certs import self_signed

from tests.chart.chart import CHART_DIR, helm, parse_manifests, scenario_files
from tests.chart.e2e_fixtures import CC_API, CRDS_API, MWC_API, VWC_API
from tests.e2e.chart_releases import ChartOperator, assert_the_server_accepts, point_webhook_at
from testsupport import unavailable
from testsupport.builds import BuildFailed, wait_for_build
from testsupport.kube.cluster import BinariesMissing, LocalCluster, find_binaries, versions
from testsupport.kube.crd import CRD_NAME
from testsupport.kube.namespaces import create_namespace
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

OLDEST = versions()["KUBE_OLDEST_VERSION"]


def test_the_chart_states_the_oldest_version_everywhere() -> None:
    """Chart.yaml's kubeVersion, the docs and the version this file installs on name the same minimum."""
    minor = ".".join(OLDEST.split(".")[:2])
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={minor}.0-0"
    docs = CHART_DIR.parent.parent / "docs"
    for path, pattern in ((docs / "install.md", rf"Kubernetes {re.escape(minor)} or newer"),
                          (docs / "operator.md", rf"The oldest supported release is \*\*{re.escape(minor)}\*\*"),
                          (CHART_DIR / "README.md", rf"Kubernetes {re.escape(minor)} or newer")):
        assert re.search(pattern, path.read_text()), f"{path.name} does not say Kubernetes {minor} is the oldest"


@pytest.fixture(scope="module")
def oldest_cluster() -> Iterator[LocalCluster]:
    try:
        wait_for_build("oldest")
        binaries = find_binaries(OLDEST, controller_manager=False)
    except (BuildFailed, BinariesMissing) as missing:
        unavailable(str(missing))
    with LocalCluster(binaries) as cluster:
        yield cluster


def test_the_chart_installs_on_the_oldest_supported_kubernetes(oldest_cluster: LocalCluster, helm_bin: Path,
                                                               tmp_path: Path) -> None:
    operator: ChartOperator | None = None
    client = KubeClient(oldest_cluster.kubeconfig)
    try:
        assert client.get("/version")["gitVersion"] == f"v{OLDEST}"
        ns = create_namespace(client, "restricted", prefix="ccs", make_default_account=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
        env.update(KUBECONFIG=str(oldest_cluster.kubeconfig), HELM_CACHE_HOME=str(tmp_path / "cache"),
                   HELM_CONFIG_HOME=str(tmp_path / "config"), HELM_DATA_HOME=str(tmp_path / "data"))
        helm(helm_bin, "install", "old", str(CHART_DIR), "--namespace", ns, "--timeout", "60s",
             "--set", "storage.url=redis://redis.compilecache.svc:6379/0",
             "--set", "startupCheck.enabled=false", env=env)  # its hook Job waits for an operator pod: none runs here
        rendered = parse_manifests(helm(helm_bin, "get", "manifest", "old", "--namespace", ns, env=env).stdout)
        kinds = {m["kind"] for m in rendered}
        assert {"Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                "CustomResourceDefinition", "ClusterRole"} <= kinds
        fullname = next(m["metadata"]["name"] for m in rendered if m["kind"] == "ValidatingWebhookConfiguration")
        (check,) = client.get(f"{VWC_API}/{fullname}")["webhooks"]
        assert [c["name"] for c in check.get("matchConditions") or []] == ["not-being-deleted",
                                                                           "create-or-spec-change"], check

        def established() -> bool:
            conditions = client.get(f"{CRDS_API}/{CRD_NAME}").get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 30, "the chart's CRD to be established")
        cache = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                 "spec": {"image": "example/app:1", "model": {"target": "tiny_mlp"},
                          "storage": {"url": "redis://redis.compilecache.svc:6379/0"}}}
        path = f"{CC_API}/namespaces/{ns}/compilecaches"
        with pytest.raises(KubeAPIError) as unanswered:  # failurePolicy Fail, and no operator answers yet
            client.post(path, {**cache, "metadata": {"name": "early"}})
        assert "validate.compilecaches.compilecache.io" in unanswered.value.body
        operator = answering_operator(oldest_cluster, client, ns, fullname, tmp_path)
        client.post(path, {**cache, "metadata": {"name": "fits"}})
        outside = {**cache["spec"], "storage": {"url": "redis://collector.attacker.example:6379/0"}}
        with pytest.raises(KubeAPIError) as refused:
            client.post(path, {**cache, "metadata": {"name": "outside"}, "spec": outside})
        assert refused.value.status == 422
        assert "spec.storage.url: store collector.attacker.example:6379 is not on the operator's allow-list" in (
            refused.value.body)
        with pytest.raises(KubeAPIError) as refused:  # a CEL rule of the CRD, evaluated by this API server
            client.post(path, {**cache, "metadata": {"name": "x" * 210}})
        assert refused.value.status == 422 and "metadata.name" in refused.value.body
        for field, bad, said in (  # the CRD's newer rules, evaluated by this API server too
                ("warmup", {"gpuResourceName": "kubernetes.io/hostname"}, "must be an extended resource"),
                ("storage", {"url": "s3://bucket/p?endpoint=http://minio:0"}, "must be a number from 1 to 65535"),
                ("warmup", {"resources": {"limits": {"node.kubernetes.io/x": "1"}}}, "an extended resource")):
            with pytest.raises(KubeAPIError) as refused:
                client.post(path, {**cache, "metadata": {"name": "newer-rule"}, "spec": {**cache["spec"], field: bad}})
            assert refused.value.status == 422 and said in refused.value.body, refused.value.body
        helm(helm_bin, "uninstall", "old", "--namespace", ns, "--timeout", "60s", env=env)
    finally:
        if operator is not None:
            operator.stop()
        client.close()


@pytest.mark.parametrize("scenario", sorted(scenario_files()))
def test_the_oldest_api_server_accepts_every_scenario(scenario: str, oldest_cluster: LocalCluster, helm_bin: Path,
                                                      kubectl_bin: Path, tmp_path: Path) -> None:
    """As tests/e2e/test_chart_server_dry_run.py, on the oldest supported Kubernetes."""
    client = KubeClient(oldest_cluster.kubeconfig)
    try:
        assert_the_server_accepts(oldest_cluster, client, helm_bin, kubectl_bin, scenario, tmp_path,
                                  make_default_account=True)
    finally:
        client.close()


def answering_operator(cluster: LocalCluster, client: KubeClient, namespace: str, fullname: str,
                       tmp_path: Path) -> ChartOperator:
    """The operator (this checkout) as a host process with the chart's allow-list and its check at admission, the
    chart's webhook configurations pointed at it, every other field as the chart rendered it."""
    cert_dir = tmp_path / "webhook-tls"
    cert_dir.mkdir()
    files = self_signed(["127.0.0.1"], cert_dir)
    assert files.ca is not None
    operator = ChartOperator(cluster.kubeconfig, namespace, tmp_path / "operator", fullname, cert_dir,
                             "--check-caches-at-admission", "--allowed-store-hosts", "redis.compilecache.svc:6379",
                             "--allowed-store-secrets", "")
    for api, hook in ((MWC_API, "inject-pods"), (VWC_API, "validate-caches")):
        point_webhook_at(client, fullname, f"https://127.0.0.1:{operator.webhook_port}/{hook}", files.ca.read_bytes(),
                         api)
    operator.start(client)
    return operator


NEWER_CEL = {
    "isIP(self)": "ip",                        # Kubernetes 1.30's IP library
    "isCIDR(self)": "cidr",                    # and its CIDR library
    "!format.dns1123Label().validate(self).hasValue()": "format",  # 1.31's format library
    "isSemver(self)": "semver",                # 1.33's semver library
}
"""CRD rules that compile on the newest API server and not on the oldest: the libraries k8s.io/apiserver 0.29 lacks
(its pkg/cel/library has lists, regex, urls, quantity and authz only; pkg/cel/environment/base.go says when each
later one came)."""


def crd_with_rule(rule: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "probes.oldest.compilecache.test"},
        "spec": {"group": "oldest.compilecache.test", "scope": "Namespaced",
                 "names": {"plural": "probes", "singular": "probe", "kind": "Probe", "listKind": "ProbeList"},
                 "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                     "type": "object", "properties": {"spec": {"type": "object", "properties": {"address": {
                         "type": "string", "maxLength": 64, "x-kubernetes-validations": [{"rule": rule}]}}}}}}}]},
    }


@pytest.mark.parametrize("rule", sorted(NEWER_CEL))
def test_only_the_oldest_api_server_refuses_a_cel_rule_it_cannot_compile(
    rule: str, oldest_cluster: LocalCluster, kube_client: KubeClient,
) -> None:
    """What this file's API server catches and nothing else in the suite does: the OpenAPI schemas of the oldest
    version (kubeconform, tests/chart/test_manifest_lint.py) see a rule as a string, and the newest API server's
    dry-run (tests/e2e/test_chart_server_dry_run.py) compiles it with the newest CEL libraries."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    kube_client.request("POST", path, body=crd_with_rule(rule), query={"dryRun": "All"})  # the newest: accepted
    client = KubeClient(oldest_cluster.kubeconfig)
    try:
        with pytest.raises(KubeAPIError) as refused:
            client.request("POST", path, body=crd_with_rule(rule), query={"dryRun": "All"})
    finally:
        client.close()
    assert refused.value.status == 422, refused.value.body
    assert "compilation failed" in refused.value.body and "undeclared reference" in refused.value.body, (
        refused.value.body)
