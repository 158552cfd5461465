"""The real node's and the test Prometheus's pure builders: mounts, network, discovery labels, scrape jobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.infra.node import (
    BRIDGE,
    GATEWAY,
    WORKLOAD_ROOT,
    Workload,
    base_runtime_spec,
    cni_config,
    kubelet_config,
    node_cni_results,
    workload_mounts,
)
from tests.infra.prometheus import pod_monitor_job, pod_targets


def test_the_byte_code_cache_is_found_under_the_containers_source_paths(tmp_path: Path) -> None:
    """Containers see the venv at /opt/compilecache-test/venv; its byte code is keyed by the host's path. The
    links made for the mount resolve, inside the mounted tree, to the host cache's entries."""
    host = tmp_path / "host-cache"
    venv, checkout = tmp_path / "work" / "venv", tmp_path / "work" / "src"
    pyc = host / venv.relative_to("/") / "lib" / "mod.cpython-311.pyc"
    pyc.parent.mkdir(parents=True)
    pyc.write_bytes(b"pyc")
    links = tmp_path / "links"
    mounts = dict((str(target), source) for source, target in workload_mounts(Workload(venv, checkout, host), links))
    assert mounts[f"{WORKLOAD_ROOT}/venv"] == venv and mounts[f"{WORKLOAD_ROOT}/src"] == checkout
    assert mounts[f"{WORKLOAD_ROOT}/pycache"] == links and mounts[f"{WORKLOAD_ROOT}/pycache/host"] == host
    # inside the container: <pycache>/opt/compilecache-test/venv/lib/mod.pyc, with <pycache>/host = the host cache
    os.rmdir(links / "host")
    (links / "host").symlink_to(host)  # what the nested mount does
    inside = links / WORKLOAD_ROOT.relative_to("/") / "venv" / "lib" / "mod.cpython-311.pyc"
    assert inside.read_bytes() == b"pyc"
    assert not os.readlink(links / WORKLOAD_ROOT.relative_to("/") / "venv").startswith("/")


def test_the_vllm_venv_is_mounted_beside_the_test_venv(tmp_path: Path) -> None:
    venv, checkout, vllm = tmp_path / "venv", tmp_path / "src", tmp_path / "venv-vllm"
    mounts = dict((str(target), source) for source, target in workload_mounts(Workload(venv, checkout, None, vllm),
                                                                               tmp_path / "links"))  # fmt: skip
    assert mounts == {f"{WORKLOAD_ROOT}/venv": venv, f"{WORKLOAD_ROOT}/src": checkout, f"{WORKLOAD_ROOT}/vllm": vllm}
    assert f"{WORKLOAD_ROOT}/vllm" not in dict(
        (str(t), s) for s, t in workload_mounts(Workload(venv, checkout), tmp_path / "links")
    )


def test_the_runtime_spec_adds_read_only_mounts_and_drops_rlimits() -> None:
    default = {"process": {"rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
               "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}]}
    spec = base_runtime_spec(default, [(Path("/srv/venv"), Path("/opt/v"))])
    assert "rlimits" not in spec["process"] and "rlimits" in default["process"]
    assert spec["mounts"][-1] == {"destination": "/opt/v", "type": "bind", "source": "/srv/venv",
                                  "options": ["rbind", "ro", "nosuid", "nodev"]}


def test_the_node_writes_no_iptables_rule_and_runs_on_cgroup_v1(tmp_path: Path) -> None:
    (plugin,) = cni_config(tmp_path)["plugins"]
    assert plugin["bridge"] == BRIDGE and plugin["ipMasq"] is False and plugin["isGateway"] is False
    assert plugin["ipam"]["ranges"][0][0]["gateway"] == GATEWAY
    config = kubelet_config(tmp_path, "192.0.2.2", tmp_path / "ca.crt")
    assert config["makeIPTablesUtilChains"] is False and config["failCgroupV1"] is False
    assert config["oomScoreAdj"] == 0 and config["cgroupDriver"] == "cgroupfs"
    json.dumps(config)


def test_pod_discovery_labels_feed_the_pod_monitors_relabelling(tmp_path: Path) -> None:
    pod = {"metadata": {"namespace": "ml", "name": "app-1", "uid": "u", "labels": {"compilecache.io/cache": "mlp"}},
           "spec": {"nodeName": "n", "containers": [
               {"name": "app", "ports": [{"name": "compilecache", "containerPort": 9400}]}, {"name": "side"}]},
           "status": {"podIP": "10.244.0.7", "phase": "Running"}}
    targets = pod_targets([pod, {**pod, "status": {"phase": "Pending"}}])
    assert [t["targets"] for t in targets] == [["10.244.0.7:9400"], ["10.244.0.7"]]
    labels = targets[0]["labels"]
    assert labels["__meta_kubernetes_pod_label_compilecache_io_cache"] == "mlp"
    assert labels["__meta_kubernetes_pod_labelpresent_compilecache_io_cache"] == "true"
    assert labels["__meta_kubernetes_pod_container_port_name"] == "compilecache"
    monitor = {"metadata": {"namespace": "cc", "name": "w"}, "spec": {
        "selector": {"matchExpressions": [{"key": "compilecache.io/cache", "operator": "Exists"}]},
        "namespaceSelector": {"matchNames": ["ml"]},
        "podMetricsEndpoints": [{"port": "compilecache", "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_label_compilecache_io_cache"], "targetLabel": "cache"}]}]}}
    job = pod_monitor_job(monitor, tmp_path / "pods.json", interval="1s")
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    assert keeps == {("__meta_kubernetes_namespace",): "ml",
                     ("__meta_kubernetes_pod_labelpresent_compilecache_io_cache",): "true",
                     ("__meta_kubernetes_pod_container_port_name",): "compilecache"}
    assert job["relabel_configs"][-1] == {"source_labels": ["__meta_kubernetes_pod_label_compilecache_io_cache"],
                                          "target_label": "cache"}
    assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "pods.json")]


SANDBOX = st.text("0123456789abcdef", min_size=64, max_size=64)


@given(ours=st.lists(SANDBOX, max_size=4, unique=True), theirs=st.lists(SANDBOX, max_size=4, unique=True),
       other_network=st.sampled_from(["cbr0", "podman", "k8s-pod-network"]))  # fmt: skip
def test_the_node_removes_its_own_cni_results_and_their_loopback_ones_only(
    ours: list[str], theirs: list[str], other_network: str
) -> None:
    """A killed run leaves both results of each sandbox: the pods network's and the loopback plugin's."""
    theirs = [s for s in theirs if s not in ours]
    mine = [f"compilecache-test-pods-{s}-eth0" for s in ours] + [f"cni-loopback-{s}-lo" for s in ours]
    others = [f"{other_network}-{s}-eth0" for s in theirs] + [f"cni-loopback-{s}-lo" for s in theirs]
    assert node_cni_results([*others, *mine]) == sorted(mine)
