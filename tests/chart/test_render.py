"""helm lint and helm template of every scenario, schema validation and the chart's structural promises."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.chart.chart import (
    CHART_DIR,
    NAMESPACE,
    Manifest,
    helm,
    of_kind,
    one,
    operator_container,
    rbac_rules,
    scenario_files,
    template,
)
from tests.chart.verbs_from_code import used_verbs

pytestmark = pytest.mark.helm

SCENARIOS = scenario_files()
# Kinds whose schemas are not part of Kubernetes (CRD instances): kubernetes-validate ships none for them.
NON_CORE_KINDS = {
    "ServiceMonitor": "prometheus-operator CRD",
    "PrometheusRule": "prometheus-operator CRD",
    "Certificate": "cert-manager CRD",
    "Issuer": "cert-manager CRD",
}
SCHEMA_VERSION = kubernetes_validate.utils.latest_version()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_strict(helm_bin: Path, scenario: str) -> None:
    values = SCENARIOS[scenario]
    args = ["lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE]
    if values is not None:
        args += ["--values", str(values)]
    out = helm(helm_bin, *args).stdout
    assert "0 chart(s) failed" in out


def test_lint_rejects_values_outside_the_schema(helm_bin: Path) -> None:
    proc = helm(helm_bin, "lint", str(CHART_DIR), "--set", "webhook.failurePolicy=Sometimes", check=False)
    assert proc.returncode != 0
    assert "failurePolicy" in proc.stdout + proc.stderr


def test_native_sidecars_value_reaches_the_operator(helm_bin: Path, tmp_path: Path) -> None:
    """The switch in any spelling YAML gives it (a bare on/off is a boolean), and nothing else."""
    values = tmp_path / "values.yaml"
    for text, flag in (("on", "on"), ("'off'", "off"), ("false", "off"), ("auto", "auto")):
        values.write_text(f"nativeSidecars: {text}\n")
        assert f"--native-sidecars={flag}" in operator_container(template(helm_bin, values))["args"]
    proc = helm(helm_bin, "lint", str(CHART_DIR), "--set", "nativeSidecars=sometimes", check=False)
    assert proc.returncode != 0
    assert "nativeSidecars" in proc.stdout + proc.stderr


def test_bad_digest_is_refused_with_its_value(helm_bin: Path) -> None:
    # The schema refuses it first; the template's own check names the value too (when schema checks are skipped).
    proc = helm(helm_bin, "template", "cc", str(CHART_DIR), "--skip-schema-validation",
                "--set", "images.operator.digest=sha256:nothex", check=False)
    assert proc.returncode != 0
    assert "sha256:nothex" in proc.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rendered_objects_validate_against_kubernetes_schemas(renderings: dict[str, list[Manifest]],
                                                               scenario: str) -> None:
    """Every object of a Kubernetes kind validates (strict: no unknown fields) against the newest schemas
    kubernetes-validate ships; kinds of other projects' CRDs are listed in NON_CORE_KINDS and skipped."""
    validated = 0
    for manifest in renderings[scenario]:
        if manifest["kind"] in NON_CORE_KINDS:
            continue
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        try:
            kubernetes_validate.validate(manifest, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{scenario}: {name} is invalid for Kubernetes {SCHEMA_VERSION}: {error.message} "
                        f"at {'/'.join(str(p) for p in error.absolute_path)}")
        validated += 1
    assert validated >= 3


