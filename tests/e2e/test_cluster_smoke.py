"""The proving ground itself: the real Job controller, kube-scheduler and kubelet running pods, status written back,
webhooks reached through Service endpoints, Pod Security and RBAC as a cluster enforces them."""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.conftest import GPU_LABEL, GPU_PRODUCT, WORKLOAD_IMAGE
from tests.infra.node import RealNode
from tests.infra.podspec import restricted
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.pki import CertificateAuthority
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

pytestmark = pytest.mark.e2e

TIMEOUT = 120  # a pod's Python starts in seconds; the margin is for a machine shared with other work

ON_GPU_NODE = {GPU_LABEL: GPU_PRODUCT}

WRITE_GREETING = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('hello')"
REPORT = """
import json, os, pathlib, sys
greeting = pathlib.Path(sys.argv[1]).read_text()
report = {"greeting": greeting, "pod": os.environ["POD_NAME"]}
pathlib.Path(sys.argv[2]).write_text(json.dumps(report))
"""


def job_body(name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A Job whose pod passes the "restricted" Pod Security Standard of the test namespaces."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": restricted({"restartPolicy": "Never", **pod_spec})}},
    }


def pod_body(name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod that passes the "restricted" Pod Security Standard of the test namespaces."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": restricted({"restartPolicy": "Never", **pod_spec})}


