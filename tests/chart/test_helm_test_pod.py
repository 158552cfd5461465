"""`helm test` on a correct install passes for a private-CA rediss store and for S3 through a projected
ServiceAccount token (IRSA): the rendered test pod mounts the CA where the URL names it and runs as the operator's
ServiceAccount, with no static keys and no Kubernetes API token; its store container's command, run as the pod
would run it against a real TLS redis-server and the S3 endpoint on loopback, succeeds.

What cannot run here: the cloud's identity webhook (EKS's pod-identity webhook) that projects a token for an
annotated ServiceAccount's pods. The test gives the command exactly what that webhook adds (``AWS_ROLE_ARN``,
``AWS_WEB_IDENTITY_TOKEN_FILE`` with a token file) and moto's STS stands in for AWS STS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.chart import one, template
from testsupport.kube.pki import CertificateAuthority
from testsupport.servers import LOOPBACK, RedisServer, S3Server, start_redis

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
CA_FILE = "/etc/compilecache/store-ca/ca.crt"
ROLE = "arn:aws:iam::123456789012:role/compilecache"


def rendered_test_pod(helm_bin: Path, *values: str) -> dict[str, Any]:
    manifests = template(helm_bin, set_values=values)
    return dict(one([m for m in manifests if m["metadata"]["name"].endswith("-test")], "Pod"))


def store_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "store"]
    return dict(container)


def run_command(command: list[str], env: dict[str, str], files: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    """The container's command on this machine: ``compilecache`` from the checkout; ``files`` maps a path the pod
    would have (a mounted volume) to where that file is here."""
    assert command[0] == "compilecache"
    args = command[1:]
    for inside, here in files.items():
        args = [a.replace(inside, str(here)) for a in args]
    return subprocess.run([sys.executable, "-m", "cachelib.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env},
                          timeout=120)


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    """A redis-server serving TLS with a certificate of a private CA; (server, TLS port, CA file)."""
    from testsupport.servers import free_port

    ca = CertificateAuthority(tmp_path / "pki", "compilecache-test-private-ca")
    pair = ca.issue("redis", LOOPBACK, server_names=(LOOPBACK,))
    port = free_port()
    extra = ("--tls-port", str(port), "--tls-cert-file", str(pair.cert), "--tls-key-file", str(pair.key),
             "--tls-ca-cert-file", str(ca.cert_path), "--tls-auth-clients", "no")
    with start_redis(tmp_path / "redis", extra=extra) as server:
        yield server, port, ca.cert_path


@pytest.mark.parametrize("source", ["secretName", "configMapName"])
def test_a_private_ca_rediss_store(helm_bin: Path, tls_redis: tuple[RedisServer, int, Path], tmp_path: Path,
                                   source: str) -> None:
    _, port, ca = tls_redis
    url = f"rediss://{LOOPBACK}:{port}/0?ca={CA_FILE}"
    pod = rendered_test_pod(helm_bin, f"storage.url={url}", f"storeCA.{source}=corp-ca", "storeCA.key=bundle.pem")
    container = store_container(pod)
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == os.path.dirname(CA_FILE) and mount["readOnly"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    kind = "secret" if source == "secretName" else "configMap"
    name_field = "secretName" if kind == "secret" else "name"
    assert volume[kind][name_field] == "corp-ca"
    assert volume[kind]["items"] == [{"key": "bundle.pem", "path": os.path.basename(CA_FILE)}]

    projected = tmp_path / "mounted" / "ca.crt"  # the volume's one item, as the kubelet writes it
    projected.parent.mkdir()
    projected.write_bytes(ca.read_bytes())
    passed = run_command(container["command"], {}, {CA_FILE: projected})
    assert passed.returncode == 0, passed.stderr
    other = CertificateAuthority(tmp_path / "other", "another-ca")  # the check can fail: a CA that did not sign it
    projected.write_bytes(other.cert_path.read_bytes())
    failed = run_command(container["command"], {}, {CA_FILE: projected})
    assert failed.returncode == 1, failed.stdout + failed.stderr


def test_s3_through_a_projected_service_account_token(helm_bin: Path, s3_server: S3Server, tmp_path: Path) -> None:
    url = s3_server.new_bucket("helm-test")
    pod = rendered_test_pod(helm_bin, f"storage.url={url}",
                   f"serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn={ROLE}")
    spec = pod["spec"]
    account = spec.get("serviceAccountName")
    manifests = template(helm_bin, set_values=[f"storage.url={url}"])
    assert account == one(manifests, "ServiceAccount")["metadata"]["name"]  # the operator's, annotated for IRSA
    assert spec["automountServiceAccountToken"] is False  # no Kubernetes API token: none is needed
    container = store_container(pod)
    assert not [e for e in container.get("env") or [] if e["name"].startswith("AWS_")]  # no static keys

    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")  # the projected token (moto's STS does not check it)
    webhook_env = {"AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
                   "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_STS": s3_server.endpoint}
    passed = run_command(container["command"], webhook_env, {})
    assert passed.returncode == 0, passed.stderr
    without_token = run_command(container["command"], {k: v for k, v in webhook_env.items()
                                                       if not k.startswith("AWS_WEB")}, {})
    assert without_token.returncode == 1, without_token.stdout + without_token.stderr


def test_with_a_credentials_secret_the_test_pod_keeps_the_default_account(helm_bin: Path) -> None:
    pod = rendered_test_pod(helm_bin, "storage.url=s3://bucket/cc", "storage.credentialsSecret=s3-keys")
    assert "serviceAccountName" not in pod["spec"]
    env = {e["name"] for e in store_container(pod)["env"]}
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= env