def test_every_optional_branch_is_rendered_by_some_scenario(renderings: dict[str, list[Manifest]]) -> None:
    """The ci/ files together switch on every optional branch of the templates."""

    def webhook(ms: list[Manifest]) -> Manifest | None:
        found = of_kind(ms, "MutatingWebhookConfiguration")
        return found[0] if found else None

    def crd(ms: list[Manifest]) -> Manifest | None:
        found = of_kind(ms, "CustomResourceDefinition")
        return found[0] if found else None

    def args(ms: list[Manifest]) -> list[str]:
        return list(operator_container(ms)["args"]) if of_kind(ms, "Deployment") else []

    branches = {
        "cert-manager self-signed Issuer": lambda ms: bool(of_kind(ms, "Issuer")),
        "cert-manager Certificate from an existing issuer": lambda ms: bool(of_kind(ms, "Certificate"))
        and not of_kind(ms, "Issuer"),
        "certificate made by the operator": lambda ms: any(a.startswith("--webhook-cert-secret=") for a in args(ms)),
        "signing key made by the operator": lambda ms: any(a.startswith("--signing-key-secret=") for a in args(ms)),
        "signing key from an existing Secret": lambda ms: any(a.startswith("--signing-key-file=") for a in args(ms)),
        "ServiceMonitor": lambda ms: bool(of_kind(ms, "ServiceMonitor")),
        "PrometheusRule": lambda ms: bool(of_kind(ms, "PrometheusRule")),
        "Grafana dashboard": lambda ms: any("grafana_dashboard" in c["metadata"]["labels"]
                                            for c in of_kind(ms, "ConfigMap")),
        "CRD with keep": lambda ms: (c := crd(ms)) is not None
        and c["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep",
        "CRD without keep": lambda ms: (c := crd(ms)) is not None and "annotations" not in c["metadata"],
        "CRD disabled": lambda ms: crd(ms) is None,
        "webhook disabled": lambda ms: webhook(ms) is None,
        "failurePolicy Fail": lambda ms: (w := webhook(ms)) is not None and w["webhooks"][0]["failurePolicy"] == "Fail",
        "image digests": lambda ms: bool(of_kind(ms, "Deployment")) and "@sha256:" in operator_container(ms)["image"]
        and any(a.startswith("--preloader-image=") and "@sha256:" in a for a in args(ms)),
        "pull secrets": lambda ms: bool(of_kind(ms, "Deployment"))
        and bool(one(ms, "Deployment")["spec"]["template"]["spec"].get("imagePullSecrets")),
        "node cache hostPath": lambda ms: any(a.startswith("--node-cache-path=/") for a in args(ms)),
        "namespaced Roles for the watched namespaces": lambda ms: len([
            r for r in of_kind(ms, "Role") if r["metadata"]["name"] == one(ms, "Deployment")["metadata"]["name"]]) > 1,
        "secrets in several namespaces": lambda ms: len({b["metadata"]["namespace"] for b in of_kind(ms, "RoleBinding")
                                                         if b["roleRef"]["name"].endswith("-secret-reader")}) > 1,
        "no RBAC, existing ServiceAccount": lambda ms: not of_kind(ms, "ClusterRole")
        and not of_kind(ms, "ServiceAccount"),
        "default store with a credentials Secret": lambda ms: any(a.startswith("--default-storage-secret=")
                                                                  for a in args(ms)),
        "helm test lists the store": lambda ms: any(c["name"] == "store" for p in of_kind(ms, "Pod")
                                                    for c in p["spec"]["containers"]),
        "text logs and verbose": lambda ms: {"--log-format=text", "--verbose"} <= set(args(ms)),
        "watch listed namespaces": lambda ms: any(a.startswith("--namespace=") for a in args(ms)),
        "webhook server off": lambda ms: "--webhook-config=off" in args(ms),
    }
    missing = [name for name, seen in branches.items() if not any(seen(ms) for ms in renderings.values())]
    assert not missing, f"no ci/ scenario renders: {missing}"


def test_operator_deployment_is_rolled_hardened_and_highly_available(default_rendering: list[Manifest]) -> None:
    deployment = one(default_rendering, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    budget = one(default_rendering, "PodDisruptionBudget")["spec"]
    assert budget["minAvailable"] == 1 and budget["selector"] == spec["selector"]
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(default_rendering)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    health_port = next(p["containerPort"] for p in container["ports"] if p["name"] == probe["port"])
    assert health_port == 8081
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    namespace = deployment["metadata"]["namespace"]
    assert f"--leader-election-namespace={namespace}" in container["args"]
    assert pod["terminationGracePeriodSeconds"] > 5 and "--shutdown-delay=5" in container["args"]
    lease_rules = [r for role in of_kind(default_rendering, "Role") if role["metadata"]["namespace"] == namespace
                   for r in role["rules"] if "leases" in r["resources"]]
    lease = one(default_rendering, "Deployment")["metadata"]["name"]  # --leader-election-name: the full name
    assert lease_rules == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
                            "verbs": ["get", "update"]},
                           {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    assert "--health-port=8081" in container["args"]
    assert "--webhook-config=external" in container["args"]
    assert "--all-namespaces" in container["args"]
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])  # writable scratch on a read-only root
    assert pod["serviceAccountName"] == one(default_rendering, "ServiceAccount")["metadata"]["name"]


