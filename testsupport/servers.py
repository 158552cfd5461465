"""Real servers for tests, on free loopback ports: redis-server and an S3 endpoint (moto).

Fixtures (register with ``pytest_plugins = ["testsupport.servers"]`` or import them into a conftest):

- ``redis_server`` (session): Debian's ``redis-server`` binary, no persistence, in a temp dir.
- ``redis_cluster`` (session): three ``redis-server`` primaries in cluster mode (no replicas),
  their 16384 slots split by ``redis-cli --cluster create``.
- ``s3_server`` (session): moto's server mode in a subprocess; dummy AWS credentials are put
  in ``os.environ`` for the session (and restored after) and also offered as ``.env`` for
  child processes.
- ``store_url`` (function): parametrised over ``file``, ``redis`` and ``s3``; a fresh, empty
  store for each test (a temp dir, a unique Redis key prefix, a new bucket). The kind
  ``redis-cluster`` (a fresh prefix on ``redis_cluster``) is there for suites that add it.

A missing binary or package skips the tests that need it, with the reason; with ``CI=true``
in the environment it fails them instead, so that CI never passes by skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testsupport import unavailable

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 30.0
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "compilecache-test",
    "AWS_SECRET_ACCESS_KEY": "compilecache-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_AWS_ENV_CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])




def _wait_until(ready: object, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text(errors='replace')[-2000:]}")
        if callable(ready) and ready():
            return
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(
        f"{what} did not become ready in {START_TIMEOUT:.0f} s:\n{log.read_text(errors='replace')[-2000:]}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- redis ----------------------------------------------------------------------------------
@dataclass
class RedisServer:
    host: str
    port: int
    password: str | None
    process: subprocess.Popen[bytes]
    directory: Path

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def store_url(self, **options: str) -> str:
        """A URL with a fresh key prefix (an empty store) plus any extra query options."""
        query = {"prefix": f"t{uuid.uuid4().hex[:12]}", **options}
        return self.url + "?" + "&".join(f"{k}={v}" for k, v in query.items())


def _redis_ping(port: int, password: str | None) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            if password:
                sock.sendall(f"AUTH {password}\r\n".encode())
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_binary(name: str) -> str:
    binary = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if binary is None:
        unavailable(f"{name} is not installed (Debian: apt-get install -y redis-server redis-tools)")
    return binary


@contextmanager
def start_redis(directory: Path, *, password: str | None = None, extra: tuple[str, ...] = ()) -> Iterator[RedisServer]:
    """Run a throw-away redis-server on a free loopback port (no RDB, no AOF)."""
    binary = _redis_binary("redis-server")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = directory / "redis.log"
    args = [binary, "--bind", LOOPBACK, "--port", str(port), "--dir", str(directory), "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--logfile", str(log), *extra]  # fmt: skip
    if password:
        args += ["--requirepass", password, "--masterauth", password]
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_until(lambda: _redis_ping(port, password), process, "redis-server", log)
        yield RedisServer(LOOPBACK, port, password, process, directory)
    finally:
        _stop(process)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@dataclass
class RedisCluster:
    """Primaries of one Redis Cluster on loopback; ``nodes[0]`` is the seed in :attr:`url`.

    With ``ca`` the nodes also serve TLS on ``tls_ports`` (and talk TLS among themselves), and
    :attr:`url` is a ``rediss-cluster://`` URL to the first TLS port, trusting ``ca``.
    """

    nodes: list[RedisServer]
    password: str | None
    ca: Path | None = None
    tls_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.ca:
            return f"rediss-cluster://{auth}{self.nodes[0].host}:{self.tls_ports[0]}?ca={self.ca}"
        return f"redis-cluster://{auth}{self.nodes[0].host}:{self.nodes[0].port}"

    def store_url(self, **options: str) -> str:
        """A URL with a fresh key prefix (an empty store) plus any extra query options."""
        query = {"prefix": f"t{uuid.uuid4().hex[:12]}", **options}
        return self.url + ("&" if "?" in self.url else "?") + "&".join(f"{k}={v}" for k, v in query.items())


def _cli(node: RedisServer, *command: str, tls: tuple[str, ...] = ()) -> str:
    auth = ["--no-auth-warning", "-a", node.password] if node.password else []
    proc = subprocess.run([_redis_binary("redis-cli"), "-h", node.host, "-p", str(node.port), *auth, *tls, *command],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return proc.stdout


def _cluster_ok(nodes: list[RedisServer]) -> bool:
    return all("cluster_state:ok" in _cli(node, "cluster", "info") for node in nodes)


@contextmanager
def start_redis_cluster(
    directory: Path, *, primaries: int = 3, password: str | None = None, tls: bool = False
) -> Iterator[RedisCluster]:
    """Run ``primaries`` cluster-mode redis-servers and join them into one cluster (no replicas).

    A node that stops is marked failed by the others after 2 s (``cluster-node-timeout``);
    every slot must be served for the cluster to answer (``cluster-require-full-coverage``).
    With ``tls`` a throw-away CA signs each node's certificate for 127.0.0.1; the cluster is
    created over TLS, so it announces its TLS ports.
    """
    extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
    ca_path: Path | None = None
    tls_ports = [free_port() for _ in range(primaries)] if tls else []
    tls_args: list[tuple[str, ...]] = [() for _ in range(primaries)]
    if tls:
        from testsupport.kube.pki import CertificateAuthority

        ca = CertificateAuthority(directory / "pki", "compilecache-test-redis-ca")
        ca_path = ca.cert_path
        for i in range(primaries):
            pair = ca.issue(f"node{i}", "127.0.0.1", server_names=(LOOPBACK,))
            tls_args[i] = ("--tls-port", str(tls_ports[i]), "--tls-cert-file", str(pair.cert),
                           "--tls-key-file", str(pair.key), "--tls-ca-cert-file", str(ca_path),
                           "--tls-cluster", "yes", "--tls-replication", "yes", "--tls-auth-clients", "no")  # fmt: skip
    with contextlib.ExitStack() as stack:
        nodes = [
            stack.enter_context(
                start_redis(directory / f"node{i}", password=password,
                            extra=(*extra, "--cluster-port", str(free_port()), *tls_args[i]))  # bus: not port + 10000
            )
            for i in range(primaries)
        ]  # fmt: skip
        client_tls = ("--tls", "--cacert", str(ca_path)) if ca_path else ()
        ports = tls_ports or [node.port for node in nodes]
        addresses = [f"{node.host}:{port}" for node, port in zip(nodes, ports, strict=True)]
        seed = RedisServer(nodes[0].host, ports[0], password, nodes[0].process, nodes[0].directory)
        _cli(seed, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes", tls=client_tls)
        deadline = time.monotonic() + START_TIMEOUT
        while not _cluster_ok(nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster of {addresses} did not reach cluster_state:ok")
            time.sleep(0.1)
        yield RedisCluster(nodes, password, ca_path, tls_ports)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with start_redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


# -- s3 (moto) ------------------------------------------------------------------------------
@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    env: dict[str, str] = field(default_factory=lambda: dict(DUMMY_AWS_ENV))
    """Dummy credentials and region for processes that talk to this server."""
    url: str = ""
    """A bucket created at start-up: ``s3://<bucket>/prefix?endpoint=...``."""

    def new_bucket(self, prefix: str = "prefix", **options: str) -> str:
        """Create an empty bucket and return its store URL (with any extra query options)."""
        import boto3

        bucket = f"cc-test-{uuid.uuid4().hex[:16]}"
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=self.env["AWS_DEFAULT_REGION"],
        )
        client.create_bucket(Bucket=bucket)
        client.close()
        query = {"endpoint": self.endpoint, **options}
        path = f"/{prefix}" if prefix else ""
        return f"s3://{bucket}{path}?" + "&".join(f"{k}={v}" for k, v in query.items())


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True  # it answers
    except OSError:
        return False


