"""A small local node agent that plays kubelet (and scheduler) for the pods end-to-end tests create.

``NodeAgent`` registers a Node, binds matching unscheduled pods to it, runs their containers as local
processes and writes pod status back through the API like a kubelet, so that the real Job controller,
garbage collector and namespace controller act on real pod status.

What it does:

- Scheduling: pods without ``nodeName``, with the default scheduler, whose ``nodeSelector`` and required
  node affinity match the node labels (taints, tolerations and resources are ignored), optionally only in
  some namespaces, are bound through the ``pods/binding`` subresource. Other pods are left Pending.
- Images: ``images`` maps an image-name prefix to a ``Runtime`` (longest prefix wins): a PATH prefix,
  extra environment, an entrypoint used when the container has no ``command``, and ``image_paths``
  (container path → host path) standing for files baked into the image. An image with no runtime stays
  waiting with reason ``ErrImageNeverPull``, as a kubelet with ``imagePullPolicy: Never`` reports it.
- Containers: init containers run one after another, then all app containers at once, each as a process
  group in its own working directory (``containers/<name>`` under the pod directory), on the host network.
  A native sidecar (an init container with ``restartPolicy: Always``) only has to start before the next
  container; it keeps running (restarted whatever its exit code) and is stopped after the app containers.
- Users: every process runs as the uid, gid and supplementary groups (fsGroup, supplementalGroups) its
  pod spec gives it (the container's securityContext over the pod's, else the image's USER from its
  ``Runtime``), through ``setpriv``; ``runAsNonRoot`` with uid 0 is refused as a kubelet refuses it.
  Read-only root file systems and capabilities cannot be imitated by a process: they are enforced only
  for images that run as real containers.
  Each container's stdout and stderr go to ``logs/<name>.log`` (see ``container_log``/``describe``).
- Volumes: emptyDir → a fresh directory per pod, 0777, or with a pod fsGroup group-owned by it and setgid
  (kubelet's ownership management); hostPath → ``<root>/hostpath/<path>`` shared by the pods
  of this node; configMap, secret, downwardAPI and projected (those three plus serviceAccountToken via
  TokenRequest) → files written from the API objects. A missing non-optional ConfigMap/Secret keeps the
  containers waiting (``ContainerCreating``/``CreateContainerConfigError``) and is retried.
- Paths: processes cannot mount, so each ``command``/``args`` element, env value and ``workingDir`` that
  equals or starts with a volumeMount's mountPath (or an image path) is rewritten to the host directory,
  longest path first, also in ``--flag=PATH`` form. Paths inside longer strings (``sh -c "..."``) are not.
- Environment: a minimal base (PATH, HOME = the working directory, HOSTNAME, TMPDIR, LANG,
  KUBERNETES_SERVICE_HOST/PORT = the real API server), the runtime's env, ``envFrom``, ``env`` (value with
  $(VAR) expansion, fieldRef, secretKeyRef, configMapKeyRef; resourceFieldRef is not supported) and
  COMPILECACHE_TERMINATION_LOG: the host file standing for the container's terminationMessagePath (a
  literal terminationMessagePath argument is rewritten to it too). Its content (at most 4096 bytes) becomes
  ``state.terminated.message``; with FallbackToLogsOnError, an empty file and a non-zero exit, the last
  80 lines / 2048 bytes of output do.
- Restarts: ``Never`` runs each container once. ``OnFailure`` and ``Always`` restart a container that
  exits non-zero, with a short back-off (1 s doubling to 10 s, reported as waiting ``CrashLoopBackOff``);
  a container that exits 0 is never restarted, so an ``Always`` pod whose containers all exit 0 ends
  Succeeded (a kubelet would restart them).
- ``activeDeadlineSeconds`` (from status.startTime) kills the containers and fails the pod with reason
  DeadlineExceeded. Deleting a pod (deletionTimestamp) kills its processes (SIGTERM, then SIGKILL after
  the grace period, capped at ``max_grace_seconds``) and removes the pod with gracePeriodSeconds=0.
- No probes, no resource limits, no ``kubectl logs``/``exec`` (there is no kubelet API), no image pulls.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from tests.infra import containers, podspec
from tests.infra.kube.cluster import die_with_parent, versions
from tests.infra.kube.rest import KubeAPIError, KubeClient

JSON = dict[str, Any]
log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
RETRY_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 10.0
KUBELET_VERSION = "v" + versions()["KUBE_VERSION"]


@dataclass(frozen=True)
class Runtime:
    """How the containers of one image family run here: PATH prefix, env, entrypoint, files of the image."""

    path: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    image_paths: Mapping[str, str] = field(default_factory=dict)
    user: tuple[int, int] = (0, 0)
    """uid and gid of the image's USER: what the processes run as when the pod's securityContext says nothing."""
    container_image: str | None = None
    """A local podman image: the containers of this image family run as real containers from it (see
    tests/infra/containers.py), with their securityContext and volume mounts, instead of as processes."""


class ContainerBlocked(Exception):
    """A container cannot start yet; ``reason`` and ``message`` go into its waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


