"""The podman runner's reading of securityContext and the tests' restricted pods: pure functions, no server."""

from __future__ import annotations

import pytest

from tests.infra import containers, podspec
from testsupport.kube.cluster import versions


def pod(context: dict[str, object] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "p"}, "spec": {"securityContext": context or {}}}


def test_identity_takes_the_container_over_the_pod_over_the_image() -> None:
    assert containers.process_identity(pod(), {"name": "c"}, (65532, 65532)) == (65532, 65532, ())
    assert containers.process_identity(pod({"runAsUser": 10, "runAsGroup": 20}), {"name": "c"}) == (10, 20, ())
    container = {"name": "c", "securityContext": {"runAsUser": 11}}
    assert containers.process_identity(pod({"runAsUser": 10, "runAsGroup": 20}), container) == (11, 20, ())


def test_identity_adds_fs_group_and_supplemental_groups() -> None:
    context = {"runAsUser": 1, "runAsGroup": 2, "fsGroup": 3, "supplementalGroups": [4, 2, 3]}
    assert containers.process_identity(pod(context), {"name": "c"}) == (1, 2, (3, 4))


def test_run_as_non_root_refuses_uid_zero_like_a_kubelet() -> None:
    with pytest.raises(containers.ContainerConfigError, match="container has runAsNonRoot and image will run as root"):
        containers.process_identity(pod({"runAsNonRoot": True}), {"name": "c"}, (0, 0))
    assert containers.process_identity(pod({"runAsNonRoot": True}), {"name": "c"}, (65532, 1))[0] == 65532


def test_restricted_fills_the_standard_and_keeps_what_the_pod_says() -> None:
    spec = podspec.restricted({"containers": [{"name": "a", "securityContext": {"runAsUser": 7}}],
                               "securityContext": {"runAsGroup": 9}}, uid=5, fs_group=6)
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": 5, "runAsGroup": 9, "fsGroup": 6,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = spec["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "runAsUser": 7}


def test_versions_file_names_the_control_plane() -> None:
    assert versions("# c\nKUBE_VERSION=1.37.2\nETCD_VERSION = 3.6.16\n") == {"KUBE_VERSION": "1.37.2",
                                                                            "ETCD_VERSION": "3.6.16"}
    assert set(versions()) >= {"KUBE_VERSION", "ETCD_VERSION"}
