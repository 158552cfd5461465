"""The operator at scale on a real API server: N CompileCaches, what the operator costs at rest and on restart.

It starts its own control plane (etcd, kube-apiserver with an audit log, kube-controller-manager, from
testsupport/kube), creates N CompileCaches whose bundles are already recorded in status (as after their
warm-ups), and runs ``compilecache-operator`` as its own process with its own identity, then measures:

  observed      start → every cache Ready with its generation observed (first start, nothing settled), followed
                through one watch of the CompileCaches (listing 10,000 objects every second would load the
                API server more than the operator does)
  ready         start → /readyz (the webhook answers pods: the namespaces listed, a cache not listed yet read
                when its pod asks)
  idle req/s    requests of the operator's identity per second in the API server's audit log, over
                ``--idle-seconds`` once settled (watches counted when they start), resync every
                ``--resync-seconds``
  RSS           the operator's VmRSS once settled, after the first start and after a restart
  restart →     SIGKILL, a new process: from its start until a labelled pod sent through the API server
  injecting     (``dryRun``) comes back injected
  webhook       p50/p99 of AdmissionReviews sent straight to the webhook at ``--rate`` per second, and
                of pod creates through the API server (``dryRun``) with and without the opt-in label
  re-plan       ``--updates`` caches get a spec change at once → each observed with its new Job
  CPU           per cache, from the operator's start until every cache is observed: the CPU time of the
                operator, kube-apiserver and etcd (/proc), beside the rate of the bench's own writes that
                made the caches (a create and a status patch each): the first pass writes one status per
                cache, so the API server's writes bound how soon every cache can be observed
  floor         the bench's own status patches (one per cache, 16 writers, nothing else running): the seconds
                the API server needs for as many writes as the operator's first pass makes

It prints one table with the goals, the machine, its load (``/proc/loadavg`` before and after) and the
versions; ``--json`` keeps the figures, and ``--table A.json B.json ...`` prints one table of several runs
(the sizes side by side, as docs/benchmarks.md shows them):

    python bench/operator_scale.py --caches 1000 --json /tmp/scale-1000.json
    python bench/operator_scale.py --table /tmp/scale-1000.json /tmp/scale-3000.json /tmp/scale-10000.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
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

import urllib3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from compilecache_operator.decisions.cache_status import without_empty_strings  # noqa: E402
from compilecache_operator.decisions.plan import BundleRecord, plan_variants  # noqa: E402
from compilecache_operator.model.spec import Defaults  # noqa: E402
from compilecache_operator.model.spec_parse import parse_spec  # noqa: E402

from testsupport.kube.cluster import LocalCluster  # noqa: E402
from testsupport.kube.crd import CC_API, install_crd  # noqa: E402
from testsupport.kube.rest import KubeAPIError, KubeClient  # noqa: E402
from testsupport.servers import free_port  # noqa: E402
from testsupport.wait import answers_ok  # noqa: E402

NS = "bench"
STATUS_WRITERS = 16
"""The bench's status writers: as many as the operator's reconcile workers (``--concurrency``, 16)."""
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
    (variant,) = plan_variants(body["metadata"]["namespace"], name, parsed)
    record = BundleRecord(variant=variant.id, key=KEY.format(name=name), gpu=variant.gpu_label, image=IMAGE,
                          generation=1, job_id="job", job=f"cc-{name}", created="2026-01-01T00:00:00Z",
                          digest="0" * 64, bytes=1000)
    return {"bundles": [without_empty_strings(record.to_status())], "bundleCount": 1, "plannedGPUs": "cpu"}


def post_cache(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    return client.post(f"{CC_API}/namespaces/{namespace}/compilecaches", {
        "apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache", "metadata": {"name": name},
        "spec": spec()})  # fmt: skip


def settle(client: KubeClient, body: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    """Record the bundle of a finished warm-up in the cache's status, as the operator does; ``ready``: its
    status says Ready too, as after the operator's first reconcile."""
    meta = body["metadata"]
    status = settled_status(meta["name"], body)
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "BundlesPublished", "message": "",
                                 "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]
    return client.request("PATCH", f"{CC_API}/namespaces/{meta['namespace']}/compilecaches/{meta['name']}/status",
                          body={"status": status}, content_type="application/merge-patch+json")  # fmt: skip