class PodCancelled(Exception):
    """The pod was deleted or the agent is stopping."""


class DeadlineExceeded(Exception):
    """activeDeadlineSeconds has passed."""


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    return pod["metadata"]["namespace"], pod["metadata"]["name"]


def _detect_node_ip() -> str:
    """The machine's primary address (pods share the host network); 127.0.0.1 when there is none."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("198.51.100.1", 9))  # no packet is sent: this only picks the outgoing interface
            address: str = sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return address if not address.startswith("127.") and address != "0.0.0.0" else "127.0.0.1"


class ContainerRun:
    """One container of a running pod: its spec, process, and the status fields a kubelet reports."""

    def __init__(self, spec: JSON, is_init: bool, pod_dir: Path) -> None:
        self.spec, self.is_init = spec, is_init
        self.sidecar = is_init and podspec.is_native_sidecar(spec)
        self.name: str = spec["name"]
        self.cwd = pod_dir / "containers" / self.name
        self.log_path = pod_dir / "logs" / f"{self.name}.log"
        self.termination_path = pod_dir / "termination" / self.name
        for directory in (self.cwd, self.log_path.parent, self.termination_path.parent):
            directory.mkdir(parents=True, exist_ok=True)
        self.state: JSON = {"waiting": {"reason": "PodInitializing"}}
        self.last_state: JSON = {}
        self.restart_count = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file: IO[bytes] | None = None
        self.started_at = ""
        self.next_start = 0.0
        self.final = False
        self.ever_started = False
        self.container_name: str | None = None

    @property
    def running(self) -> bool:
        return self.process is not None

    @property
    def succeeded(self) -> bool:
        return self.final and self.state.get("terminated", {}).get("exitCode") == 0

    def status(self) -> JSON:
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"local://{self.process.pid}" if self.process else "",
            "ready": self.running if self.sidecar or not self.is_init else self.succeeded,
            "started": self.running,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }


class PodRunner(threading.Thread):
    """Runs one pod bound to this node, from volumes to terminal phase, writing status as it goes."""

    def __init__(self, agent: NodeAgent, pod: JSON) -> None:
        namespace, name = _key(pod)
        super().__init__(name=f"pod-{namespace}-{name}", daemon=True)
        self.agent, self.pod = agent, pod
        self.namespace, self.pod_name = namespace, name
        self.uid: str = pod["metadata"]["uid"]
        self.spec: JSON = pod["spec"]
        self.dir = agent.root / "pods" / namespace / f"{name}-{self.uid[:8]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.inits = [ContainerRun(c, True, self.dir) for c in self.spec.get("initContainers") or []]
        self.apps = [ContainerRun(c, False, self.dir) for c in self.spec.get("containers") or []]
        self.restart_policy: str = self.spec.get("restartPolicy", "Always")
        self.cancelled = threading.Event()
        self.delete_requested = False
        self.start_time = podspec.now_rfc3339()
        self._deadline = self._compute_deadline()
        self.phase, self.reason, self.message = "Pending", "", ""
        self.initialized = not self.inits
        self._transitions: dict[str, tuple[bool, str]] = {}
        self._published: JSON = {}
        self.volumes: dict[str, Path] = {}

    # -- control -------------------------------------------------------------------------------------

    def cancel(self, delete: bool) -> None:
        self.delete_requested = self.delete_requested or delete
        self.cancelled.set()

    def _compute_deadline(self) -> float | None:
        seconds = self.spec.get("activeDeadlineSeconds")
        return time.monotonic() + float(seconds) if seconds else None

    def _check_interrupts(self) -> None:
        if self.cancelled.is_set():
            raise PodCancelled
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise DeadlineExceeded

    def run(self) -> None:
        try:
            self._run()
        except PodCancelled:
            self._kill_all()
        except DeadlineExceeded:
            self._kill_all()
            self.phase, self.reason = "Failed", "DeadlineExceeded"
            self.message = "Pod was active on the node longer than the specified deadline"
            self._publish()
        except Exception as error:
            log.exception("pod %s/%s failed on the node", self.namespace, self.pod_name)
            self.agent.record(f"pod {self.namespace}/{self.pod_name}: internal error {error!r}")
            self._kill_all()
        finally:
            if self.delete_requested:
                self.agent.delete_pod_now(self.namespace, self.pod_name, self.uid)
            self.agent.runner_finished(self)

    def _run(self) -> None:
        self.agent.record(f"pod {self.namespace}/{self.pod_name}: starting on {self.agent.node_name}")
        self._publish()
        self._prepare_volumes()
        sidecars: list[ContainerRun] = []
        for run in self.inits:
            if run.sidecar:
                # A native sidecar (restartPolicy: Always) only has to start before the next container.
                self._drive([*sidecars, run], until=lambda run=run: run.running)  # type: ignore[misc]
                sidecars.append(run)
                continue
            self._drive([*sidecars, run], until=lambda run=run: run.final)  # type: ignore[misc]
            if not run.succeeded:
                self._stop_sidecars(sidecars)
                self._finish("Failed")
                return
        self.initialized = True
        self._publish()
        self._drive([*sidecars, *self.apps], until=lambda: all(run.final for run in self.apps))
        self._stop_sidecars(sidecars)
        self._finish("Succeeded" if all(run.succeeded for run in self.apps) else "Failed")

    def _stop_sidecars(self, sidecars: list[ContainerRun]) -> None:
        """Once the app containers are done, a kubelet stops the sidecars (in reverse order)."""
        for run in reversed(sidecars):
            run.final = True
            self._terminate([run])
        self._publish()

    def _finish(self, phase: str) -> None:
        self.phase = phase
        self.agent.record(f"pod {self.namespace}/{self.pod_name}: {phase}")
        self._publish()

    # -- volumes -------------------------------------------------------------------------------------

    def _prepare_volumes(self) -> None:
        while True:
            self._check_interrupts()
            try:
                self.volumes = {v["name"]: self.agent.volumes.prepare(self.pod, v, self.dir) for v in
                                self.spec.get("volumes") or []}
                return
            except ContainerBlocked as blocked:
                for run in self.inits + self.apps:
                    run.state = {"waiting": {"reason": "ContainerCreating", "message": blocked.message}}
                self._publish()
                self.cancelled.wait(RETRY_SECONDS)

    def _path_table(self, run: ContainerRun, runtime: Runtime) -> list[tuple[str, str]]:
        pairs = [(k, v) for k, v in runtime.image_paths.items()]
        for mount in run.spec.get("volumeMounts") or []:
            host = self.volumes[mount["name"]]
            if mount.get("subPath"):
                host = containers.setup_sub_path(host, mount["subPath"])
            pairs.append((mount["mountPath"], str(host)))
        return podspec.path_table(pairs)

    def _termination_file(self, run: ContainerRun, table: list[tuple[str, str]]) -> Path:
        container_path = run.spec.get("terminationMessagePath") or "/dev/termination-log"
        translated = podspec.translate(container_path, table)
        path = Path(translated) if translated != container_path else run.termination_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        table.append((container_path, str(path)))
        return path

    # -- containers ----------------------------------------------------------------------------------

    def _drive(self, runs: list[ContainerRun], until: Callable[[], bool]) -> None:
        while True:
            self._check_interrupts()
            changed = False
            for run in runs:
                changed = self._step(run) or changed
            if changed:
                self._publish()
            if until():
                return
            self.cancelled.wait(POLL_SECONDS)

    def _step(self, run: ContainerRun) -> bool:
        """Advance one container: start it when due, notice its exit, schedule a restart. True if changed."""
        if run.final:
            return False
        if run.process is None:
            if time.monotonic() < run.next_start:
                return False
            return self._try_start(run)
        returncode = run.process.poll()
        if returncode is None:
            return False
        self._record_exit(run, podspec.exit_code_of(returncode))
        return True

    def _try_start(self, run: ContainerRun) -> bool:
        before = run.state
        try:
            argv, env, cwd, termination = self._prepare_container(run)
        except ContainerBlocked as blocked:
            run.state = {"waiting": {"reason": blocked.reason, "message": blocked.message}}
            run.next_start = time.monotonic() + RETRY_SECONDS
            return run.state != before
        run.termination_path = termination
        run.log_file = run.log_path.open("ab")
        run.started_at = podspec.now_rfc3339()
        run.ever_started = True
        try:
            if run.container_name:
                run.process = containers.start_container(argv, output=run.log_file)
            else:
                run.process = subprocess.Popen(
                    die_with_parent(argv), cwd=cwd, env=env, stdout=run.log_file, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )
        except OSError as error:
            run.log_file.write(f"failed to start {argv!r}: {error}\n".encode())
            self._record_exit(run, 128, reason="StartError", message=f"failed to start container: {error}")
            return True
        self.agent.record(f"pod {self.namespace}/{self.pod_name}: container {run.name} started: {argv!r}")
        run.state = {"running": {"startedAt": run.started_at}}
        return True

    def _record_exit(
        self, run: ContainerRun, exit_code: int, reason: str | None = None, message: str = "", restart: bool = True
    ) -> None:
        run.process = None
        if run.log_file:
            run.log_file.close()
            run.log_file = None
        if not message:
            message = podspec.termination_message(
                run.termination_path.read_bytes() if run.termination_path.exists() else b"",
                run.log_path.read_bytes() if run.log_path.exists() else b"",
                run.spec.get("terminationMessagePolicy", "File"),
                exit_code,
            )
        run.state = {"terminated": podspec.terminated_state(exit_code, run.started_at, message, reason)}
        self.agent.record(f"pod {self.namespace}/{self.pod_name}: container {run.name} exited {exit_code}")
        if run.sidecar and restart and not run.final:
            pass  # a native sidecar is restarted whatever its exit code, while the pod runs
        elif exit_code == 0 or self.restart_policy == "Never" or not restart:
            run.final = True
            return
        run.last_state, run.restart_count = run.state, run.restart_count + 1
        backoff = min(2.0 ** (run.restart_count - 1), BACKOFF_MAX_SECONDS)
        run.next_start = time.monotonic() + backoff
        run.state = {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": f"back-off {backoff:g}s restarting failed container={run.name}"}}

    def _prepare_container(self, run: ContainerRun) -> tuple[list[str], dict[str, str], str, Path]:
        image = run.spec.get("image", "")
        runtime = self.agent.runtime_for(image)
        if runtime is None:
            raise ContainerBlocked(
                "ErrImageNeverPull", f'Container image "{image}" is not present with pull policy of Never'
            )
        if runtime.container_image:
            return self._prepare_real_container(run, runtime, runtime.container_image)
        table = self._path_table(run, runtime)
        termination = self._termination_file(run, table)
        table = podspec.path_table(table)
        env = self.agent.env.build(self.pod, run.spec, runtime, table, run.cwd)
        env["COMPILECACHE_TERMINATION_LOG"] = str(termination)
        command = [podspec.expand(part, env) for part in run.spec.get("command") or []]
        args = [podspec.expand(part, env) for part in run.spec.get("args") or []]
        argv = [podspec.translate(part, table) for part in (command or list(runtime.entrypoint)) + args]
        if not argv:
            raise ContainerBlocked("CreateContainerError", f"no command for image {image!r} and no entrypoint known")
        cwd = run.spec.get("workingDir")
        cwd = podspec.translate(cwd, table) if cwd else str(run.cwd)
        Path(cwd).mkdir(parents=True, exist_ok=True)
        return self._as_pod_user(run, runtime, argv, [Path(cwd), run.cwd, termination]), env, cwd, termination

    def _prepare_real_container(
        self, run: ContainerRun, runtime: Runtime, image: str
    ) -> tuple[list[str], dict[str, str], str, Path]:
        """A real container under podman: its volumes mounted where the spec says, its securityContext
        enforced by the runtime, its termination message file mounted at terminationMessagePath."""
        mounts: dict[str, containers.VolumeMount] = {}
        for mount in run.spec.get("volumeMounts") or []:
            host = self.volumes[mount["name"]]
            if mount.get("subPath"):
                host = containers.setup_sub_path(host, mount["subPath"])
            mounts[mount["mountPath"]] = containers.VolumeMount(host, bool(mount.get("readOnly")))
        termination = containers.prepare_termination_file(run.termination_path)
        env = self.agent.env.build_for_container(self.pod, run.spec, runtime)
        run.container_name = containers.container_name(self.pod["metadata"], run.name, run.restart_count)
        try:
            argv = containers.podman_run_argv(
                run.spec, self.spec.get("securityContext"), mounts, name=run.container_name, image=image,
                image_user=self.agent.image_user(image), env=env, termination_file=termination,
                pod=containers.format_pod(self.pod["metadata"]),
            )
        except containers.ContainerConfigError as refused:
            run.container_name = None
            raise ContainerBlocked(refused.reason, str(refused)) from refused
        return argv, env, str(run.cwd), termination

    def _as_pod_user(self, run: ContainerRun, runtime: Runtime, argv: list[str], own: list[Path]) -> list[str]:
        """Run the process as the uid, gid and groups the pod spec gives it (as a kubelet would), so that a
        permission mismatch fails here as it would on a node. The container's private directories (working
        directory, termination file) are handed to that uid, as a container's own root file system would be."""
        try:
            uid, gid, groups = containers.process_identity(self.pod, run.spec, runtime.user)
        except containers.ContainerConfigError as refused:
            raise ContainerBlocked(refused.reason, str(refused)) from refused
        if (uid, gid, groups) == (os.getuid(), os.getgid(), ()):
            return argv  # already who the pod says
        for path in own:
            os.chown(path, uid, gid)
        group_flag = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", *group_flag, "--", *argv]

    def _kill_all(self) -> None:
        self._terminate(self.inits + self.apps)

    def _terminate(self, runs: list[ContainerRun]) -> None:
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        grace = min(grace, self.agent.max_grace_seconds)
        running = [run for run in runs if run.process is not None]
        for run in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.process.pid, signal.SIGTERM)  # type: ignore[union-attr]
        deadline = time.monotonic() + grace
        for run in running:
            process = run.process
            assert process is not None
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if run.container_name:
                    containers.kill_container(run.container_name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            returncode = -signal.SIGKILL if process.returncode is None else process.returncode
            self._record_exit(run, podspec.exit_code_of(returncode), restart=False)

    # -- status --------------------------------------------------------------------------------------

    def _since(self, kind: str, ok: bool) -> str:
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != ok:
            self._transitions[kind] = (ok, podspec.now_rfc3339())
        return self._transitions[kind][1]

    def _conditions(self) -> list[JSON]:
        terminal = self.phase in podspec.TERMINAL_PHASES
        pending_inits = [r.name for r in self.inits if not r.succeeded]
        unready = [r.name for r in self.apps if not r.running]
        ready = not unready and not terminal
        reason: str | None
        message: str | None
        if terminal:
            reason, message = "PodCompleted", None
        else:
            reason = "ContainersNotReady" if unready else None
            message = podspec.unready_message("unready", unready) if unready else None
        init_ok = self.initialized or not pending_inits
        return [
            podspec.condition("Initialized", init_ok, self._since("Initialized", init_ok),
                              None if init_ok else "ContainersNotInitialized",
                              None if init_ok else podspec.unready_message("incomplete", pending_inits)),
            podspec.condition("Ready", ready, self._since("Ready", ready), reason, message),
            podspec.condition("ContainersReady", ready, self._since("ContainersReady", ready), reason, message),
            podspec.condition("PodScheduled", True, self._since("PodScheduled", True)),
        ]

    def _status(self) -> JSON:
        phase = self.phase
        if phase not in podspec.TERMINAL_PHASES:
            phase = "Running" if self.initialized and any(r.ever_started for r in self.apps) else "Pending"
        ip = self.agent.node_ip
        status: JSON = {
            "phase": phase,
            "conditions": self._conditions(),
            "hostIP": ip,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": self.start_time,
            "initContainerStatuses": [r.status() for r in self.inits],
            "containerStatuses": [r.status() for r in self.apps],
            "reason": self.reason or None,
            "message": self.message or None,
        }
        return status

    def _publish(self) -> None:
        status = self._status()
        comparable = {k: v for k, v in status.items() if k != "conditions"}
        comparable["conditions"] = [(c["type"], c["status"], c.get("reason")) for c in status["conditions"]]
        if comparable == self._published:
            return
        try:
            self.agent.client.merge_patch(
                _pod_path(self.namespace, self.pod_name) + "/status",
                {"metadata": {"uid": self.uid}, "status": status},
            )
        except KubeAPIError as error:
            if error.status in (404, 409, 422):
                self.agent.record(f"pod {self.namespace}/{self.pod_name}: status not written: {error}")
                self.cancelled.set()
                return
            raise
        self._published = comparable


class VolumeMaker:
    """Materialises pod volumes as host directories, reading ConfigMaps and Secrets through the API."""

    def __init__(self, client: KubeClient, root: Path) -> None:
        self.client, self.root = client, root

    def prepare(self, pod: JSON, volume: JSON, pod_dir: Path) -> Path:
        name = str(volume["name"])
        target: Path = pod_dir / "volumes" / name
        if "emptyDir" in volume:
            return containers.setup_empty_dir(target, podspec.pod_fs_group(pod))
        if "hostPath" in volume:
            return self._host_path(volume["hostPath"])
        sources = self._sources(volume, name)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for source in sources:
            self._write_source(pod, source, target)
        return target

    def _host_path(self, host: JSON) -> Path:
        path: Path = self.root / "hostpath" / str(host["path"]).strip("/")
        if host.get("type") in ("File", "FileOrCreate"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)
            return path
        try:
            return containers.setup_host_path(path, host.get("type") or "DirectoryOrCreate")
        except containers.ContainerConfigError as refused:
            raise ContainerBlocked("ContainerCreating", str(refused)) from refused

    @staticmethod
    def _sources(volume: JSON, name: str) -> list[JSON]:
        if "projected" in volume:
            return list(volume["projected"].get("sources") or [])
        for kind in ("configMap", "secret", "downwardAPI"):
            if kind in volume:
                return [{kind: volume[kind]}]
        kinds = sorted(set(volume) - {"name"})
        raise ContainerBlocked("ContainerCreating", f"volume {name!r}: unsupported volume type {kinds}")

    def _write_source(self, pod: JSON, source: JSON, target: Path) -> None:
        namespace = pod["metadata"]["namespace"]
        if "configMap" in source or "secret" in source:
            kind = "configMap" if "configMap" in source else "secret"
            ref = source[kind]
            object_name = ref.get("name") or ref.get("secretName", "")
            files = self.object_data(namespace, kind, object_name, bool(ref.get("optional")))
            items = ref.get("items")
            if items:
                files = {item["path"]: files[item["key"]] for item in items if item["key"] in files}
            for relative, data in files.items():
                _write_file(target / relative, data)
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                try:
                    value = podspec.field_value(pod, item["fieldRef"]["fieldPath"])
                except (KeyError, ValueError) as error:
                    raise ContainerBlocked("ContainerCreating", f"downwardAPI item {item!r}: {error}") from error
                _write_file(target / item["path"], value.encode())
        elif "serviceAccountToken" in source:
            _write_file(target / source["serviceAccountToken"]["path"], self._token(pod, source["serviceAccountToken"]))

    def object_data(self, namespace: str, kind: str, name: str, optional: bool) -> dict[str, bytes]:
        """The files of a ConfigMap or Secret; an absent optional object gives nothing."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        try:
            obj = self.client.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        except KubeAPIError as error:
            if error.status == 404:
                if optional:
                    return {}
                label = "configmap" if kind == "configMap" else "secret"
                raise ContainerBlocked("CreateContainerConfigError", f'{label} "{name}" not found') from error
            raise
        if kind == "configMap":
            data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
            return data
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    def _token(self, pod: JSON, request: JSON) -> bytes:
        namespace, account = pod["metadata"]["namespace"], pod["spec"].get("serviceAccountName", "default")
        spec: JSON = {
            "audiences": [request["audience"]] if request.get("audience") else [],
            "expirationSeconds": request.get("expirationSeconds", 3600),
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                               "uid": pod["metadata"]["uid"]},
        }
        answer = self.client.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"]).encode()


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class EnvBuilder:
    """Builds a container's process environment the way a kubelet resolves env and envFrom."""

    def __init__(self, volumes: VolumeMaker, service_host: str, service_port: str) -> None:
        self.volumes = volumes
        self.service_host, self.service_port = service_host, service_port

    def build(
        self, pod: JSON, container: JSON, runtime: Runtime, table: list[tuple[str, str]], cwd: Path
    ) -> dict[str, str]:
        env = {
            "PATH": os.pathsep.join([*runtime.path, os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")]),
            "HOME": str(cwd),
            "HOSTNAME": pod["metadata"]["name"],
            "TMPDIR": str(cwd),
            "LANG": "C.UTF-8",
            "KUBERNETES_SERVICE_HOST": self.service_host,
            "KUBERNETES_SERVICE_PORT": self.service_port,
            "KUBERNETES_SERVICE_PORT_HTTPS": self.service_port,
        }
        env.update(runtime.env)
        self._add_declared(pod, container, env, table)
        return env

    def build_for_container(self, pod: JSON, container: JSON, runtime: Runtime) -> dict[str, str]:
        """The environment of a real container: the image keeps its own PATH and HOME; the kubelet adds
        the API server's address, HOSTNAME, then envFrom and env (paths are real mounts, nothing rewritten)."""
        env = {
            "HOSTNAME": pod["metadata"]["name"],
            "KUBERNETES_SERVICE_HOST": self.service_host,
            "KUBERNETES_SERVICE_PORT": self.service_port,
            "KUBERNETES_SERVICE_PORT_HTTPS": self.service_port,
            **runtime.env,
        }
        self._add_declared(pod, container, env, [])
        return env

    def _add_declared(self, pod: JSON, container: JSON, env: dict[str, str], table: list[tuple[str, str]]) -> None:
        namespace = pod["metadata"]["namespace"]
        for source in container.get("envFrom") or []:
            kind = "configMap" if "configMapRef" in source else "secret"
            ref = source.get("configMapRef") or source.get("secretRef") or {}
            data = self.volumes.object_data(namespace, kind, ref.get("name", ""), bool(ref.get("optional")))
            prefix = source.get("prefix", "")
            env.update({prefix + k: v.decode("utf-8", "replace") for k, v in data.items()})
        for variable in container.get("env") or []:
            value = self._value(pod, variable, env)
            if value is not None:
                env[variable["name"]] = podspec.translate(value, table)

    def _value(self, pod: JSON, variable: JSON, env: Mapping[str, str]) -> str | None:
        if "valueFrom" not in variable:
            return podspec.expand(variable.get("value", ""), env)
        source = variable["valueFrom"]
        if "fieldRef" in source:
            try:
                return podspec.field_value(pod, source["fieldRef"]["fieldPath"])
            except ValueError as error:
                raise ContainerBlocked("CreateContainerConfigError", str(error)) from error
        for kind, ref_key in (("secret", "secretKeyRef"), ("configMap", "configMapKeyRef")):
            if ref_key in source:
                ref = source[ref_key]
                optional = bool(ref.get("optional"))
                data = self.volumes.object_data(pod["metadata"]["namespace"], kind, ref["name"], optional)
                if ref["key"] in data:
                    return data[ref["key"]].decode("utf-8", "replace")
                if optional:
                    return None
                label = "Secret" if kind == "secret" else "ConfigMap"
                raise ContainerBlocked(
                    "CreateContainerConfigError",
                    f"couldn't find key {ref['key']} in {label} {pod['metadata']['namespace']}/{ref['name']}",
                )
        raise ContainerBlocked("CreateContainerConfigError", f"env {variable['name']}: unsupported valueFrom")


class NodeAgent:
    """Registers one Node and plays its kubelet (and the scheduler for pods that fit it).

    ``images`` maps image-name prefixes to Runtimes. ``namespaces`` limits which pods it schedules
    (None: all). ``root`` holds pod directories and logs (a temp dir by default, removed on stop unless
    ``keep_root``). Use as a context manager or call start/stop.
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        node_name: str,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        images: Mapping[str, Runtime] | None = None,
        namespaces: set[str] | None = None,
        root: Path | None = None,
        node_ip: str | None = None,
        heartbeat_seconds: float = 5.0,
        max_grace_seconds: float = 5.0,
        keep_root: bool = False,
    ) -> None:
        self.node_name = node_name
        self.labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        self.capacity = {"cpu": "8", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi",
                         **(capacity or {})}
        self.images = dict(images or {})
        self.namespaces = namespaces
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix=f"nodeagent-{node_name}-"))
        self.root.chmod(0o755)  # containers run as the uids their pods say: they must reach their directories
        self.keep_root = keep_root
        self.node_ip = node_ip or _detect_node_ip()
        self.heartbeat_seconds = heartbeat_seconds
        self.max_grace_seconds = max_grace_seconds
        self.client = KubeClient(kubeconfig)
        self.volumes = VolumeMaker(self.client, self.root)
        server = urllib.parse.urlsplit(self.client.server)
        self.env = EnvBuilder(self.volumes, server.hostname or "127.0.0.1", str(server.port or 443))
        self.events: collections.deque[str] = collections.deque(maxlen=2000)
        self._runners: dict[str, PodRunner] = {}
        self._done: set[str] = set()
        self._pod_dirs: dict[tuple[str, str], Path] = {}
        self._image_users: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._registered_at = podspec.now_rfc3339()

    # -- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> NodeAgent:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Register the Node, then start the heartbeat and pod-watch threads."""
        self._register_node()
        for target, name in ((self._heartbeat_loop, "heartbeat"), (self._watch_loop, "watch")):
            thread = threading.Thread(target=target, name=f"{self.node_name}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, delete_node: bool = True) -> None:
        """Kill every pod's processes, stop the threads, delete the Node (by default) and the root."""
        self._stopping.set()
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.cancel(delete=False)
        for runner in runners:
            runner.join(self.max_grace_seconds + 5)
        if delete_node:
            with contextlib.suppress(KubeAPIError):
                self.client.delete(f"/api/v1/nodes/{self.node_name}")
        self.client.close()
        for thread in self._threads:
            thread.join(2)
        if self._own_root and not self.keep_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- diagnostics ---------------------------------------------------------------------------------

    def record(self, line: str) -> None:
        log.info("%s", line)
        self.events.append(f"{time.strftime('%H:%M:%S')} {line}")

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory holding the pod's volumes, working directories, logs and termination files."""
        return self._pod_dirs.get((namespace, name))

    def container_log(self, namespace: str, name: str, container: str) -> str:
        """Everything the container printed (stdout and stderr, all restarts); empty if it never ran."""
        directory = self.pod_dir(namespace, name)
        path = directory / "logs" / f"{container}.log" if directory else None
        return path.read_text("utf-8", "replace") if path and path.exists() else ""

    def describe(self, namespace: str | None = None, limit: int = 4000) -> str:
        """The agent's event lines and the tail of every container log (of one namespace, or all)."""
        lines = [f"== node agent {self.node_name} events =="]
        lines += [e for e in self.events if namespace is None or f" {namespace}/" in e]
        for (ns, name), directory in sorted(self._pod_dirs.items()):
            if namespace is not None and ns != namespace:
                continue
            for log_file in sorted((directory / "logs").glob("*.log")):
                text = log_file.read_bytes()[-limit:].decode("utf-8", "replace")
                lines.append(f"== {ns}/{name} container {log_file.stem} ({log_file}) ==\n{text}")
        return "\n".join(lines)

    # -- node ----------------------------------------------------------------------------------------

    def image_user(self, image: str) -> str:
        """The USER of a local podman image (cached: podman image inspect takes a while)."""
        with self._lock:
            known = self._image_users.get(image)
        if known is None:
            known = containers.image_user(image)
            with self._lock:
                self._image_users[image] = known
        return known

    def runtime_for(self, image: str) -> Runtime | None:
        matches = [prefix for prefix in self.images if image.startswith(prefix)]
        return self.images[max(matches, key=len)] if matches else None

    def _node_status(self) -> JSON:
        now = podspec.now_rfc3339()

        def cond(kind: str, status: str, reason: str, message: str) -> JSON:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": self._registered_at}

        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.node_ip},
                          {"type": "Hostname", "address": self.node_name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                "osImage": "local processes", "containerRuntimeVersion": "local://0",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def _register_node(self) -> None:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name, "labels": self.labels}}
        try:
            self.client.post("/api/v1/nodes", body)
        except KubeAPIError as error:
            if error.status != 409:
                raise
            self.client.merge_patch(f"/api/v1/nodes/{self.node_name}", {"metadata": {"labels": self.labels}})
        self._post_node_status()
        self.record(f"node {self.node_name} registered with labels {self.labels}")

    def _post_node_status(self) -> None:
        self.client.merge_patch(f"/api/v1/nodes/{self.node_name}/status", {"status": self._node_status()})

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(self.heartbeat_seconds):
            try:
                self._post_node_status()
            except Exception as error:
                self.record(f"node status update failed: {error}")

    # -- pods ----------------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.client.get("/api/v1/pods")
                version = listing["metadata"]["resourceVersion"]
                for pod in listing.get("items") or []:
                    self._handle(pod)
                self._forget_missing({p["metadata"]["uid"] for p in listing.get("items") or []})
                while not self._stopping.is_set():
                    version = self._follow(version)
            except Exception as error:
                if not self._stopping.is_set():
                    self.record(f"pod watch restarting after: {error}")
                    self._stopping.wait(RETRY_SECONDS)

    def _follow(self, version: str) -> str:
        """Process one watch request's events; return the last resourceVersion seen."""
        for event in self.client.watch("/api/v1/pods", version, timeout_seconds=20):
            if self._stopping.is_set():
                break
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                raise KubeAPIError("WATCH", "/api/v1/pods", int(obj.get("code", 500)), str(obj))
            version = obj["metadata"]["resourceVersion"]
            if kind == "DELETED":
                self._forget(obj["metadata"]["uid"])
            elif kind in ("ADDED", "MODIFIED"):
                self._handle(obj)
        return version

    def _forget(self, uid: str) -> None:
        with self._lock:
            runner = self._runners.get(uid)
        if runner:
            runner.cancel(delete=False)

    def _forget_missing(self, present: set[str]) -> None:
        with self._lock:
            gone = [uid for uid in self._runners if uid not in present]
        for uid in gone:
            self._forget(uid)

    def _handle(self, pod: JSON) -> None:
        if self._stopping.is_set():
            return
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            if not meta.get("deletionTimestamp") and self._should_schedule(pod):
                self._bind(pod)
            return
        if node != self.node_name:
            return
        uid = meta["uid"]
        with self._lock:
            runner = self._runners.get(uid)
            finished = uid in self._done
        if meta.get("deletionTimestamp"):
            if runner:
                runner.cancel(delete=True)
            else:
                self.delete_pod_now(meta["namespace"], meta["name"], uid)
            return
        if runner or finished or (pod.get("status") or {}).get("phase") in podspec.TERMINAL_PHASES:
            return
        runner = PodRunner(self, pod)
        with self._lock:
            self._runners[uid] = runner
            self._pod_dirs[_key(pod)] = runner.dir
        runner.start()

    def _should_schedule(self, pod: JSON) -> bool:
        namespace = pod["metadata"]["namespace"]
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        if (pod.get("status") or {}).get("phase") in podspec.TERMINAL_PHASES:
            return False
        return podspec.pod_fits_node(pod, self.labels)

    def _bind(self, pod: JSON) -> None:
        namespace, name = _key(pod)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": pod["metadata"]["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.client.post(_pod_path(namespace, name) + "/binding", body)
        except KubeAPIError as error:
            if error.status in (404, 409):
                return
            raise
        self.record(f"pod {namespace}/{name}: bound to {self.node_name}")

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Remove a pod whose processes are gone, as a kubelet does after a graceful deletion."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self.client.delete(_pod_path(namespace, name), body)
        except KubeAPIError as error:
            if error.status not in (404, 409):
                self.record(f"pod {namespace}/{name}: delete failed: {error}")
                return
        self.record(f"pod {namespace}/{name}: deleted")

    def runner_finished(self, runner: PodRunner) -> None:
        with self._lock:
            self._runners.pop(runner.uid, None)
            self._done.add(runner.uid)