def python_container(name: str, *argv: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": WORKLOAD_IMAGE, "command": ["python", "-c", *argv], **extra}


def job_condition(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    job = client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    for condition in job.get("status", {}).get("conditions") or []:
        if condition["type"] in ("Complete", "Failed") and condition["status"] == "True":
            return dict(condition)
    return None


def job_pod(client: KubeClient, namespace: str, job: str) -> dict[str, Any]:
    pods = client.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"job-name={job}")["items"]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return dict(pods[0])


def pod_in_phase(client: KubeClient, namespace: str, name: str, phase: str) -> dict[str, Any] | None:
    pod = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return dict(pod) if pod.get("status", {}).get("phase") == phase else None


def test_job_with_init_container_completes_with_termination_message(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str
) -> None:
    mount = [{"name": "work", "mountPath": "/work"}]
    spec = {
        "nodeSelector": ON_GPU_NODE,
        "volumes": [{"name": "work", "emptyDir": {}}],
        "initContainers": [python_container("prepare", WRITE_GREETING, "/work/greeting", volumeMounts=mount)],
        "containers": [
            python_container(
                "main", REPORT, "/work/greeting", "/dev/termination-log", volumeMounts=mount,
                env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            )
        ],
    }
    kube_client.post(f"/apis/batch/v1/namespaces/{kube_namespace}/jobs", job_body("greet", spec))

    condition = wait_for(lambda: job_condition(kube_client, kube_namespace, "greet"), TIMEOUT, "the Job to finish")

    assert condition["type"] == "Complete"
    pod = job_pod(kube_client, kube_namespace, "greet")
    assert pod["spec"]["nodeName"] == real_node.name
    assert pod["status"]["phase"] == "Succeeded"
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert init["state"]["terminated"]["reason"] == "Completed"
    (main,) = pod["status"]["containerStatuses"]
    terminated = main["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert json.loads(terminated["message"]) == {"greeting": "hello", "pod": pod["metadata"]["name"]}
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert {k: conditions.get(k) for k in ("PodScheduled", "Initialized", "Ready", "ContainersReady")} == {
        "PodScheduled": "True", "Initialized": "True", "Ready": "False", "ContainersReady": "False"}, conditions


def test_job_whose_container_fails_becomes_failed_with_log_tail(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str
) -> None:
    crash = "import sys; print('compile exploded', flush=True); sys.exit(3)"
    spec = {
        "nodeSelector": ON_GPU_NODE,
        "containers": [python_container("main", crash, terminationMessagePolicy="FallbackToLogsOnError")],
    }
    kube_client.post(f"/apis/batch/v1/namespaces/{kube_namespace}/jobs", job_body("crash", spec))

    condition = wait_for(lambda: job_condition(kube_client, kube_namespace, "crash"), TIMEOUT, "the Job to finish")

    assert (condition["type"], condition["reason"]) == ("Failed", "BackoffLimitExceeded")
    pod = job_pod(kube_client, kube_namespace, "crash")
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert terminated["message"].strip() == "compile exploded"
    assert real_node.container_log(kube_namespace, pod["metadata"]["name"], "main") == "compile exploded\n"


def test_unknown_image_waits_and_unmatched_selector_stays_unscheduled(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    elsewhere = {"nodeSelector": {GPU_LABEL: "NVIDIA-A100-SXM4-40GB"}, "containers": [python_container("c", "pass")]}
    kube_client.post(pods, pod_body("elsewhere", elsewhere))
    absent = {"name": "c", "image": "registry.invalid/nothing:1", "imagePullPolicy": "Never"}  # no registry here
    unknown = {"nodeSelector": ON_GPU_NODE, "containers": [absent]}
    kube_client.post(pods, pod_body("unknown-image", unknown))
    canary = {"nodeSelector": ON_GPU_NODE, "containers": [python_container("c", "pass")]}
    kube_client.post(pods, pod_body("canary", canary))

    def waiting_reason() -> dict[str, Any] | None:
        statuses = kube_client.get(f"{pods}/unknown-image").get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting") if statuses else None
        return waiting if waiting and waiting.get("reason") == "ErrImageNeverPull" else None

    waiting = wait_for(waiting_reason, TIMEOUT, "the unknown image to be reported")
    assert "registry.invalid/nothing:1" in waiting["message"]
    assert kube_client.get(f"{pods}/unknown-image")["status"]["phase"] == "Pending"

    wait_for(lambda: pod_in_phase(kube_client, kube_namespace, "canary", "Succeeded"), TIMEOUT, "the canary pod")
    unscheduled = kube_client.get(f"{pods}/elsewhere")
    assert "nodeName" not in unscheduled["spec"]
    assert unscheduled["status"]["phase"] == "Pending"


def test_active_deadline_fails_the_pod_and_deletion_kills_it(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    sleeper = python_container("c", "import time; time.sleep(120)")  # PID 1 of its container: SIGTERM is ignored
    quick = {"terminationGracePeriodSeconds": 1, "containers": [sleeper]}
    kube_client.post(pods, pod_body("deadline", {"activeDeadlineSeconds": 2, **quick}))
    kube_client.post(pods, pod_body("doomed", quick))

    failed = wait_for(lambda: pod_in_phase(kube_client, kube_namespace, "deadline", "Failed"), TIMEOUT, "the deadline")
    assert failed["status"]["reason"] == "DeadlineExceeded"
    assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] in (137, 143)

    wait_for(lambda: pod_in_phase(kube_client, kube_namespace, "doomed", "Running"), TIMEOUT, "the pod to run")
    kube_client.delete(f"{pods}/doomed")

    def gone() -> bool:
        try:
            kube_client.get(f"{pods}/doomed")
        except KubeAPIError as error:
            return error.status == 404
        return False

    wait_for(gone, TIMEOUT, "the deleted pod to disappear")


def test_client_certificates_carry_user_and_groups_for_rbac(kube_cluster: LocalCluster, kube_namespace: str) -> None:
    reader = kube_cluster.client("carol", ("readers",))
    pods = f"/api/v1/namespaces/{kube_namespace}/pods"
    with pytest.raises(KubeAPIError) as denied:
        reader.get(pods)
    assert denied.value.status == 403

    admin = kube_cluster.client()
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{kube_namespace}"
    admin.post(f"{rbac}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
    })
    admin.post(f"{rbac}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "readers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "readers"}],
    })

    assert wait_for(lambda: reader.get(pods)["kind"] == "PodList", 10, "RBAC to allow the group")
    reader.close()
    admin.close()


FLAKY_ONCE = """
import os, pathlib, sys
marker = pathlib.Path(sys.argv[1]) / os.environ["POD_NAME"]
if not marker.exists():
    marker.write_text("failed once")
    sys.exit(1)
settings = pathlib.Path(sys.argv[2]).read_text()
pathlib.Path("/dev/termination-log").write_text(settings + " " + os.environ["TOKEN"])
"""