def create_cache(client: KubeClient, namespace: str, name: str, *, ready: bool = False) -> dict[str, Any]:
    """One CompileCache whose warm-up already published its bundle (:func:`settle`)."""
    return settle(client, post_cache(client, namespace, name), ready=ready)


def create_caches(client: KubeClient, count: int, workers: int = 8) -> float:
    """``count`` settled CompileCaches: every create, then every status patch from as many writers as the
    operator's reconcile workers (16); the seconds the patches took, the API server alone writing them."""
    with ThreadPoolExecutor(workers) as pool:
        bodies = list(pool.map(lambda i: post_cache(client, NS, f"cache-{i:05d}"), range(count)))
    started = time.monotonic()
    with ThreadPoolExecutor(STATUS_WRITERS) as pool:
        list(pool.map(lambda body: settle(client, body), bodies))
    return time.monotonic() - started


class Observed:
    """Which caches are Ready with their generation observed, followed through one watch of the CompileCaches
    (started from a list, started again where it ended)."""

    def __init__(self, client: KubeClient, want: Callable[[dict[str, Any]], bool]) -> None:
        self.client, self.want = client, want
        self.good: set[str] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.version = self.relist()
        self.thread = threading.Thread(target=self.follow, daemon=True)
        self.thread.start()

    def relist(self) -> str:
        listed = self.client.get(f"{CC_API}/namespaces/{NS}/compilecaches")
        with self.lock:
            self.good.clear()
        self.take(listed["items"])
        return str(listed["metadata"]["resourceVersion"])

    def take(self, items: list[dict[str, Any]], deleted: bool = False) -> None:
        with self.lock:
            for item in items:
                name = item["metadata"]["name"]
                if not deleted and self.want(item):
                    self.good.add(name)
                else:
                    self.good.discard(name)

    def follow(self) -> None:
        while not self.stopped.is_set():
            try:
                for event in self.client.watch(f"{CC_API}/namespaces/{NS}/compilecaches", self.version, 60):
                    if event["type"] == "ERROR":
                        raise KubeAPIError("WATCH", "compilecaches", int(event["object"].get("code", 0)), "")
                    self.version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self.take([event["object"]], deleted=event["type"] == "DELETED")
            except (KubeAPIError, OSError, urllib3.exceptions.HTTPError):
                if self.stopped.is_set():
                    return
                time.sleep(0.5)
                with contextlib.suppress(KubeAPIError, OSError):
                    self.version = self.relist()

    def all(self, count: int) -> bool:
        with self.lock:
            return len(self.good) >= count

    def stop(self) -> None:
        self.stopped.set()


def ready_and_observed(cache: dict[str, Any]) -> bool:
    status = cache.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    return ready and status.get("observedGeneration") == cache["metadata"]["generation"]


AS_IN_THE_IMAGE = ("import runpy, sys; sys.modules['kubernetes'] = None; "
                   "runpy.run_module('compilecache_operator.main', run_name='__main__')")
"""Run the operator as its image holds it: the test environment's ``kubernetes`` client, which the operator's
image does not install, is kept out (Kopf imports it when it is there: two seconds of a start here)."""


