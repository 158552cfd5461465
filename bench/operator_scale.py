"""The operator at scale on a real API server: N CompileCaches, what the operator costs at rest and on restart.

It starts its own control plane (etcd, kube-apiserver with an audit log, kube-controller-manager, from
testsupport/kube), creates N CompileCaches whose bundles are already recorded in status (as after their
warm-ups), and runs ``compilecache-operator`` as its own process with its own identity, then measures:

  observed      start → every cache Ready with its generation observed (first start, nothing settled)
  ready         start → /readyz (the webhook knows every cache)
  idle req/s    requests of the operator's identity per second in the API server's audit log, over
                ``--idle-seconds`` once settled (watches counted when they start), resync every
                ``--resync-seconds``
  RSS           the operator's VmRSS once settled, after the first start and after a restart
  restart →     SIGKILL, a new process: from its start until a labelled pod sent through the API server
  injecting     (``dryRun``) comes back injected
  webhook       p50/p99 of AdmissionReviews sent straight to the webhook at ``--rate`` per second, and
                of pod creates through the API server (``dryRun``) with and without the opt-in label
  re-plan       ``--updates`` caches get a spec change at once → each observed with its new Job

    python bench/operator_scale.py --caches 1000 --write-docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compilecache_operator.cache_status import without_empty_strings  # noqa: E402
from compilecache_operator.plan import BundleRecord, plan_variants  # noqa: E402
from compilecache_operator.spec import Defaults  # noqa: E402
from compilecache_operator.spec_parse import parse_spec  # noqa: E402

from testsupport.kube.cluster import LocalCluster  # noqa: E402
from testsupport.kube.crd import CC_API, install_crd  # noqa: E402
from testsupport.kube.rest import KubeAPIError, KubeClient  # noqa: E402
from testsupport.servers import free_port  # noqa: E402

NS = "bench"
USER = "compilecache-operator"
IMAGE = "registry.example/app:1"
KEY = "cc1/bench/{name}/0123456789abcdef/fedcba9876543210/cpu/cpu/torch-2.13.0/triton-none/cuda-none/py-3.11.2"


def spec(mode: str = "default") -> dict[str, Any]:
    """A cache for the CPU; a different compile mode plans a new variant (a new warm-up Job)."""
    return {"image": IMAGE, "model": {"target": "tiny_mlp", "compile": {"mode": mode}},
            "storage": {"url": "redis://127.0.0.1:1/0"}, "gpuTypes": ["cpu"]}


def settled_status(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """The status a finished warm-up leaves: the bundle of the planned variant, as the operator writes it."""
    parsed = parse_spec(body["spec"], Defaults())
    (variant,) = plan_variants(NS, name, parsed)
    record = BundleRecord(variant=variant.id, key=KEY.format(name=name), gpu=variant.gpu_label, image=IMAGE,
                          generation=1, job_id="job", job=f"cc-{name}", created="2026-01-01T00:00:00Z",
                          digest="0" * 64, bytes=1000)
    return {"bundles": [without_empty_strings(record.to_status())], "bundleCount": 1, "plannedGPUs": "cpu"}


def create_caches(client: KubeClient, count: int, workers: int = 8) -> None:
    def one(i: int) -> None:
        name = f"cache-{i:05d}"
        body = client.post(f"{CC_API}/namespaces/{NS}/compilecaches", {
            "apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": name},
            "spec": spec()})
        client.request("PATCH", f"{CC_API}/namespaces/{NS}/compilecaches/{name}/status",
                       body={"status": settled_status(name, body)}, content_type="application/merge-patch+json")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(count)))


def all_observed(client: KubeClient, count: int, want: Callable[[dict[str, Any]], bool]) -> bool:
    items = client.get(f"{CC_API}/namespaces/{NS}/compilecaches")["items"]
    return len(items) == count and all(want(c) for c in items)


def ready_and_observed(cache: dict[str, Any]) -> bool:
    status = cache.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    return ready and status.get("observedGeneration") == cache["metadata"]["generation"]


class Operator:
    def __init__(self, cluster: LocalCluster, workdir: Path, resync: float) -> None:
        self.kubeconfig = cluster.write_kubeconfig(USER, ("system:masters",))
        self.workdir, self.resync = workdir, resync
        self.health, self.webhook, self.metrics = free_port(), free_port(), free_port()
        self.cert_dir = workdir / "tls"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        from compilecache_operator import certs

        if not self.cert_dir.exists():
            self.cert_dir.mkdir(parents=True)
            certs.self_signed(["127.0.0.1", "localhost"], self.cert_dir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPILECACHE_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        argv = [sys.executable, "-m", "compilecache_operator.main", "--namespace", NS,
                "--webhook-config", "managed", "--webhook-host", "127.0.0.1", "--webhook-listen-address", "127.0.0.1",
                "--webhook-port", str(self.webhook), "--webhook-cert-dir", str(self.cert_dir),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics),
                "--health-address", "127.0.0.1", "--health-port", str(self.health),
                "--resync-seconds", str(self.resync), "--preloader-image", "ghcr.io/compilecache/preloader:bench"]
        log = open(self.workdir / "operator.log", "ab")  # noqa: SIM115 (the process keeps it)
        self.started = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                        start_new_session=True)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/readyz", timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def rss_mb(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def wait(probe: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if probe():
                return time.monotonic()
        except (KubeAPIError, OSError):
            pass
        time.sleep(interval)
    raise TimeoutError(what)


def audit_requests(log: Path, user: str, start: float, end: float) -> dict[str, int]:
    """Requests of ``user`` answered between wall-clock times ``start`` and ``end``, by verb and resource."""
    from datetime import datetime

    counts: dict[str, int] = {}
    with log.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("user", {}).get("username") != user:
                continue
            if event.get("stage") not in ("ResponseComplete", "ResponseStarted"):
                continue
            if event["stage"] == "ResponseComplete" and event.get("verb") == "watch":
                continue  # a watch counts once, when it starts
            when = datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            if start <= when <= end:
                ref = event.get("objectRef") or {}
                key = f"{event['verb']} {ref.get('resource', event.get('requestURI', ''))}"
                counts[key] = counts.get(key, 0) + 1
    return counts


def labelled_pod(labelled: bool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "probe-", "labels": {"compilecache.io/cache": "cache-00000"} if labelled
                         else {"app": "x"}},
            "spec": {"containers": [{"name": "app", "image": IMAGE}]}}


def injected(client: KubeClient) -> bool:
    pod = client.request("POST", f"/api/v1/namespaces/{NS}/pods", body=labelled_pod(True),
                         query={"dryRun": "All"})
    return "compilecache.io/injected" in (pod["metadata"].get("annotations") or {})


def paced(rate: float, seconds: float, call: Callable[[], None], workers: int = 8) -> list[float]:
    """Latencies (ms) of ``call`` started at ``rate`` per second for ``seconds``."""
    latencies: list[float] = []
    lock = threading.Lock()

    def timed() -> None:
        t0 = time.perf_counter()
        call()
        with lock:
            latencies.append((time.perf_counter() - t0) * 1000)

    with ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(timed)
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def direct_review(port: int) -> Callable[[], None]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    review = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "namespace": NS, "object": labelled_pod(True)}}).encode()

    def call() -> None:
        request = urllib.request.Request(f"https://127.0.0.1:{port}/inject-pods", data=review,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            assert json.loads(response.read())["response"]["allowed"]

    return call


@contextmanager
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(audit=True) as running:
        yield running


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"caches": args.caches}
    with cluster() as kube, tempfile.TemporaryDirectory(prefix="operator-scale-") as scratch:
        client = kube.client()
        install_crd(client)
        client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        t0 = time.monotonic()
        create_caches(client, args.caches)
        out["create_s"] = time.monotonic() - t0
        operator = Operator(kube, Path(scratch), args.resync_seconds)
        operator.start()
        out["ready_s"] = wait(operator.ready, 600, "readiness") - operator.started
        out["observed_s"] = wait(lambda: all_observed(client, args.caches, ready_and_observed), 1200,
                                 "every cache observed", interval=1.0) - operator.started
        time.sleep(args.resync_seconds + 5)  # settle: one resync after the first pass
        out["rss_mb"] = operator.rss_mb()
        assert kube.audit_log is not None
        start = time.time()
        time.sleep(args.idle_seconds)
        counts = audit_requests(kube.audit_log, USER, start, time.time())
        out["idle_rps"] = sum(counts.values()) / args.idle_seconds
        out["idle_requests"] = counts

        out["direct_ms"] = paced(args.rate, args.seconds, direct_review(operator.webhook))
        out["api_labelled_ms"] = paced(args.rate, args.seconds, lambda: injected(client) and None)
        out["api_unlabelled_ms"] = paced(args.rate, args.seconds, lambda: client.request(
            "POST", f"/api/v1/namespaces/{NS}/pods", body=labelled_pod(False), query={"dryRun": "All"}) and None)

        operator.kill()
        operator.start()
        out["restart_to_injecting_s"] = wait(lambda: injected(client), 600, "injection after restart",
                                             interval=0.02) - operator.started
        out["restart_ready_s"] = wait(operator.ready, 600, "readiness after restart") - operator.started
        wait(lambda: all_observed(client, args.caches, ready_and_observed), 1200, "settled after restart", 1.0)
        time.sleep(args.resync_seconds + 5)
        out["restart_rss_mb"] = operator.rss_mb()

        names = [f"cache-{i:05d}" for i in range(args.updates)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: client.request(
                "PATCH", f"{CC_API}/namespaces/{NS}/compilecaches/{n}", body={"spec": spec("reduce-overhead")},
                content_type="application/merge-patch+json"), names))

        def replanned() -> bool:
            jobs = client.get(f"/apis/batch/v1/namespaces/{NS}/jobs")["items"]
            owners = {(j["metadata"].get("labels") or {}).get("compilecache.io/warmup-for") for j in jobs}
            return all(n in owners for n in names)

        out["replan_s"] = wait(replanned, 600, "the re-planned Jobs", interval=0.2) - t0
        operator.kill()
        if args.log:
            args.log.write_bytes((Path(scratch) / "operator.log").read_bytes())
    return out


def table(out: dict[str, Any]) -> str:
    def lat(key: str) -> str:
        v = out[key]
        return f"{pct(v, 0.5):.1f} / {pct(v, 0.99):.1f}"

    added50 = pct(out["api_labelled_ms"], 0.5) - pct(out["api_unlabelled_ms"], 0.5)
    added99 = pct(out["api_labelled_ms"], 0.99) - pct(out["api_unlabelled_ms"], 0.99)
    rows = [
        ("CompileCaches", f"{out['caches']:,}", ""),
        ("start → ready (/readyz: every cache known)", f"{out['ready_s']:.1f} s", ""),
        ("start → every cache observed", f"{out['observed_s']:.1f} s", ""),
        ("idle API requests of the operator", f"{out['idle_rps']:.2f} /s", "≤ 0.5 /s"),
        ("RSS, settled", f"{out['rss_mb']:.0f} MB", "≤ 150 MB"),
        ("RSS, settled after a restart", f"{out['restart_rss_mb']:.0f} MB", "≤ 150 MB"),
        ("restart → ready (/readyz)", f"{out['restart_ready_s']:.1f} s", ""),
        ("restart → correct injection", f"{out['restart_to_injecting_s']:.1f} s", "≤ 5 s"),
        ("webhook direct, p50 / p99", f"{lat('direct_ms')} ms", ""),
        ("pod create through the API server, labelled, p50 / p99", f"{lat('api_labelled_ms')} ms", ""),
        ("pod create through the API server, unlabelled, p50 / p99", f"{lat('api_unlabelled_ms')} ms", ""),
        ("added by the webhook, p50 / p99", f"{added50:.1f} / {added99:.1f} ms", "p99 ≤ 10 ms"),
        (f"{out['updates']} spec updates → every new Job created", f"{out['replan_s']:.1f} s", "≤ 5 s"),
    ]
    lines = ["| measure | value | goal |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caches", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--resync-seconds", type=float, default=60.0)
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=50.0, help="admissions per second for the latency runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each latency run")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--log", type=Path, help="copy the operator's log here")
    args = parser.parse_args()
    out = run(args)
    out["updates"] = args.updates
    text = table(out)
    print(text)
    print("idle requests by verb and resource:", json.dumps(out["idle_requests"], sort_keys=True))
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