def test_restart_on_failure_with_config_map_secret_and_host_path(
    kube_cluster: LocalCluster, kube_client: KubeClient, real_node: RealNode,
    namespace_factory: Callable[[str | None], str],
) -> None:
    kube_namespace = namespace_factory("privileged")  # hostPath volumes are refused by "baseline" and stricter
    host_dir = real_node.workdir / "hostpath" / kube_namespace  # the node's own directory, not the host's /var
    ns = f"/api/v1/namespaces/{kube_namespace}"
    kube_client.post(f"{ns}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                                          "data": {"mode": "max-autotune"}})
    kube_client.post(f"{ns}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                                       "stringData": {"token": "s3cr3t"}})
    spec = {
        "restartPolicy": "OnFailure",
        "volumes": [
            {"name": "node-cache", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}},
            {"name": "settings", "configMap": {"name": "settings"}},
        ],
        "containers": [python_container(
            "main", FLAKY_ONCE, "/node-cache", "/etc/settings/mode",
            volumeMounts=[{"name": "node-cache", "mountPath": "/node-cache"},
                          {"name": "settings", "mountPath": "/etc/settings", "readOnly": True}],
            env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                 {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}],
        )],
    }
    kube_client.post(f"{ns}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "flaky"}, "spec": spec})

    wait_for(lambda: pod_in_phase(kube_client, kube_namespace, "flaky", "Succeeded"), TIMEOUT, "the restarted pod")

    with kube_cluster.api() as api:
        pod: Any = client.CoreV1Api(api).read_namespaced_pod("flaky", kube_namespace)
    (status,) = pod.status.container_statuses
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert status.state.terminated.message == "max-autotune s3cr3t"
    assert (host_dir / "flaky").read_text() == "failed once"


class _AnnotatingWebhook(http.server.BaseHTTPRequestHandler):
    """A mutating admission webhook that annotates what it admits."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        patch = [{"op": "add", "path": "/metadata/annotations", "value": {"admitted-by": "service-webhook"}}]
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True, "patchType": "JSONPatch",
                         "patch": base64.b64encode(json.dumps(patch).encode()).decode()},
        }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_service_addressed_webhook_reaches_a_host_process_through_endpoints(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path, "webhook-ca")
    serving = ca.issue("webhook", "webhook", server_names=(f"webhook.{kube_namespace}.svc",), client=False)
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _AnnotatingWebhook)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(serving.cert, serving.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ns = f"/api/v1/namespaces/{kube_namespace}"
    kube_client.post(f"{ns}/services", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "webhook"},
                                        "spec": {"ports": [{"port": 443, "targetPort": port}]}})
    kube_client.post(f"{ns}/endpoints", {
        "apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "webhook"},
        "subsets": [{"addresses": [{"ip": real_node.address}], "ports": [{"port": port}]}],
    })
    webhooks = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    kube_client.post(webhooks, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": kube_namespace},
        "webhooks": [{
            "name": "annotate.e2e.compilecache.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "objectSelector": {"matchLabels": {"e2e-webhook": kube_namespace}},
            "clientConfig": {"service": {"namespace": kube_namespace, "name": "webhook", "port": 443},
                             "caBundle": base64.b64encode(ca.cert_path.read_bytes()).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}],
        }],
    })
    labels = {"e2e-webhook": kube_namespace}
    attempts = iter(range(1000))

    def admitted_config_map() -> dict[str, Any]:
        # The API server picks up a new webhook configuration after a short delay: retry until it does.
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"x{next(attempts)}", "labels": labels}}
        return dict(kube_client.post(f"{ns}/configmaps", body)["metadata"].get("annotations") or {})

    try:
        annotations = wait_for(admitted_config_map, 15, "the webhook to admit a ConfigMap")
        assert annotations == {"admitted-by": "service-webhook"}
    finally:
        kube_client.delete(f"{webhooks}/{kube_namespace}")
        server.shutdown()


def test_restricted_namespace_refuses_a_pod_that_breaks_the_standard(
    kube_client: KubeClient, kube_namespace: str, baseline_namespace: str
) -> None:
    loose = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "loose"},
             "spec": {"restartPolicy": "Never", "containers": [python_container("c", "pass")]}}
    with pytest.raises(KubeAPIError) as refused:
        kube_client.post(f"/api/v1/namespaces/{kube_namespace}/pods", loose)
    assert refused.value.status == 403
    assert 'violates PodSecurity "restricted:latest"' in str(refused.value), refused.value
    assert "allowPrivilegeEscalation != false" in str(refused.value)
    # the same pod passes "baseline"; the restricted form of it passes "restricted"
    kube_client.post(f"/api/v1/namespaces/{baseline_namespace}/pods", loose)
    kube_client.post(f"/api/v1/namespaces/{kube_namespace}/pods", pod_body("careful", {
        "containers": [python_container("c", "pass")]}))


WHO_AM_I = """
import json, os, pathlib, sys
result = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
for index, name in enumerate(sys.argv[1:]):
    try:
        probe = pathlib.Path(name) / "probe"
        probe.write_text("x")
        result[index] = ["written", probe.stat().st_gid]
    except PermissionError as error:
        result[index] = f"PermissionError: {error.strerror}"
pathlib.Path("/dev/termination-log").write_text(json.dumps(result))
"""


def test_containers_run_as_their_pod_says_and_volumes_have_kubelet_ownership(
    kube_client: KubeClient, real_node: RealNode, namespace_factory: Callable[[str | None], str]
) -> None:
    ns = namespace_factory("privileged")
    host_dir = real_node.workdir / "hostpath" / ns
    spec = restricted({
        "restartPolicy": "Never",
        "volumes": [{"name": "scratch", "emptyDir": {}},
                    {"name": "node", "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"}}],
        "containers": [python_container(
            "app", WHO_AM_I, "/scratch", "/node",
            volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}, {"name": "node", "mountPath": "/node"}])],
    }, uid=1234, gid=2345, fs_group=3456)
    kube_client.post(f"/api/v1/namespaces/{ns}/pods", {"apiVersion": "v1", "kind": "Pod",
                                                       "metadata": {"name": "who"}, "spec": spec})
    done = wait_for(lambda: pod_in_phase(kube_client, ns, "who", "Succeeded"), TIMEOUT, "the pod to finish")
    (status,) = done["status"]["containerStatuses"]
    report = json.loads(status["state"]["terminated"]["message"])
    assert (report["uid"], report["gid"]) == (1234, 2345) and 3456 in report["groups"], report
    assert report["0"] == ["written", 3456]  # /scratch, an emptyDir: 0777, group fsGroup, setgid: files get fsGroup
    assert report["1"].startswith("PermissionError"), report  # /node, a hostPath made by the kubelet: root 0755
    assert host_dir.stat().st_uid == 0 and not host_dir.stat().st_mode & 0o022  # made by the kubelet for root


SIDECAR = """
import os, pathlib, signal, sys, time
pathlib.Path(sys.argv[1], "ready").write_text("sidecar ran first")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(1)
"""


# A kubelet starts the next container once the sidecar has started (no startup probe here), not once it is
# done with anything: the app waits for the sidecar's file, as a workload waits for its preload.
WAIT_FOR_SIDECAR = """
import os, pathlib, sys, time
ready = pathlib.Path(sys.argv[1])
for _ in range(100):
    if ready.exists():
        break
    time.sleep(0.1)
pathlib.Path("/dev/termination-log").write_text(ready.read_text())
"""


def test_native_sidecar_starts_before_the_app_and_stops_after_it(
    kube_client: KubeClient, real_node: RealNode, kube_namespace: str
) -> None:
    shared = [{"name": "shared", "mountPath": "/shared"}]
    spec = {
        "volumes": [{"name": "shared", "emptyDir": {}}],
        "initContainers": [python_container("side", SIDECAR, "/shared", restartPolicy="Always", volumeMounts=shared)],
        "containers": [python_container("app", WAIT_FOR_SIDECAR, "/shared/ready", volumeMounts=shared)],
    }
    created = kube_client.post(f"/api/v1/namespaces/{kube_namespace}/pods", pod_body("sidecar", spec))
    assert created["spec"]["initContainers"][0]["restartPolicy"] == "Always"  # the API server knows sidecars
    done = wait_for(lambda: pod_in_phase(kube_client, kube_namespace, "sidecar", "Succeeded"), TIMEOUT, "the pod")
    (app,) = done["status"]["containerStatuses"]
    assert app["state"]["terminated"]["message"] == "sidecar ran first"
    (side,) = done["status"]["initContainerStatuses"]
    assert side["state"]["terminated"]["exitCode"] == 0 and side["restartCount"] == 0, side
