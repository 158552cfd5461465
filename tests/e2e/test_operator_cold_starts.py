"""Why pods started cold, through the operator, on a real API server and a real node.

A CompileCache warms ``tiny_mlp``; three of its pods compile it with ``cachelib.runtime.warm_start()``:
one as the warm-up did (a hit), two with ``TORCHINDUCTOR_NAN_ASSERTS=1`` (an environment variable that
sets an Inductor option, so torch's key differs). Each workload leaves its verdict in its termination
message; the operator reads it from the pod's status and tallies it into ``status.coldStarts``, and since
most pods started cold for one cause, ``ColdStarts`` turns True with a ``MostPodsCold`` event naming the
variable with both values.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
TIMEOUT = 420
SAYS = "env TORCHINDUCTOR_NAN_ASSERTS: unset → 1 (inductor config nan_asserts: False → True)"



def app_pod(name: str, cache: str, env: dict[str, str]) -> dict[str, Any]:
    container = {"name": "app", "image": WORKLOAD_IMAGE, "command": ["python", "-c", e2e.WARM_START_TINY_MLP],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
            "spec": restricted({"restartPolicy": "Never", "containers": [container]})}  # fmt: skip


def test_the_status_names_the_cause_most_pods_started_cold_for(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("why", {
        "image": WORKLOAD_IMAGE, "model": {"target": "tiny_mlp"}, "storage": {"url": redis_server.store_url()},
    }))  # fmt: skip
    e2e.wait_condition(kube_client, ns, "why", "Ready", "True", TIMEOUT)

    pods = {"warm": {}, "cold-1": {"TORCHINDUCTOR_NAN_ASSERTS": "1"}, "cold-2": {"TORCHINDUCTOR_NAN_ASSERTS": "1"}}
    for name, env in pods.items():
        kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod(name, "why", env))
    for name in pods:
        pod = wait_for(lambda n=name: e2e.pod_terminated(kube_client, ns, n), TIMEOUT, f"pod {name} to finish")
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert e2e.terminated_message(pod, "compilecache-preload", init=True)["result"] == "hit"
        verdict = e2e.terminated_message(pod, "app")["compilecache_why"]
        if name == "warm":
            assert (verdict["result"], verdict["cause"]) == ("hit", "none"), verdict
        else:
            assert (verdict["result"], verdict["cause"]) == ("miss", "env") and SAYS in verdict["reason"], verdict

    def tallied() -> dict[str, Any] | None:
        cache = kube_client.get(e2e.cache_path(ns, "why"))
        cold = (cache.get("status") or {}).get("coldStarts") or {}
        return cache if cold.get("pods") == len(pods) else None

    cache = wait_for(tallied, 120, "status.coldStarts to count every pod")
    cold = cache["status"]["coldStarts"]
    assert cold["cold"] == 2 and [(c["cause"], c["pods"]) for c in cold["causes"]] == [("env", 2)], cold
    assert SAYS in cold["causes"][0]["example"]
    condition = next(c for c in cache["status"]["conditions"] if c["type"] == "ColdStarts")
    assert (condition["status"], condition["reason"]) == ("True", "MostPodsCold") and SAYS in condition["message"]
    assert e2e.wait_condition(kube_client, ns, "why", "Ready", "True", 30)  # the reconcile kept both
    events = kube_client.get(f"/api/v1/namespaces/{ns}/events")["items"]
    said = [e["message"] for e in events if e.get("reason") == "MostPodsCold"]
    assert len(said) == 1 and "2 of 3 pods" in said[0] and SAYS in said[0], json.dumps(said)
    for name in pods:
        annotations = kube_client.get(f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["annotations"]
        assert annotations["compilecache.io/cold-start-counted"] == ("none" if name == "warm" else "env")
