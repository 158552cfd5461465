"""``python -m compilecache_operator.startupcheck``: wait until the CompileCache validating webhook answers.

The chart runs this as a post-install and post-upgrade hook Job (as cert-manager's ``startupapicheck``), so that
``helm install --wait --wait-for-jobs`` returns, and Argo CD's PostSync phase ends, only once a CompileCache can be
created: the webhook is ``failurePolicy: Fail``, and until an operator replica serves it with the CA the leader
writes into the webhook configuration, every create of a CompileCache fails. It dry-runs the create of a
CompileCache (``dryRun=All``: nothing is stored) as its own ServiceAccount until the API server's answer comes
from the webhook: an admission (the spec passed) or the webhook's own refusal (the spec did not: it answered all
the same). A failed call of the webhook, a CRD not served yet, or an API server not reachable yet is waited out,
up to ``--timeout`` seconds; then it exits 1 with the last answer.

Only the standard library: it runs in the operator's image, with the pod's in-cluster credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache_operator.edge.kubeconfig import in_cluster_server
from compilecache_operator.model.names import API_VERSION, GROUP, KIND, PLURAL, VERSION

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
WEBHOOK_NAME = f"validate.{PLURAL}.{GROUP}"
PROBE_NAME = "compilecache-startupcheck"


@dataclass(frozen=True)
class Answer:
    """What one dry-run create came to: whether the webhook answered, and what the API server said."""

    answered: bool
    detail: str


def probe_cache(name: str = PROBE_NAME) -> dict[str, Any]:
    """The CompileCache whose create is dry-run: a complete spec, so that the webhook admits it where nothing keeps
    the default store out (where something does, its refusal is an answer too)."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": {"image": "registry.invalid/compilecache/startupcheck:dry-run", "model": {"target": "tiny_mlp"}}}


def classify(status: int, body: str) -> Answer:
    """Whether an answer of the API server to the dry-run create came from the webhook."""
    try:
        parsed = json.loads(body) if body else {}
    except json.JSONDecodeError:
        parsed = {}
    message = str(parsed.get("message") or body or f"HTTP {status}") if isinstance(parsed, dict) else body
    if 200 <= status < 300:
        return Answer(True, f"HTTP {status}: the webhook admitted a dry-run CompileCache")
    if "failed calling webhook" in message or "no endpoints available" in message:
        return Answer(False, message)
    if f'admission webhook "{WEBHOOK_NAME}" denied' in message:
        return Answer(True, f"HTTP {status}: the webhook answered ({message})")
    return Answer(False, f"HTTP {status}: {message}")


@dataclass(frozen=True)
class Cluster:
    """Where the API server is and who this pod is (its ServiceAccount's token and the cluster's CA)."""

    server: str
    token: str
    context: ssl.SSLContext


def in_cluster(env: Mapping[str, str], account_dir: str = SERVICE_ACCOUNT) -> Cluster:
    server = in_cluster_server(env)
    if server is None:
        raise SystemExit("startupcheck: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (no pod?)")
    with open(os.path.join(account_dir, "token"), encoding="utf-8") as handle:
        token = handle.read().strip()
    return Cluster(server, token, ssl.create_default_context(cafile=os.path.join(account_dir, "ca.crt")))


def dry_run_create(cluster: Cluster, namespace: str, timeout: float = 15.0) -> Answer:
    """One dry-run create of :func:`probe_cache` in ``namespace``."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}?dryRun=All"
    request = urllib.request.Request(
        cluster.server + path, data=json.dumps(probe_cache()).encode(), method="POST",
        headers={"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=cluster.context) as response:
            return classify(response.status, response.read().decode(errors="replace"))
    except urllib.error.HTTPError as error:
        return classify(error.code, error.read().decode(errors="replace"))
    except OSError as error:
        return Answer(False, f"the API server is not reachable: {error}")


def wait_answered(attempt: Callable[[], Answer], timeout: float, interval: float,
                  say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Answer:
    """Run ``attempt`` until an answer came from the webhook or ``timeout`` seconds passed; say each new detail."""
    deadline = clock() + timeout
    said = ""
    while True:
        answer = attempt()
        if answer.detail != said:
            say(answer.detail)
            said = answer.detail
        if answer.answered or clock() >= deadline:
            return answer
        sleep(interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compilecache_operator.startupcheck", description=__doc__)
    parser.add_argument("--namespace", required=True, help="where the dry-run CompileCache is created")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait in all (default 300)")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between attempts (default 2)")
    args = parser.parse_args(argv)
    cluster = in_cluster(os.environ)

    def say(text: str) -> None:
        print(f"startupcheck: {text}", flush=True)

    answer = wait_answered(lambda: dry_run_create(cluster, args.namespace), args.timeout, args.interval, say)
    if answer.answered:
        return 0
    print(f"startupcheck: the CompileCache webhook did not answer within {args.timeout:.0f}s: {answer.detail}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
