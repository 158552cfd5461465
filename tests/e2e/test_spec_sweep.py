"""Bad CompileCaches against a real API server with the operator running: each is refused by the API server,
or ends InvalidSpec (a condition naming the field and a Warning event), or warms up with Jobs whose every
value Kubernetes accepts. Never a Job from an invalid value, never a CompileCache without status, never a
secret in a status, an event or the operator's log. And a Job the API server itself refuses (here: a
ResourceQuota that allows no Job) ends in a condition and an event, not in a CompileCache without status.

The specs come from tests/operator/specgen.py (the CRD's schema and one-field corruptions of valid specs,
as the pure property test draws them; a bounded number of them here)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.operator import e2e_support as e2e
from tests.operator.crdschema import validator
from tests.operator.specgen import (
    SECRET,
    URL_FORMS,
    Case,
    body_of,
    cases,
    dotted,
    job_problems,
    last_bad_specs,
    spec_problems,
)
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

crd, operator = e2e.crd, e2e.operator  # fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCHEMA = validator()
REFUSALS = ("InvalidSpec", "SecretKeyMissing", "SecretNotFound", "NoGPUNodes")
QUICK = {"command": "python -c pass"}
EXAMPLES = 30
"""Specs sent to the API server per run: each costs about a second; the pure test checks a thousand."""


def events_of(client: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    items = client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]


def settled(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """The CompileCache once the operator has given it a Ready condition."""
    def probe() -> dict[str, Any] | None:
        cache = client.get(e2e.cache_path(namespace, name))
        return cache if e2e.condition(cache, "Ready").get("reason") else None

    return wait_for(probe, 60, f"a Ready condition on {namespace}/{name}", interval=0.3)


class Sweep:
    """Applies cases one by one and checks each outcome; counts them."""

    def __init__(self, client: KubeClient, namespace: str, operator: e2e.OperatorProcess) -> None:
        self.client, self.namespace, self.operator = client, namespace, operator
        self.seen: dict[str, int] = {}
        self.count = 0
        self.last_message = ""
        """The Ready condition's message of the last case the API server accepted."""

    def apply(self, case: Case) -> str:
        self.count += 1
        name = f"sweep-{self.count}"
        spec = copy.deepcopy(case.spec)
        if isinstance(spec.get("model"), dict) and "target" in spec["model"]:  # quick warm-ups where the case allows
            spec["model"] = {**{k: v for k, v in spec["model"].items() if k != "target"}, **QUICK}
        try:
            self.client.post(e2e.cache_path(self.namespace), e2e.compile_cache(name, spec))
        except KubeAPIError as refused:
            assert refused.status in (400, 422), str(refused)
            return self._saw("refused by the API server")
        try:
            return self._saw(self._judge(name, case))
        finally:
            self.client.delete(e2e.cache_path(self.namespace, name))

    def _judge(self, name: str, case: Case) -> str:
        cache = settled(self.client, self.namespace, name)
        ready = e2e.condition(cache, "Ready")
        self.last_message = str(ready.get("message", ""))
        assert SECRET not in json.dumps(cache.get("status")), cache["status"]
        jobs = e2e.jobs_of(self.client, self.namespace, name)
        if ready["reason"] in REFUSALS:
            assert not jobs, f"a Job from a refused spec: {[j['metadata']['name'] for j in jobs]}"
            assert ready["message"].split(":", 1)[0].startswith(("spec", "metadata")), ready
            events = wait_for(lambda: [e for e in events_of(self.client, self.namespace, name)
                                       if e["reason"] == ready["reason"]], 30, f"the {ready['reason']} event")
            assert all(SECRET not in e["message"] for e in events)
            return str(ready["reason"])
        assert jobs, f"neither refused nor warming ({case.kind} at {dotted(case.path)}): {ready}"
        for job in jobs:
            assert not job_problems(job) + spec_problems(case.spec), job_problems(job) + spec_problems(case.spec)
        return "warm-up"

    def _saw(self, outcome: str) -> str:
        self.seen[outcome] = self.seen.get(outcome, 0) + 1
        return outcome


