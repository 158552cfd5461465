"""A real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager (or the API server
alone, for tests that run no pod and need no controller: ``find_binaries(..., controller_manager=False)``).

``LocalCluster`` starts the three processes with TLS, RBAC and the admission plugins of a current cluster
(Pod Security Admission included: a namespace labelled ``pod-security.kubernetes.io/enforce=restricted``
has its pods judged by the API server itself), waits until the API server is ready and the ``default``
ServiceAccount exists, and writes an admin kubeconfig. Nothing runs pods: pair it with a real node
(``tests.infra.node.RealNode``: start the cluster with ``kubelet_client=True`` so that the API server can
reach the kubelet for ``kubectl logs``/``exec``).

Binaries come from the environment (KUBE_APISERVER_BIN, KUBE_CONTROLLER_MANAGER_BIN, ETCD_BIN), else from
the cache directory filled by ``testsupport/kube/build.sh`` at the versions of ``versions.env``
(``${COMPILECACHE_TEST_CACHE:-~/.cache/compilecache-test}/kube-v<version>/bin`` and ``etcd-v<version>/bin``).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml

from testsupport.kube.pki import CertificateAuthority, KeyPair, write_service_account_keys
from testsupport.kube.rest import KubeAPIError, KubeClient
from testsupport.servers import free_port
from testsupport.wait import wait_for

BUILD_COMMAND = "testsupport/kube/build.sh"
VERSIONS_FILE = Path(__file__).with_name("versions.env")
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "DefaultTolerationSeconds",
    "NodeRestriction",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
    "PodSecurity",
)
LOG_TAIL_BYTES = 6000


class BinariesMissing(RuntimeError):
    """The control-plane binaries are not installed or not built yet."""


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of the control-plane executables (no controller manager: the API server alone)."""

    etcd: Path
    apiserver: Path
    controller_manager: Path | None


def cache_dir() -> Path:
    """The cache directory shared with build.sh (outside the checkout)."""
    return Path(os.environ.get("COMPILECACHE_TEST_CACHE") or Path.home() / ".cache" / "compilecache-test")


def versions(text: str | None = None) -> dict[str, str]:
    """The ``NAME=value`` lines of versions.env (the control plane's versions, shared with build.sh)."""
    text = VERSIONS_FILE.read_text() if text is None else text
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def find_binaries(kube_version: str | None = None, controller_manager: bool = True) -> KubeBinaries:
    """Locate etcd, kube-apiserver and kube-controller-manager (of versions.env's KUBE_VERSION, or
    ``kube_version``: e.g. KUBE_OLDEST_VERSION, whose API server build.sh builds alone); raise BinariesMissing naming
    what is absent. Without ``controller_manager`` the controller manager is neither looked for nor started."""
    wanted = versions()
    bin_dir = cache_dir() / f"kube-v{kube_version or wanted['KUBE_VERSION']}" / "bin"
    etcd_dir = cache_dir() / f"etcd-v{wanted['ETCD_VERSION']}" / "bin"
    overridden = kube_version is None  # KUBE_*_BIN name the binaries of KUBE_VERSION
    candidates = {
        "etcd": os.environ.get("ETCD_BIN") or str(etcd_dir / "etcd"),
        "kube-apiserver": (overridden and os.environ.get("KUBE_APISERVER_BIN")) or str(bin_dir / "kube-apiserver"),
    }
    if controller_manager:
        candidates["kube-controller-manager"] = (
            (overridden and os.environ.get("KUBE_CONTROLLER_MANAGER_BIN")) or str(bin_dir / "kube-controller-manager")
        )
    missing = [f"{name} ({path})" for name, path in candidates.items() if not os.access(path, os.X_OK)]
    if missing:
        raise BinariesMissing(
            "control-plane binaries not found: " + ", ".join(missing)
            + f"; build them with `{BUILD_COMMAND}` (Go >= 1.26 and the Go module proxy) or set ETCD_BIN, "
            "KUBE_APISERVER_BIN and KUBE_CONTROLLER_MANAGER_BIN"
        )
    return KubeBinaries(
        etcd=Path(candidates["etcd"]),
        apiserver=Path(candidates["kube-apiserver"]),
        controller_manager=Path(candidates["kube-controller-manager"]) if controller_manager else None,
    )