class Operator:
    def __init__(self, cluster: LocalCluster, workdir: Path, resync: float) -> None:
        self.kubeconfig = cluster.write_kubeconfig(USER, ("system:masters",))
        self.workdir, self.resync = workdir, resync
        self.health, self.webhook, self.metrics = free_port(), free_port(), free_port()
        self.cert_dir = workdir / "tls"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        from compilecache_operator.edge import certs

        if not self.cert_dir.exists():
            self.cert_dir.mkdir(parents=True)
            certs.self_signed(["127.0.0.1", "localhost"], self.cert_dir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPILECACHE_")}
        env["KUBECONFIG"] = str(self.kubeconfig)
        argv = [sys.executable, "-c", AS_IN_THE_IMAGE, "--namespace", NS,
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
        return answers_ok(f"http://127.0.0.1:{self.health}/readyz")

    def rss_mb(self, field: str = "VmRSS") -> float:
        """The process's resident memory (``VmHWM``: its peak), MB."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
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


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(kube: LocalCluster, operator: Operator) -> dict[str, float]:
    assert operator.process is not None
    pids = {p.name: p.process.pid for p in kube.processes if p.name in ("kube-apiserver", "etcd")}
    return {name: cpu_seconds(pid) for name, pid in {**pids, "operator": operator.process.pid}.items()}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"caches": args.caches, "date": datetime.date.today().isoformat(), "load_before": loadavg()}
    with cluster() as kube, tempfile.TemporaryDirectory(prefix="operator-scale-") as scratch:
        client = kube.client()
        out["kube_apiserver"] = client.get("/version")["gitVersion"]
        install_crd(client)
        client.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        t0 = time.monotonic()
        out["status_patch_s"] = create_caches(client, args.caches)
        out["create_s"] = time.monotonic() - t0
        observed = Observed(client, ready_and_observed)
        operator = Operator(kube, Path(scratch), args.resync_seconds)
        try:
            operator.start()
            cpu_before = cpu_of(kube, operator)
            out["ready_s"] = wait(operator.ready, 600, "readiness") - operator.started
            out["observed_s"] = wait(lambda: observed.all(args.caches), 1200, "every cache observed",
                                     interval=0.2) - operator.started
            cpu_after = cpu_of(kube, operator)
            out["cpu_ms"] = {k: (cpu_after[k] - v) / args.caches * 1000 for k, v in cpu_before.items()}
            time.sleep(args.resync_seconds + 5)  # settle: one resync after the first pass
            out["rss_mb"] = operator.rss_mb()
            out["peak_rss_mb"] = operator.rss_mb("VmHWM")
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
            wait(lambda: observed.all(args.caches), 1200, "settled after restart", 1.0)
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
            out["load_after"] = loadavg()
        finally:
            operator.kill()
            observed.stop()
            if args.log and (Path(scratch) / "operator.log").exists():
                args.log.write_bytes((Path(scratch) / "operator.log").read_bytes())
    return out


GOALS = {
    "observed_s": ("≤ 60 s", 60.0), "idle_rps": ("0 /s", 0.0), "rss_mb": ("≤ 500 MB", 500.0),
    "restart_rss_mb": ("≤ 500 MB", 500.0), "restart_to_injecting_s": ("≤ 5 s", 5.0), "added99": ("≤ 10 ms", 10.0),
    "replan_s": ("≤ 5 s", 5.0),
}
"""The goals at 10,000 CompileCaches, by figure: as printed, and the bound."""


def figures(out: dict[str, Any]) -> dict[str, float]:
    """The latency runs reduced to their percentiles; what the webhook adds (labelled less unlabelled); the
    CPU per cache; the write rates."""
    got = {k: v for k, v in out.items() if isinstance(v, (int, float))}
    got.update({f"cpu_{k.replace('-', '_')}": v for k, v in out["cpu_ms"].items()})
    got["bench_writes"] = 2 * out["caches"] / out["create_s"]
    got["operator_writes"] = out["caches"] / out["observed_s"]
    got["status_patches"] = out["caches"] / out.get("status_patch_s", float("nan"))
    got["status_floor_s"] = out.get("status_patch_s", float("nan"))
    for key in ("direct_ms", "api_labelled_ms", "api_unlabelled_ms"):
        got[f"{key}50"], got[f"{key}99"] = pct(out[key], 0.5), pct(out[key], 0.99)
    got["added50"] = got["api_labelled_ms50"] - got["api_unlabelled_ms50"]
    got["added99"] = got["api_labelled_ms99"] - got["api_unlabelled_ms99"]
    return got


ROWS = [
    ("start → ready (/readyz)", "{ready_s:.1f} s", ""),
    ("start → every cache observed", "{observed_s:.1f} s", "observed_s"),
    ("status writes per second: the operator's first pass / the bench's own", "{operator_writes:.0f} / "
     "{bench_writes:.0f}", ""),
    ("the API server alone: status patches per second (16 writers) → seconds for one per cache",
     "{status_patches:.0f} /s → {status_floor_s:.1f} s", ""),
    ("CPU per cache until observed: operator / kube-apiserver / etcd",
     "{cpu_operator:.1f} / {cpu_kube_apiserver:.1f} / {cpu_etcd:.1f} ms", ""),
    ("idle API requests of the operator", "{idle_rps:.2f} /s", "idle_rps"),
    ("RSS, settled (peak)", "{rss_mb:.0f} MB ({peak_rss_mb:.0f} MB)", "rss_mb"),
    ("RSS, settled after a restart", "{restart_rss_mb:.0f} MB", "restart_rss_mb"),
    ("restart → ready (/readyz)", "{restart_ready_s:.1f} s", ""),
    ("restart → correct injection", "{restart_to_injecting_s:.1f} s", "restart_to_injecting_s"),
    ("webhook direct, p50 / p99", "{direct_ms50:.1f} / {direct_ms99:.1f} ms", ""),
    ("pod create through the API server, labelled, p50 / p99", "{api_labelled_ms50:.1f} / {api_labelled_ms99:.1f} ms",
     ""),
    ("pod create through the API server, unlabelled, p50 / p99",
     "{api_unlabelled_ms50:.1f} / {api_unlabelled_ms99:.1f} ms", ""),
    ("added by the webhook, p50 / p99", "{added50:.1f} / {added99:.1f} ms", "added99"),
    ("{updates} spec updates → every new Job created", "{replan_s:.1f} s", "replan_s"),
    ("machine load (1, 5, 15 min) before → after", "{load_before} → {load_after}", ""),
]


def table(outs: list[dict[str, Any]]) -> str:
    """One column per run (its number of CompileCaches), and the goals at 10,000."""
    runs = [{**out, **figures(out)} for out in outs]
    lines = ["| measure | " + " | ".join(f"{run['caches']:,}" for run in runs) + " | goal at 10,000 |",
             "|---" * (len(runs) + 2) + "|"]
    for label, value, goal in ROWS:
        label = label.format(updates=runs[0].get("updates", 100))
        cells = [value.format(**run) for run in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {GOALS[goal][0] if goal else ''} |")
    return "\n".join(lines)


def missed(out: dict[str, Any]) -> list[str]:
    """The goals a run missed (a run of fewer caches is held to the same bounds)."""
    got = figures(out)
    return [f"{key} = {got[key]:.2f} (goal {text})" for key, (text, bound) in GOALS.items() if got[key] > bound]


def versions() -> str:
    return ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("kopf", "aiohttp", "prometheus-client"))


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
    parser.add_argument("--table", type=Path, nargs="+", metavar="JSON",
                        help="print one table of the runs whose figures these files hold, and run nothing")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the operator and the control plane stopped too
    if args.table:
        print(table([json.loads(path.read_text()) for path in args.table]))
        return
    out = run(args)
    out["updates"] = args.updates
    out["machine"] = (f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                      f"kube-apiserver {out['kube_apiserver']}, {versions()}")
    print(table([out]))
    print("idle requests by verb and resource:", json.dumps(out["idle_requests"], sort_keys=True))
    print(f"machine: {out['machine']}; {out['date']}")
    print("goals missed:", "; ".join(missed(out)) or "none")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