@pytest.fixture
def sweep(operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str) -> Iterator[Sweep]:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"},
              "stringData": {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}}
    kube_client.post(f"/api/v1/namespaces/{kube_namespace}/secrets", secret)  # the one the generated specs name
    applied = Sweep(kube_client, kube_namespace, operator)
    yield applied
    print(f"\n{applied.count} spec(s): {applied.seen}")


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(case=cases().filter(lambda c: SCHEMA.is_valid(body_of(c.spec))))
def test_generated_specs_on_a_real_api_server(sweep: Sweep, case: Case) -> None:
    """The cases the CRD's schema alone lets through (the pure test shows the schema refuses the others):
    what is left to the CEL rules, the operator and the API server's checks of the Job."""
    sweep.apply(case)
    log = sweep.operator.log_path.read_text(errors="replace")
    assert SECRET not in log
    assert "will ignore it" not in log, "a handler's exception went to Kopf, swallowed"


@settings(max_examples=len(URL_FORMS), derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(url=st.sampled_from(URL_FORMS))
def test_a_credential_in_the_store_url_is_never_shown(sweep: Sweep, url: str) -> None:
    spec = {"image": WORKLOAD_IMAGE, "model": QUICK, "storage": {"url": url}}
    outcome = sweep.apply(Case(spec, ("storage", "url"), "credential", url))
    assert outcome in ("refused by the API server", "InvalidSpec")
    assert SECRET not in sweep.operator.log_path.read_text(errors="replace")


@settings(max_examples=12, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(case=last_bad_specs())
def test_the_last_bad_specs_never_get_a_job(sweep: Sweep, case: Case) -> None:
    """A NUL byte in text a container gets, a GPU resource that is not an extended resource, a resource no node
    offers, a store port outside 1..65535: refused by the API server (the CRD's rules), or InvalidSpec."""
    assert sweep.apply(case) in ("refused by the API server", "InvalidSpec")


def test_a_job_the_api_server_refuses_ends_in_a_condition_and_an_event(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-jobs"},
             "spec": {"hard": {"count/jobs.batch": "0"}}}
    kube_client.post(f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    spec = {"image": WORKLOAD_IMAGE, "model": QUICK, "storage": {"url": "file:///tmp/compilecache-sweep"},
            "warmup": {"backoffLimit": 0}}
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("refused", spec))
    cache = e2e.wait_condition(kube_client, ns, "refused", "Ready", "False", 60, reason="WarmupJobRefused")
    message = e2e.condition(cache, "Ready")["message"]
    assert "creating warm-up Job cc-refused-" in message and "refused by the API server: HTTP 403" in message
    assert "quota" in message, message
    assert not e2e.jobs_of(kube_client, ns, "refused")
    wait_for(lambda: [e for e in events_of(kube_client, ns, "refused") if e["reason"] == "WarmupJobRefused"
                      and e["type"] == "Warning"], 30, "the WarmupJobRefused event")
    assert "will ignore it" not in operator.log_path.read_text(), "no handler exception swallowed"
    # the quota goes: the operator looks again (--retry-seconds) and the warm-up starts
    kube_client.delete(f"/api/v1/namespaces/{ns}/resourcequotas/no-jobs")
    wait_for(lambda: e2e.jobs_of(kube_client, ns, "refused"), 60, "the warm-up Job once the quota is gone")
    wait_for(lambda: e2e.condition(kube_client.get(e2e.cache_path(ns, "refused")), "Ready").get("reason")
             != "WarmupJobRefused", 60, "a Ready condition past the refusal")


@pytest.mark.parametrize(("extra", "path"), [
    ({"preload": {"nodeCache": {"hostPath": "/opt/elsewhere"}}}, "spec.preload.nodeCache.hostPath"),
    ({"warmup": {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}},
     "spec.warmup.resources.requests.cpu"),
    ({"gpuTypes": ["NVIDIA-H100", "nvidia_h100"]}, "spec.gpuTypes[1]"),
])
def test_what_only_the_operator_refuses_ends_invalid_spec_with_an_event(
    sweep: Sweep, extra: dict[str, Any], path: str
) -> None:
    spec = {"image": WORKLOAD_IMAGE, "model": QUICK, "storage": {"url": "file:///tmp/compilecache-sweep"}, **extra}
    assert sweep.apply(Case(spec, (), "operator", extra)) == "InvalidSpec"
    assert sweep.last_message.startswith(f"{path}:"), sweep.last_message
