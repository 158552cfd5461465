"""Sidecar mode: the hand-off names, native-sidecar detection, the switch, counting a sidecar's result."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import kopf
import pytest
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge.kube import KubeAPI
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.handlers import count_preload
from compilecache_operator.lifecycle import CountedPods, detect_native_sidecars
from compilecache_operator.main import parse_args, settings_from
from compilecache_operator.model import names
from compilecache_operator.model.sidecars import parse_server_version, sidecar_support
from compilecache_operator.model.spec import Defaults

from testsupport.servers import free_port


# -- the API server's version ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("info", "version"),
    [
        ({"major": "1", "minor": "29", "gitVersion": "v1.29.3"}, (1, 29)),
        ({"major": "1", "minor": "29+", "gitVersion": "v1.29.3-eks-adc7111"}, (1, 29)),
        ({"major": "1", "minor": "28", "gitVersion": "v1.28.9"}, (1, 28)),
        ({"major": "", "minor": "", "gitVersion": "v1.20.2"}, (1, 20)),
        ({"gitVersion": "1.31.0"}, (1, 31)),
        ({"major": "one", "minor": "x", "gitVersion": "v0.0.0-master+$Format:%H$"}, (0, 0)),
        ({"major": "one", "minor": "x", "gitVersion": "unknown"}, None),
        ({}, None),
    ],
)
def test_parse_server_version(info: dict[str, str], version: tuple[int, int] | None) -> None:
    assert parse_server_version(info) == version


def test_native_sidecars_from_1_29_unless_the_switch_says_otherwise() -> None:
    v129 = {"major": "1", "minor": "29+", "gitVersion": "v1.29.3-gke.100"}
    v128 = {"major": "1", "minor": "28", "gitVersion": "v1.28.9"}
    yes = sidecar_support("auto", v129)
    assert yes.available and yes.basis == "the API server is v1.29.3-gke.100"
    no = sidecar_support("auto", v128)
    assert not no.available
    assert no.fallback_reason == "Sidecar needs Kubernetes 1.29+ native sidecars; the API server is v1.28.9"
    assert sidecar_support("on", v128).available, "a 1.28 cluster with the SidecarContainers gate"
    off = sidecar_support("off", v129)
    assert not off.available and off.fallback_reason.endswith("; the operator runs with --native-sidecars off")
    garbage = sidecar_support("auto", {"gitVersion": "unknown"})
    assert not garbage.available and "'unknown' is not major.minor" in garbage.basis
    failed = sidecar_support("auto", None, "HTTP 403")
    assert not failed.available and failed.basis == "the API server's version could not be read (HTTP 403)"
    with pytest.raises(ValueError, match="--native-sidecars: 'yes' is not one of auto, on, off"):
        sidecar_support("yes", v129)


def test_an_unreachable_api_server_means_no_native_sidecars(caplog: pytest.LogCaptureFixture) -> None:
    """A real client against a loopback port nothing listens on: the start-up goes on, without sidecars."""

    async def detect(switch: str) -> Any:
        api = KubeAPI(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"), timeout=5)
        try:
            return await detect_native_sidecars(api, switch)
        finally:
            await api.close()

    with caplog.at_level(logging.WARNING):
        support = asyncio.run(detect("auto"))
    assert not support.available and support.basis.startswith("the API server's version could not be read (")
    assert "GET /version failed" in caplog.text
    caplog.clear()
    assert asyncio.run(detect("on")).available and not caplog.text, "the switch decides without asking"


def test_the_switch_on_the_command_line_and_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_from(parse_args([])).native_sidecars == "auto"
    monkeypatch.setenv("COMPILECACHE_NATIVE_SIDECARS", "off")
    assert settings_from(parse_args([])).native_sidecars == "off"
    assert settings_from(parse_args(["--native-sidecars", "on"])).native_sidecars == "on", "the flag wins"
    with pytest.raises(SystemExit):
        parse_args(["--native-sidecars", "yes"])
    monkeypatch.setenv("COMPILECACHE_NATIVE_SIDECARS", "maybe")
    with pytest.raises(SystemExit):
        parse_args([])


# -- counting a sidecar's result -------------------------------------------------------------------------
HIT = json.dumps({"result": "hit", "gpu": "cpu", "bytes": 2048, "seconds": 0.7})


def sidecar_pod(uid: str, state: dict[str, Any]) -> kopf.Body:
    return kopf.Body({
        "metadata": {"name": f"pod-{uid}", "namespace": "team-a", "uid": uid,
                     "labels": {names.CACHE_LABEL: "mlp"}, "annotations": {names.PRELOAD_MODE_ANNOTATION: "Sidecar"}},
        "spec": {"initContainers": [{"name": names.PRELOAD_CONTAINER, "restartPolicy": "Always"}],
                 "containers": [{"name": "app"}]},
        "status": {"initContainerStatuses": [{"name": names.PRELOAD_CONTAINER, "state": state}]},
    })


RUNNING = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
ENDED = {"terminated": {"exitCode": 0, "reason": "Completed", "message": HIT}}


def new_state(api: KubeAPI | None = None) -> State:
    return State(settings=Settings(defaults=Defaults(), jobs=JobSettings(preloader_image="p")), metrics=Metrics(),
                 api=api)


def hits(state: State) -> float | None:
    labels = {"namespace": "team-a", "cache": "mlp", "gpu": "cpu", "result": "hit", "reason": "preloaded"}
    return state.metrics.registry.get_sample_value("compilecache_preloads_total", labels)


def test_a_sidecar_result_first_seen_when_the_pod_is_deleted_counts_once() -> None:
    state, counted = new_state(), CountedPods()

    async def events() -> None:
        for event_type, pod_state in (("ADDED", RUNNING), ("MODIFIED", RUNNING), ("DELETED", ENDED),
                                      ("DELETED", ENDED)):
            await count_preload(state, counted, event_type, sidecar_pod("u1", pod_state), "team-a", "pod-u1", "u1")

    asyncio.run(events())
    assert hits(state) == 1
    text = state.metrics.exposition().decode()
    assert 'compilecache_preload_bytes_total{cache="mlp",namespace="team-a"} 2048.0' in text


def test_a_deleted_pod_is_counted_without_an_annotation(caplog: pytest.LogCaptureFixture) -> None:
    """The annotation is tried for a pod that still exists and skipped for a deleted one; here the API
    server is a loopback port nothing listens on, so a try shows up as the logged failure to mark it."""

    async def events() -> State:
        api = KubeAPI(kopf.ConnectionInfo(server=f"http://127.0.0.1:{free_port()}"), timeout=5)
        state, counted = new_state(api), CountedPods()
        try:
            await count_preload(state, counted, "DELETED", sidecar_pod("u2", ENDED), "team-a", "pod-u2", "u2")
            assert "could not mark pod" not in caplog.text
            await count_preload(state, counted, "MODIFIED", sidecar_pod("u3", ENDED), "team-a", "pod-u3", "u3")
            assert "could not mark pod team-a/pod-u3 as counted" in caplog.text
        finally:
            await api.close()
        return state

    with caplog.at_level(logging.WARNING):
        state = asyncio.run(events())
    assert hits(state) == 2