@contextmanager
def start_moto(directory: Path) -> Iterator[S3Server]:
    """Run moto's S3-compatible server in a subprocess on a free loopback port."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        unavailable("moto[server] is not installed (pip install 'moto[server]')")
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = directory / "moto.log"
    endpoint = f"http://{LOOPBACK}:{port}"
    env = {**os.environ, **DUMMY_AWS_ENV}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        _wait_until(lambda: _http_ready(endpoint + "/moto-api/"), process, "moto server", log)
        yield S3Server(endpoint=endpoint, process=process)
    finally:
        _stop(process)


@contextmanager
def aws_environment(values: dict[str, str]) -> Iterator[None]:
    """Set dummy AWS credentials in os.environ (clearing profiles and endpoints), then restore."""
    saved = {name: os.environ.get(name) for name in (*values, *_AWS_ENV_CLEARED)}
    for name in _AWS_ENV_CLEARED:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with start_moto(tmp_path_factory.mktemp("moto")) as server, aws_environment(server.env):
        server.url = server.new_bucket()
        yield server


# -- one store of each kind -------------------------------------------------------------------
STORE_KINDS = ("file", "redis", "s3")


def fresh_store_url(kind: str, request: pytest.FixtureRequest, **options: str) -> str:
    """An empty store of ``kind`` (options go into the URL's query; none for ``file``)."""
    if kind == "file":
        return f"file://{tempfile.mkdtemp(prefix='store-', dir=request.getfixturevalue('tmp_path'))}"
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        return server.store_url(**options)
    if kind == "s3":
        s3: S3Server = request.getfixturevalue("s3_server")
        return s3.new_bucket(**options)
    if kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return cluster.store_url(**options)
    raise ValueError(f"unknown store kind {kind!r}; expected one of {(*STORE_KINDS, 'redis-cluster')}")


def store_params(kinds: tuple[str, ...] = STORE_KINDS) -> list[object]:
    """The store kinds as fixture parameters; those that start a server are marked ``slow``."""
    return [kind if kind == "file" else pytest.param(kind, marks=pytest.mark.slow) for kind in kinds]


@pytest.fixture(params=store_params())
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty store URL: ``file://``, ``redis://`` and ``s3://`` in turn."""
    return fresh_store_url(str(request.param), request)