def die_with_parent(args: list[str]) -> list[str]:
    """Prefix ``args`` so that the process is killed when the thread that started it ends (a killed test run
    leaves no servers behind). Uses util-linux ``setpriv --pdeathsig`` where available."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *args] if setpriv else args


def kubeconfig_document(server: str, ca: Path, client: KeyPair, user: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, one client-certificate user and one current context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user, "namespace": "default"}}],
        "current-context": "local",
    }


def etcd_args(binaries: KubeBinaries, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        str(binaries.etcd),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        "--initial-cluster-state=new",
        "--listen-metrics-urls=",
        "--logger=zap",
        "--log-level=warn",
    ]


AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}]}
"""Every request at Metadata level (who, what, user agent, status), once answered (benchmarks count them)."""


def apiserver_args(
    binaries: KubeBinaries, pki: Path, etcd_port: int, secure_port: int, ca: Path, serving: KeyPair, sa: KeyPair,
    issuer: str, audit_log: Path | None = None, kubelet_client: KeyPair | None = None,
) -> list[str]:
    audit = [] if audit_log is None else [
        f"--audit-policy-file={audit_log.with_suffix('.policy.yaml')}", f"--audit-log-path={audit_log}",
        "--audit-log-mode=batch", "--audit-log-maxsize=0",
    ]
    kubelet = [] if kubelet_client is None else [
        f"--kubelet-client-certificate={kubelet_client.cert}", f"--kubelet-client-key={kubelet_client.key}",
        # The kubelet serves a self-signed certificate; the API server reaches it by the node's address.
        "--kubelet-preferred-address-types=InternalIP",
    ]
    return [
        str(binaries.apiserver),
        *audit,
        *kubelet,
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--advertise-address=127.0.0.1",
        # Current releases refuse a loopback address for the `kubernetes` Service's endpoints; nothing here
        # routes through that Service (pods get the real address in KUBERNETES_SERVICE_HOST).
        "--endpoint-reconciler-type=none",
        "--bind-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={ca}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=" + ",".join(ADMISSION_PLUGINS),
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        f"--service-account-key-file={sa.cert}",
        f"--service-account-signing-key-file={sa.key}",
        f"--service-account-issuer={issuer}",
        f"--api-audiences={issuer}",
        # Webhooks and aggregated APIs addressed by Service go to the Service's endpoints (pod IPs):
        # there is no kube-proxy to route ClusterIPs.
        "--enable-aggregator-routing=true",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_args(controller_manager: Path, kubeconfig: Path, ca: KeyPair, sa: KeyPair) -> list[str]:
    return [
        str(controller_manager),
        f"--kubeconfig={kubeconfig}",
        "--controllers=*",
        f"--service-account-private-key-file={sa.key}",
        f"--root-ca-file={ca.cert}",
        f"--cluster-signing-cert-file={ca.cert}",
        f"--cluster-signing-key-file={ca.key}",
        "--use-service-account-credentials=true",
        "--leader-elect=false",
        "--secure-port=0",
        "--concurrent-gc-syncs=5",
        "--v=1",
    ]


def _client_stem(user: str) -> str:
    return "user-" + "".join(ch if ch.isalnum() else "-" for ch in user)


class ManagedProcess:
    """A child process whose output goes to a log file; ``stop`` terminates, waits, then kills."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.args, self.log_path = name, args, log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.process = subprocess.Popen(
            die_with_parent(args), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code}\n{self.log_tail()}")

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        self._log.flush()
        data = self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")
        return f"--- last output of {self.name} ({self.log_path}) ---\n{data}"

    def stop(self, grace: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager on loopback, with TLS, RBAC and admission webhooks.

    The processes die with the thread that starts the cluster (see ``die_with_parent``): start it from a
    thread that outlives it, such as pytest's main thread. Use as a context manager (or call start/stop).
    Attributes once started: ``server`` (https URL),
    ``kubeconfig`` (admin, group system:masters), ``ca_path``, ``workdir`` (certificates, data and logs).
    """

    def __init__(
        self,
        binaries: KubeBinaries | None = None,
        workdir: Path | None = None,
        startup_timeout: float = 120.0,
        keep_workdir: bool = False,
        audit: bool = False,
        kubelet_client: bool = False,
        server_names: tuple[str, ...] = (),
    ) -> None:
        self.binaries = binaries or find_binaries()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="compilecache-kube-"))
        self.keep_workdir = keep_workdir
        self.startup_timeout = startup_timeout
        self.pki_dir = self.workdir / "pki"
        self.logs_dir = self.workdir / "logs"
        self.processes: list[ManagedProcess] = []
        self.startup_seconds: float | None = None
        self.server = ""
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log: Path | None = self.workdir / "audit.log" if audit else None
        """With ``audit``: the API server's audit log (JSON lines, one per answered request)."""
        self.kubelet_client = kubelet_client
        """With ``kubelet_client``: the API server holds a client certificate (group system:masters) that a real
        kubelet trusts, for ``kubectl logs``/``exec``/``port-forward``."""
        self.server_names = server_names
        """More addresses (or DNS names) in the API server's serving certificate: where a relay makes it
        reachable for pods (the real node's bridge gateway)."""
        self._ca: CertificateAuthority | None = None

    @property
    def ca_path(self) -> Path:
        return self.pki_dir / "ca.crt"

    # -- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd, the API server and the controller manager; raise with their logs if one fails."""
        started = time.monotonic()
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_processes()
            self._wait_ready()
        except BaseException as error:
            logs = self.log_tails()
            self.stop()
            if isinstance(error, Exception):
                raise RuntimeError(f"local Kubernetes control plane failed to start: {error}\n{logs}") from error
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stop the processes in reverse order and remove the working directory (unless kept)."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tails(self) -> str:
        """The last lines of every control-plane process's log."""
        return "\n".join(process.log_tail() for process in self.processes)

    def _start_processes(self) -> None:
        ca = self._ca = CertificateAuthority(self.pki_dir)
        sa = write_service_account_keys(self.pki_dir)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=(
                "127.0.0.1", "localhost", KUBERNETES_SERVICE_IP, "kubernetes", "kubernetes.default",
                "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", *self.server_names,
            ),
            client=False,
        )
        kubelet_client = (
            ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
            if self.kubelet_client else None
        )
        self.write_kubeconfig("admin", ("system:masters",), self.kubeconfig)
        kcm_kubeconfig = self.write_kubeconfig("system:kube-controller-manager", ())
        issuer = "https://kubernetes.default.svc.cluster.local"

        self._spawn("etcd", etcd_args(self.binaries, self.workdir / "etcd", etcd_port, peer_port))
        if self.audit_log is not None:
            self.audit_log.with_suffix(".policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        self._spawn(
            "kube-apiserver",
            apiserver_args(self.binaries, self.pki_dir, etcd_port, api_port, ca.cert_path, serving, sa, issuer,
                           self.audit_log, kubelet_client),
        )
        self._wait_healthz()
        if self.binaries.controller_manager is not None:
            self._spawn("kube-controller-manager",
                        controller_manager_args(self.binaries.controller_manager, kcm_kubeconfig, ca.pair, sa))

    def _spawn(self, name: str, args: list[str]) -> None:
        self.processes.append(ManagedProcess(name, args, self.logs_dir / f"{name}.log"))

    def _check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def _wait_healthz(self) -> None:
        context = ssl.create_default_context(cafile=str(self.ca_path))
        admin = _client_stem("admin")
        context.load_cert_chain(self.pki_dir / f"{admin}.crt", self.pki_dir / f"{admin}.key")

        def ready() -> bool:
            self._check_alive()
            with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=5) as response:
                return bool(response.status == 200)

        wait_for(ready, self.startup_timeout, "kube-apiserver /readyz", interval=0.25)

    def _wait_ready(self) -> None:
        client = KubeClient(self.kubeconfig)
        try:

            def default_service_account_exists() -> bool:
                # Pods get their token through a projected volume (TokenRequest): the account is all they need.
                self._check_alive()
                try:
                    client.get("/api/v1/namespaces/default/serviceaccounts/default")
                except KubeAPIError as error:
                    if error.status == 404:
                        return False
                    raise
                return True

            if self.binaries.controller_manager is not None:  # its ServiceAccount controller makes the account
                wait_for(default_service_account_exists, self.startup_timeout, "the default ServiceAccount")
        finally:
            client.close()

    # -- credentials ---------------------------------------------------------------------------------

    def write_kubeconfig(self, user: str, groups: tuple[str, ...] = (), path: Path | None = None) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` with a client certificate signed by the CA."""
        if self._ca is None:
            raise RuntimeError("the cluster is not started")
        stem = _client_stem(user)
        pair = self._ca.issue(stem, user, tuple(groups))
        path = path or self.workdir / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_document(self.server, self.ca_path, pair, user)))
        path.chmod(0o600)
        return path

    def connection(self, user: str, groups: tuple[str, ...] = (), server: str | None = None) -> Any:
        """A ``kopf.ConnectionInfo`` (what the operator's own API client takes) as ``user`` in ``groups``, to
        ``server`` (default: the API server itself; a relay in front of it in some tests)."""
        import kopf

        document = yaml.safe_load(self.write_kubeconfig(user, groups).read_text())
        credentials = document["users"][0]["user"]
        return kopf.ConnectionInfo(server=server or self.server, ca_path=str(self.ca_path),
                                   certificate_path=credentials["client-certificate"],
                                   private_key_path=credentials["client-key"])

    def client(self, user: str | None = None, groups: tuple[str, ...] = ()) -> KubeClient:
        """A dict-based KubeClient, as admin or as ``user`` in ``groups``."""
        return KubeClient(self.kubeconfig if user is None else self.write_kubeconfig(user, groups))

    def api(self, user: str | None = None, groups: tuple[str, ...] = ()) -> Any:
        """A configured ``kubernetes.client.ApiClient``, as admin or as ``user`` in ``groups``."""
        from kubernetes import config

        path = self.kubeconfig if user is None else self.write_kubeconfig(user, groups)
        return config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
