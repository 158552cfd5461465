"""``spec.model.precompile: Auto`` end to end on a real API server: the warm-up Job compiles as Off does and
again with Dynamo's caching precompile and writes the warm-start manifest, the preload lays the bundle down,
the webhook gives the app the cache directory (never TORCH_CACHING_PRECOMPILE, which would load the entry
unguarded), and the app's one call (``cachelib.runtime.warm_start()``) applies the manifest: its first compile
loads Dynamo's entry (no frame traced) and its output equals eager's.
"""

from __future__ import annotations

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
WARM_UP_TIMEOUT = 420

WARM_START_APP = """
import json, os, pathlib
import torch
from cachelib import runtime
from cachelib.in_image import targets
prepared = runtime.warm_start().to_dict()
model, args = targets.tiny_mlp()[0]
compiled = torch.compile(model)
with torch.no_grad():
    same = bool(torch.allclose(compiled(*args), model(*args), rtol=1e-4, atol=1e-5))
from torch._dynamo.utils import counters
report = {"prepared": prepared, "same": same,
          "counters": {g: dict(counters[g]) for g in ("dynamo_cache", "frames")},
          "env": os.environ.get("TORCH_CACHING_PRECOMPILE")}
pathlib.Path("/dev/termination-log").write_text(json.dumps(report))
"""


def app_pod(name: str, cache: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {CACHE_LABEL: cache}},
        "spec": restricted({"restartPolicy": "Never",
                            "containers": [{"name": "app", "image": WORKLOAD_IMAGE, "command": command}]}),
    }  # fmt: skip


def test_precompile_auto_warm_starts_the_app_without_tracing(
    operator: e2e.OperatorProcess, kube_client: KubeClient, kube_namespace: str, redis_server: RedisServer
) -> None:
    ns = kube_namespace
    kube_client.post(e2e.cache_path(ns), e2e.compile_cache("pre", {
        "image": WORKLOAD_IMAGE,
        "model": {"target": "tiny_mlp", "precompile": "Auto"},
        "storage": {"url": redis_server.store_url()},
    }))  # fmt: skip
    e2e.wait_condition(kube_client, ns, "pre", "Ready", "True", WARM_UP_TIMEOUT)

    created = kube_client.post(f"/api/v1/namespaces/{ns}/pods", app_pod("app", "pre", ["python", "-c", WARM_START_APP]))
    env = {e["name"]: e.get("value") for e in created["spec"]["containers"][0]["env"]}
    assert "TORCH_CACHING_PRECOMPILE" not in env and env["TORCHINDUCTOR_CACHE_DIR"]

    pod = wait_for(lambda: e2e.pod_terminated(kube_client, ns, "app"), WARM_UP_TIMEOUT, "the app pod to finish")
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert e2e.terminated_message(pod, "compilecache-preload", init=True)["result"] == "hit"
    report = e2e.terminated_message(pod, "app")
    assert report["same"], report
    assert report["prepared"]["declined"] == [], report["prepared"]
    assert {"torch_key", "caching_precompile"} <= set(report["prepared"]["applied"]), report["prepared"]
    assert report["counters"] == {"dynamo_cache": {"dynamo_cache_hit": 1}, "frames": {}}, report["counters"]
    assert report["env"] is None
