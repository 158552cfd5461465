"""``spec.preload.mode: Sidecar`` on a current API server, with native sidecars.

The operator reads the API server's version at start-up (1.29+ has native sidecars); the webhook gives
the cache's pods the preload as an init container with ``restartPolicy: Always`` that runs beside the
workload, in a namespace enforcing the "restricted" Pod Security Standard, with apps running as their
own non-root uid. The app's ``wait_for_preload()`` finds the preload's hit in the done file where its
own mount of the cache puts it. Sidecar mode with ``strict`` is refused by the API server. The warm-up runs
``model.command``, which keeps this short. The fallback to an init container on API servers older than
1.29 is covered by tests/operator/test_sidecar_mode.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import WORKLOAD_IMAGE
from tests.infra.podspec import restricted
from tests.operator import e2e_support as e2e
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import RedisServer
from testsupport.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CACHE_LABEL = "compilecache.io/cache"
DONE = "/var/cache/compilecache/inductor/.compilecache-preload.json"
TIMEOUT = 240

# The workload's side of the hand-off: wait for the done file named in its environment, report the result.
APP = """
import json, os, pathlib
from cachelib.handoff import wait_for_preload
result = wait_for_preload(timeout=60)
pathlib.Path("/dev/termination-log").write_text(json.dumps(result))
"""


def app_container(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": WORKLOAD_IMAGE, "command": ["python", "-c", APP], **extra}


def pod(name: str, *containers: dict[str, Any]) -> dict[str, Any]:
    spec = restricted({"restartPolicy": "Never", "containers": list(containers)}, uid=1000, gid=1000)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {CACHE_LABEL: "side"}},
            "spec": spec}


def message(pod: dict[str, Any], container: str, init: bool = False) -> dict[str, Any]:
    statuses = pod["status"]["initContainerStatuses" if init else "containerStatuses"]
    (state,) = [s["state"]["terminated"] for s in statuses if s["name"] == container]
    assert state["exitCode"] == 0, state
    return dict(json.loads(state["message"]))


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_sidecar_mode_runs_the_preload_beside_the_app_and_the_app_waits_for_the_hit(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    store = {"url": redis_server.store_url()}
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("side", {
        "image": WORKLOAD_IMAGE, "model": {"command": "python -c pass"}, "storage": store,
        "preload": {"mode": "Sidecar"}}))
    # Sidecar with strict: the API server itself refuses it (a CEL rule), naming the field
    with pytest.raises(KubeAPIError) as refused:
        kube_client.post(e2e.cache_path(ns), e2e.compile_cache("strict", {
            "image": WORKLOAD_IMAGE, "model": {"command": "python -c pass"}, "storage": store,
            "preload": {"mode": "Sidecar", "strict": True}}))
    assert refused.value.status == 422
    refusal = str(refused.value)
    assert "spec.preload.strict: Invalid value: spec.preload.strict must be false with spec.preload.mode" in refusal
    e2e.wait_condition(kube_client, ns, "side", "Ready", "True", TIMEOUT)

    # one app container sees the cache at the default place, one at its own TORCHINDUCTOR_CACHE_DIR
    own = app_container("own", env=[{"name": "TORCHINDUCTOR_CACHE_DIR", "value": "/data/inductor"}])
    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", pod("app", app_container("app"), own))
    second = kube_client.post(f"/api/v1/namespaces/{ns}/pods", pod("second", app_container("app")))
    for admitted in (created, second):
        (preload,) = admitted["spec"]["initContainers"]
        assert preload["name"] == "compilecache-preload" and preload["restartPolicy"] == "Always"
        command = preload["command"]
        assert "--sidecar" in command and command[command.index("--done-file") + 1] == DONE
        annotations = admitted["metadata"]["annotations"]
        assert annotations["compilecache.io/preload-mode"] == "Sidecar"
        assert "compilecache.io/preload-mode-reason" not in annotations, annotations
    app, own_dir = created["spec"]["containers"]
    assert env_of(app)["COMPILECACHE_PRELOAD_DONE"] == DONE
    assert env_of(own_dir)["COMPILECACHE_PRELOAD_DONE"] == "/data/inductor/.compilecache-preload.json"

    for name in ("app", "second"):
        done = wait_for(lambda name=name: e2e.pod_terminated(kube_client, ns, name), TIMEOUT, f"pod {name} to finish")
        assert done["status"]["phase"] == "Succeeded", done["status"]
        preloaded = message(done, "compilecache-preload", init=True)
        assert preloaded["result"] == "hit", preloaded
        for container in [c["name"] for c in done["spec"]["containers"]]:
            waited = message(done, container)
            assert waited["result"] == "hit" and waited["keys"] == preloaded["keys"], (container, waited)

    wait_for(lambda: operator.sample("compilecache_preloads_total", namespace=ns, cache="side", result="hit") == 2,
             30, "both hits in /metrics")
    assert "native sidecars not available" not in operator.log_tail(200_000)