def test_webhook_fails_open_and_only_sees_labelled_pods(default_rendering: list[Manifest]) -> None:
    (hook,) = one(default_rendering, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] in ("IfNeeded", "Never")
    assert 1 <= hook["timeoutSeconds"] <= 30
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"], "scope": "Namespaced"}]
    assert hook["objectSelector"] == {"matchExpressions": [{"key": "compilecache.io/cache", "operator": "Exists"}]}
    (exclusion,) = [e for e in hook["namespaceSelector"]["matchExpressions"]
                    if e["key"] == "kubernetes.io/metadata.name"]
    assert exclusion["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(exclusion["values"])
    service = hook["clientConfig"]["service"]
    webhook_service = one(default_rendering, "Service", "-webhook")
    assert service["name"] == webhook_service["metadata"]["name"]
    assert service["namespace"] == NAMESPACE
    assert service["port"] == webhook_service["spec"]["ports"][0]["port"]
    assert service["path"] == "/inject-pods"
    target = webhook_service["spec"]["ports"][0]["targetPort"]
    ports = {p["name"]: p["containerPort"] for p in operator_container(default_rendering)["ports"]}
    assert f"--webhook-port={ports[target]}" in operator_container(default_rendering)["args"]


def test_webhook_path_is_the_operators_handler_id(default_rendering: list[Manifest]) -> None:
    from compilecache_operator.model.names import WEBHOOK_ID

    (hook,) = one(default_rendering, "MutatingWebhookConfiguration")["webhooks"]
    assert hook["clientConfig"]["service"]["path"] == f"/{WEBHOOK_ID}"


def test_release_namespace_stays_excluded_when_more_are_listed(helm_bin: Path) -> None:
    rendered = template(helm_bin, set_values=["webhook.excludeNamespaces={monitoring}"], namespace="ops")
    (hook,) = one(rendered, "MutatingWebhookConfiguration")["webhooks"]
    values = hook["namespaceSelector"]["matchExpressions"][0]["values"]
    assert set(values) == {"kube-system", "ops", "monitoring"}


# The verbs the operator uses, per (apiGroup, resource), read from its code (tests/chart/test_rbac_from_code.py);
# anything else in a rule is a test failure.
EXPECTED_VERBS = used_verbs()


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_is_least_privilege(renderings: dict[str, list[Manifest]], scenario: str) -> None:
    rendered = renderings[scenario]
    granted: dict[tuple[str, str], set[str]] = {}
    for role, rule in rbac_rules(rendered):
        where = f"{scenario}: {role['kind']}/{role['metadata']['name']}"
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"{where} has a wildcard in {field}"
        assert "resourceNames" not in rule or rule["resourceNames"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key in EXPECTED_VERBS, f"{where} grants {key}, which the operator does not use"
                assert set(rule["verbs"]) <= EXPECTED_VERBS[key], f"{where}: {key} {rule['verbs']}"
                granted.setdefault(key, set()).update(rule["verbs"])
                if resource == "secrets" and role["kind"] == "ClusterRole":
                    assert rule["verbs"] == ["get"], f"{where}: a ClusterRole grants no more than get of Secrets"
                    bound = [b for b in of_kind(rendered, "ClusterRoleBinding")
                             if b["roleRef"]["name"] == role["metadata"]["name"]]
                    assert not bound, f"{where}: Secrets are granted per namespace only, never by a ClusterRoleBinding"
                if resource == "secrets" and set(rule["verbs"]) - {"get"}:  # the operator's own keys only
                    assert role["metadata"]["namespace"] == NAMESPACE, where
                    assert rule["verbs"] == ["create"] or rule.get("resourceNames"), where
                if resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
                    assert rule["resourceNames"] == [one(rendered, "MutatingWebhookConfiguration")["metadata"]["name"]]
    if not of_kind(rendered, "ClusterRole"):
        return  # rbac.create=false
    keeps_secrets = any(a.startswith(("--webhook-cert-secret=", "--signing-key-secret="))
                        for a in operator_container(rendered)["args"])
    expected = {**EXPECTED_VERBS, **({} if keeps_secrets else {("", "secrets"): {"get"}})}
    assert granted == {k: v for k, v in expected.items() if k in granted}
    # The webhook's index of the namespaces' Pod Security labels: in every mode.
    assert granted[("", "namespaces")] == {"list", "watch"}
    leases = [rule for _, rule in rbac_rules(rendered) if rule["resources"] == ["leases"]]
    assert all(rule.get("resourceNames") or rule["verbs"] == ["create"] for rule in leases), leases


def test_secrets_role_follows_the_listed_namespaces(renderings: dict[str, list[Manifest]]) -> None:
    """Secrets are read where a RoleBinding to the secret-reader ClusterRole exists: one per listed namespace (the
    release's by default); the operator is told that role and its ServiceAccount, to say how to bind it elsewhere."""
    reader = one(renderings["default"], "ClusterRole", "-secret-reader")["metadata"]["name"]
    default_bindings = [b for b in of_kind(renderings["default"], "RoleBinding")
                        if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                            "name": reader}]
    assert [b["metadata"]["namespace"] for b in default_bindings] == [NAMESPACE]
    namespaced = renderings["namespaced"]
    bindings = [b for b in of_kind(namespaced, "RoleBinding") if b["roleRef"]["name"].endswith("-secret-reader")]
    assert {b["metadata"]["namespace"] for b in bindings} == {"ml-team", "ml-research"}
    sa = one(namespaced, "ServiceAccount")["metadata"]["name"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}] for b in bindings)
    args = operator_container(namespaced)["args"]
    assert f"--secret-reader-role={one(namespaced, 'ClusterRole', '-secret-reader')['metadata']['name']}" in args
    assert f"--service-account={NAMESPACE}/{sa}" in args
    # Watching listed namespaces: the namespaced objects are granted by a Role in each, never cluster-wide.
    cluster_resources = {res for role, rule in rbac_rules(namespaced) if role["kind"] == "ClusterRole"
                         for res in rule["resources"]}
    assert cluster_resources == {"nodes", "customresourcedefinitions", "namespaces", "mutatingwebhookconfigurations",
                                 "validatingwebhookconfigurations", "secrets"}  # secrets: bound per namespace only
    watched = {r["metadata"]["namespace"] for r in of_kind(namespaced, "Role") if not r["metadata"]["name"].endswith(
        ("-leader", "-keys"))}
    assert watched == {"ml-team", "ml-research"}
    args = operator_container(namespaced)["args"]
    assert "--namespace=ml-team" in args and "--namespace=ml-research" in args and "--all-namespaces" not in args


