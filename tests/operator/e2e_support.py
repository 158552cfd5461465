"""Running the operator against the local control plane, for the e2e tests in tests/e2e/test_operator_*.

``OperatorProcess`` starts ``compilecache-operator`` as its own process (so a test can kill it hard and
start it again), watching one namespace, with ``--webhook-config managed``: the operator serves the
webhook on loopback and writes the MutatingWebhookConfiguration pointing the real API server at it.
The ``operator`` fixture runs the pods it makes on the real node (``real_node``): warm-up Jobs, preloads
and the apps are real containers run by a kubelet.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.model.formats import DEFAULT_NODE_CACHE_ROOTS

from tests.infra.node import RealNode
from testsupport.kube.cluster import LocalCluster
from testsupport.kube.crd import CC_API, install_crd
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import free_port
from testsupport.wait import answers_ok, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
PRELOADER_IMAGE = "ghcr.io/compilecache/preloader:e2e"


class OperatorProcess:
    """``compilecache-operator`` for one namespace, with its webhook, metrics and health on loopback."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path, *extra: str) -> None:
        self.kubeconfig, self.namespace, self.workdir, self.extra = kubeconfig, namespace, workdir, extra
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.webhook_port = free_port()
        self.webhook_config = f"{namespace}.compilecache.io"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "compilecache_operator.main",
            "--namespace", self.namespace,
            "--webhook-config", "managed",
            "--webhook-host", "127.0.0.1",
            "--webhook-listen-address", "127.0.0.1",
            "--webhook-port", str(self.webhook_port),
            "--metrics-address", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--health-address", "127.0.0.1",
            "--health-port", str(self.health_port),
            "--preloader-image", PRELOADER_IMAGE,
            "--resync-seconds", "3",
            "--retry-seconds", "2",
            "--log-format", "json",
            "--verbose",
            *self.extra,
        ]  # fmt: skip

    def spawn(self) -> None:
        """Start the process (not waiting for anything)."""
        self.starts += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPILECACHE_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        # its temporary files (the webhook's serving certificate, a client key) in the test's directory: a test
        # that kills the operator leaves them there, not in the machine's /tmp
        env["TMPDIR"] = str(self.workdir / "tmp")
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                cwd=REPO_ROOT, start_new_session=True,
            )

    def ready(self) -> bool:
        """``/readyz`` answers 200: every watch has listed."""
        return answers_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    def start(self, client: KubeClient, timeout: float = 60) -> None:
        self.spawn()
        wait_for(lambda: self._alive() and self._healthy(), timeout, "the operator's liveness endpoint")
        wait_for(lambda: self._alive() and self._webhook_configured(client), timeout,
                 f"the managed webhook configuration {self.webhook_config}")

    def _alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{self.log_tail()}")
        return True

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
            return bool(response.status == 200)

    def _webhook_configured(self, client: KubeClient) -> bool:
        path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.webhook_config}"
        config = client.get(path)
        urls = [w.get("clientConfig", {}).get("url", "") for w in config.get("webhooks") or []]
        return any(f":{self.webhook_port}/" in url for url in urls)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def sample(self, name: str, **labels: str) -> float:
        """The sum of the samples of /metrics that carry ``labels`` (among others; 0 when none)."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as a crashed or evicted operator."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, limit: int = 6000) -> str:
        text = "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')}" for p in sorted(self.workdir.glob("operator-*.log"))
        )
        return text[-limit:]

    def delete_webhook_config(self, client: KubeClient) -> None:
        """Delete the managed webhook configurations (the validating one exists with --check-caches-at-admission)."""
        client.delete_if_present(*(f"/apis/admissionregistration.k8s.io/v1/{kind}/{self.webhook_config}"
                                   for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")))

    def checks_caches(self, client: KubeClient) -> bool:
        """Whether the managed ValidatingWebhookConfiguration sends CompileCaches to this operator."""
        try:
            config = client.get(f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                f"{self.webhook_config}")
        except KubeAPIError as error:
            if error.status == 404:
                return False
            raise
        urls = [w.get("clientConfig", {}).get("url", "") for w in config.get("webhooks") or []]
        return any(f":{self.webhook_port}/validate-caches" in url for url in urls)


# -- the workload ---------------------------------------------------------------------------------
# An app that compiles the built-in tiny_mlp as the harness did (default options, the job id the webhook
# set) and reports torch's own cache counters, who it ran as and where, through its termination message.
COMPILE_TINY_MLP = """
import json, os, pathlib
from cachelib.in_image import compilekey, compilestep, harness
options = compilekey.CompileOptions()
harness.apply_options(options, os.environ.get("TORCH_COMPILE_JOB_ID", "not-injected"))
compilestep.run_target("tiny_mlp", options)
report = {"cache": compilestep.cache_summary(compilestep.counters_snapshot()), "uid": os.getuid(), "gid": os.getgid(),
          "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "job_id": os.environ.get("TORCH_COMPILE_JOB_ID")}
pathlib.Path("/dev/termination-log").write_text(json.dumps(report))
"""

WARM_START_TINY_MLP = """
import torch
from cachelib import runtime
from cachelib.in_image import targets
runtime.warm_start()
model, args = targets.tiny_mlp()[0]
with torch.no_grad():
    torch.compile(model)(*args)
"""
"""An app that calls ``warm_start()`` and compiles the built-in tiny_mlp under no_grad, nothing else."""


def terminated_message(pod: dict[str, Any], container: str, init: bool = False) -> dict[str, Any]:
    """The JSON termination message of a container that exited 0."""
    statuses = pod["status"]["initContainerStatuses" if init else "containerStatuses"]
    (entry,) = [s for s in statuses if s["name"] == container]
    state = entry["state"].get("terminated")
    assert state is not None and state["exitCode"] == 0, (container, entry["state"])
    return dict(json.loads(state["message"]))


# -- CompileCache helpers -------------------------------------------------------------------------
def cache_path(namespace: str, name: str = "") -> str:
    base = f"{CC_API}/namespaces/{namespace}/compilecaches"
    return f"{base}/{name}" if name else base


def compile_cache(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": name},
            "spec": spec}


def condition(cache: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in cache.get("status", {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def wait_condition(
    client: KubeClient, namespace: str, name: str, type_: str, status: str, timeout: float, reason: str | None = None
) -> dict[str, Any]:
    """Wait until the condition has ``status`` (and ``reason``); the whole CompileCache."""

    def probe() -> dict[str, Any] | None:
        cache = client.get(cache_path(namespace, name))
        cond = condition(cache, type_)
        if cond.get("status") == status and (reason is None or cond.get("reason") == reason):
            return cache
        return None

    return wait_for(probe, timeout, f"{type_}={status}{f' ({reason})' if reason else ''} on {namespace}/{name}",
                    interval=0.5)


def jobs_of(client: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"compilecache.io/warmup-for={name}"
    found = client.get(f"/apis/batch/v1/namespaces/{namespace}/jobs", labelSelector=selector)
    return list(found["items"])


def pod_terminated(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    pod = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return dict(pod) if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None


def wait_deadline(seconds: float) -> float:
    return time.monotonic() + seconds


# -- fixtures (imported by the e2e modules) ------------------------------------------------------
@pytest.fixture(scope="session")
def crd(kube_client: KubeClient) -> None:
    install_crd(kube_client)


@pytest.fixture
def operator(
    kube_cluster: LocalCluster,
    kube_client: KubeClient,
    real_node: RealNode,
    kube_namespace: str,
    crd: None,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    """The operator for the test's namespace, stopped afterwards; its log goes into the test report. Node
    caches may also go under the real node's own work directory (kept off the host's /var/cache)."""
    roots = ",".join((*DEFAULT_NODE_CACHE_ROOTS, str(real_node.workdir / "hostpath")))
    process = OperatorProcess(
        kube_cluster.kubeconfig, kube_namespace, tmp_path / "operator", "--allowed-node-cache-paths", roots
    )
    yield from run_operator(process, kube_client, request)


def run_operator(process: OperatorProcess, client: KubeClient,
                 request: pytest.FixtureRequest | None = None) -> Iterator[OperatorProcess]:
    """Start ``process`` and yield it; then stop it and delete its webhook configurations (its log goes into the
    test's report)."""
    process.start(client)
    try:
        yield process
    finally:
        process.stop()
        process.delete_webhook_config(client)
        if request is not None:
            request.node.add_report_section("teardown", "operator log", process.log_tail())
