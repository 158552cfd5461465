"""Rendering the chart with the real helm binary, shared by the chart tests and the e2e chart tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "compilecache-operator"
CI_DIR = CHART_DIR / "ci"
EXAMPLES_DIR = REPO_ROOT / "examples"
RELEASE = "cc"
NAMESPACE = "compilecache-system"

Manifest = dict[str, Any]


def scenario_files() -> dict[str, Path | None]:
    """Scenario name -> values file; "default" renders the chart's own values."""
    out: dict[str, Path | None] = {"default": None}
    out.update({p.stem.removesuffix("-values"): p for p in sorted(CI_DIR.glob("*.yaml"))})
    return out


def helm(helm_bin: Path, *args: str, check: bool = True, env: Mapping[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run helm; on failure raise with its output."""
    proc = subprocess.run([str(helm_bin), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(env) if env is not None else None)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


MONITORING_APIS = tuple(arg for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
                        for arg in ("--api-versions", f"monitoring.coreos.com/v1/{kind}"))
"""``helm template`` arguments of a cluster with prometheus-operator: the chart renders its monitoring objects only
where the cluster serves them (``helm install`` asks the API server)."""
POLICY_APIS = tuple(arg for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
                    for arg in ("--api-versions", f"admissionregistration.k8s.io/v1/{kind}"))
"""``helm template`` arguments of a cluster serving ValidatingAdmissionPolicy (Kubernetes 1.30+): the chart renders the
policy that confines the operator's writes only there."""
SERVED_APIS = (*MONITORING_APIS, *POLICY_APIS)
"""What the newest supported Kubernetes with prometheus-operator serves, as ``helm template`` arguments."""


def template(helm_bin: Path, values: Path | None = None, *, set_values: Iterable[str] = (),
             namespace: str = NAMESPACE, release: str = RELEASE, apis: Iterable[str] = SERVED_APIS
             ) -> list[Manifest]:
    """``helm template`` the chart for a cluster serving ``apis`` and return the rendered objects (test hooks
    included)."""
    args = ["template", release, str(CHART_DIR), "--namespace", namespace, *apis]
    if values is not None:
        args += ["--values", str(values)]
    for item in set_values:
        args += ["--set", item]
    return parse_manifests(helm(helm_bin, *args).stdout)


def parse_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def of_kind(manifests: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: Iterable[Manifest], kind: str, name_suffix: str = "") -> Manifest:
    """The single object of ``kind`` (whose name ends with ``name_suffix``): the chart's own where a :func:`hook` has
    one of that kind too."""
    found = [m for m in of_kind(manifests, kind) if m["metadata"]["name"].endswith(name_suffix)]
    found = [m for m in found if not hook(m)] or found
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, found {[m['metadata']['name'] for m in found]}"
    return found[0]


def user_role(role: Manifest) -> bool:
    """A ClusterRole aggregated into the built-in view/edit/admin roles: for people, not the operator."""
    return any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in role["metadata"].get("labels", {}))


def hook(manifest: Manifest) -> bool:
    """An object of a helm hook (the post-install check, the test pod), not of the operator."""
    return "helm.sh/hook" in (manifest["metadata"].get("annotations") or {})


def rbac_rules(manifests: Iterable[Manifest]) -> Iterator[tuple[Manifest, Mapping[str, Any]]]:
    """(role, rule) for every rule of every Role and ClusterRole the operator is bound to (not the
    :func:`user_role` ones, nor a :func:`hook`'s own)."""
    for role in manifests:
        if role["kind"] in ("Role", "ClusterRole") and not user_role(role) and not hook(role):
            for rule in role.get("rules") or []:
                yield role, rule


def operator_container(manifests: Iterable[Manifest]) -> Manifest:
    deployment = one(manifests, "Deployment")
    containers: list[Manifest] = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "operator")