def test_every_values_key_is_commented() -> None:
    """Each key in values.yaml, sections included, has a comment on the line right above it."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^\s*[A-Za-z][\w.-]*:")
    uncommented = [f"{i + 1}: {line.strip()}" for i, line in enumerate(lines)
                   if key_line.match(line) and not (i and lines[i - 1].lstrip().startswith("#"))]
    assert not uncommented, f"values.yaml keys without a comment: {uncommented}"


def test_values_keys_are_camel_case() -> None:
    def keys(node: object, path: str = "") -> list[str]:
        if isinstance(node, dict):
            return [k for key, value in node.items() for k in [f"{path}{key}", *keys(value, f"{path}{key}.")]]
        return []

    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    # Keys that are Kubernetes field names or labels pass through unchanged.
    bad = [k for k in keys(values) if "_" in k.rsplit(".", 1)[-1] or "-" in k.rsplit(".", 1)[-1]]
    assert not bad


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operator_accepts_the_rendered_command_line(
    renderings: dict[str, list[Manifest]], scenario: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's own argument parser reads the Deployment's args into the settings the values asked for
    (a signing key file is a key as the mounted Secret holds it; the operator namespace comes from the pod's
    environment, as the Deployment sets it)."""
    from compilecache_operator.main import parse_args, settings_from

    from cachelib.signing import Signer

    rendered = renderings[scenario]
    container = operator_container(rendered)
    args = list(container["args"])
    key_flag = next((i for i, a in enumerate(args) if a.startswith("--signing-key-file=")), None)
    if key_flag is not None:
        mounted = next(m for m in container["volumeMounts"] if m["name"] == "signing-key")
        assert args[key_flag] == f"--signing-key-file={mounted['mountPath']}/signing.key"
        (tmp_path / "signing.key").write_bytes(Signer.generate().private_pem())
        args[key_flag] = f"--signing-key-file={tmp_path / 'signing.key'}"
    env = {e["name"]: e for e in container["env"]}
    assert env["COMPILECACHE_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    monkeypatch.setenv("COMPILECACHE_OPERATOR_NAMESPACE", NAMESPACE)
    options = parse_args(args)
    settings = settings_from(options)
    assert (settings.signing is not None) == (key_flag is not None)
    values = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in container["args"] if "=" in a}
    assert settings.jobs.preloader_image == values["--preloader-image"]
    assert settings.defaults.gpu_label_key == values["--gpu-label-key"]
    assert settings.native_sidecars == values["--native-sidecars"] == "auto"
    assert options.args.metrics_port == next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert options.args.health_port == next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    if of_kind(rendered, "MutatingWebhookConfiguration") and options.args.webhook_cert_secret:
        assert options.args.webhook_config == "external" and options.args.webhook_cert_dir is None
        assert options.args.webhook_ca_inject == one(rendered, "MutatingWebhookConfiguration")["metadata"]["name"]
        assert "webhook-tls" not in {m["name"] for m in container["volumeMounts"]}
    elif of_kind(rendered, "MutatingWebhookConfiguration"):
        assert options.args.webhook_config == "external"
        assert str(options.args.webhook_cert_dir) == next(
            m["mountPath"] for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    else:
        assert options.args.webhook_config == "off"
    watched = [r["metadata"]["namespace"] for r in of_kind(rendered, "Role")
               if r["metadata"]["name"] == one(rendered, "Deployment")["metadata"]["name"]]
    assert sorted(options.namespaces) == sorted(watched)



SECRET_ARGS = ("--webhook-cert-secret=", "--signing-key-secret=")
"""Secrets the operator makes at run time, named by the chart."""


@pytest.mark.parametrize("release", ["c", "compilecache", "ml-platform-compile-cache-prod-us-east-1x", "a" * 53,
                                     "b" * 31 + "-compilecache-operator"])
def test_object_names_stay_distinct_and_within_a_dns_label_for_any_release_name(helm_bin: Path, release: str) -> None:
    """A long release name (helm allows 53 characters) cut every name to 63 before its suffix was added, so the
    metrics and webhook Services and the webhook's Secret came out with one name: each object keeps its own."""
    for values in SCENARIOS.values():
        rendered = template(helm_bin, values, release=release[:53])
        seen: set[tuple[str, str, str]] = set()
        for manifest in rendered:
            meta = manifest["metadata"]
            name = meta["name"]
            assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name), (values, name)
            if manifest["kind"] == "Service":
                assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), (values, name)
            key = (manifest["kind"], meta.get("namespace", ""), name)
            assert key not in seen, f"{values}: two {key[0]} objects named {name}"
            seen.add(key)
        made = [a.split("=", 1)[1] for a in operator_container(rendered)["args"] if a.startswith(SECRET_ARGS)]
        secrets = [name for kind, _, name in seen if kind == "Secret"] + made
        assert len(set(secrets)) == len(secrets), (values, secrets)
