"""The Kopf handlers: thin wrappers that call the controller, the webhook and the metrics.

They are registered at import, in Kopf's default registry; the settings they need are read at
start-up into the memo (``memo["state"]``, ``memo["intervals"]``):

- indexes (Kopf keeps them current from its watches): the CompileCaches (the webhook's view and
  the objects), their warm-up Jobs, the Nodes' labels. A reconcile reads them, not the API.
  Jobs and pods are watched with server-side label selectors (only warm-up Jobs, only opted-in pods);
- readiness: Kopf runs the first non-index handler only once every index is loaded; the first
  Node or CompileCache event therefore marks the operator Ready (``/readyz``), so no replica takes
  webhook traffic before it knows the caches;
- CompileCache events: reconcile a cache whose inputs changed since its last settled reconcile
  (:func:`controller.handle`); with ``deletionPolicy: Delete`` the cache carries the finalizer
  ``compilecache.io/bundles``, and its deletion deletes its bundles first. These are plain event
  handlers, not Kopf's change handlers, so Kopf itself writes nothing to the objects;
- the resync: a task of its own that handles the caches whose inputs changed or that still wait
  for something; an unchanged cache costs nothing;
- warm-up Job events: reconcile the owner as soon as a Job finishes;
- opted-in pod events: count each pod's preload result once (a sidecar's when the pod ends, at
  the latest from the DELETED event); and, once a workload container has ended with the verdict of
  ``cachelib.runtime`` in its termination message, tally why it started cold into its cache's
  ``status.coldStarts`` (:mod:`compilecache_operator.coldstarts`), once per pod;
- with leader election, only the replica holding the Lease acts (events, Jobs, pods, resync);
  every replica keeps its indexes and serves the webhook;
- the admission webhooks, registered by :func:`register_webhook` when the operator serves them and
  answered directly by its server (:mod:`compilecache_operator.kopfadapter`): the pod-mutating one
  (:mod:`compilecache_operator.webhook`) and, when asked for, the CompileCache validating one
  (:mod:`compilecache_operator.validation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf
from compilecache_operator import (
    builders,
    certs,
    coldstarts,
    controller,
    kopfadapter,
    kubeconfig,
    leader,
    probes,
    servingcert,
    signingkey,
    tlsreload,
)
from compilecache_operator.conditions import find, merge_conditions, now_rfc3339
from compilecache_operator.confinement import Confinement, Grant
from compilecache_operator.kube import KubeAPI, KubeError
from compilecache_operator.metrics import WEBHOOK_HANDLER, cache_gpus, instrumented
from compilecache_operator.names import (
    CACHE_LABEL,
    CACHE_WEBHOOK_ID,
    COLD_COUNTED_ANNOTATION,
    COUNTED_ANNOTATION,
    GPU_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    PREFIX,
    RECORDED_ANNOTATION,
    VERSION,
    WARMUP_LABEL,
    WEBHOOK_ID,
)
from compilecache_operator.results import job_condition, preload_outcome
from compilecache_operator.sidecars import detect_native_sidecars
from compilecache_operator.signing import Signing
from compilecache_operator.validation import read_grants, review_cache
from compilecache_operator.webhook import review_pod

from cachelib.keyformat import gpu_slug

logger = logging.getLogger(__name__)
MAX_COUNTED = 100_000
CC = (GROUP, VERSION, PLURAL)


@dataclass(frozen=True)
class Intervals:
    resync_seconds: float = 60.0
    """How often the caches with something to look at are reconciled again."""
    watch_server_timeout: int = 300


@dataclass
class Admission:
    """The webhook server and, in managed mode, the webhook configuration's name; where its certificate
    comes from and how it is reloaded."""

    server: kopfadapter.AdmissionServer | None = None
    managed: str | None = None
    check_caches: bool = False
    """Whether the CompileCache validating webhook is served (refusing at admission what would be InvalidSpec)."""
    reloader: tlsreload.Reloader | None = None
    serving: servingcert.Target | None = None
    """The operator's own serving certificate Secret (None: files, or self-signed)."""
    policy: servingcert.Policy = dataclasses.field(default_factory=servingcert.Policy)
    check_seconds: float = 10.0
    cert_ready: bool = True
    """The certificate served is the one to serve (with ``serving``: once the Secret's is loaded)."""
    watch_files: bool = False
    """Whether the certificate files may be renewed (a mounted Secret)."""


@dataclass(frozen=True)
class SigningSecret:
    """The signing key's Secret (see :mod:`compilecache_operator.signingkey`)."""

    namespace: str
    name: str
    extra_trusted: tuple[str, ...]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Election:
    """The Lease that decides which replica acts (see :mod:`compilecache_operator.leader`)."""

    namespace: str
    name: str = "compilecache-operator"


@dataclass(frozen=True)
class Probes:
    """Where ``/healthz`` and ``/readyz`` are served (port 0: not at all)."""

    address: str = "0.0.0.0"
    port: int = 0


class CountedPods:
    """Pod uids already counted, so a burst of events before the annotation lands counts once."""

    def __init__(self, limit: int = MAX_COUNTED) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, uid: str) -> bool:
        """True when ``uid`` was not counted before."""
        if uid in self._seen:
            return False
        self._seen[uid] = None
        while len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return True


def _state(memo: kopf.Memo) -> controller.State:
    return cast(controller.State, memo["state"])


def _intervals(memo: kopf.Memo) -> Intervals:
    return cast(Intervals, memo.get("intervals") or Intervals())


def _emit(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message)


def plain(body: kopf.Body) -> dict[str, Any]:
    """The object as a plain dict without ``managedFields`` (what the indexes keep)."""
    raw = dict(body)
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k != "managedFields"}
    return {**raw, "metadata": meta}


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster (at KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT, as
    client-go), else the kubeconfig (``KUBECONFIG``), running its ``exec`` credential plugin where the user
    has one."""
    if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
        in_pod = kopf.login_with_service_account(**kwargs)
        server = kubeconfig.in_cluster_server(os.environ)
        return dataclasses.replace(in_pod, server=server) if in_pod is not None and server else in_pod
    info = kopf.login_with_kubeconfig(**kwargs)
    if info is None:
        return None
    try:
        fields = kubeconfig.exec_credentials(kubeconfig.current_user())
    except kubeconfig.ExecCredentialError as exc:
        raise kopf.LoginError(str(exc)) from exc
    return dataclasses.replace(info, **fields) if fields else info


# -- start-up and shut-down ---------------------------------------------------------------------------
@kopf.on.login(id="login")
def login_handler(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return login(**kwargs)


@kopf.on.startup(id="configure")
async def configure(
    settings: kopf.OperatorSettings,
    memo: kopf.Memo,
    **indexes: Any,
) -> None:
    intervals = _intervals(memo)
    # No Kopf handler needs a finalizer or stores progress: the controller manages its own finalizer
    # (compilecache.io/bundles). Kopf's is named so that it never matches one on an object.
    settings.persistence.finalizer = f"{PREFIX}/kopf-unused"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.watching.server_timeout = intervals.watch_server_timeout
    settings.watching.client_timeout = intervals.watch_server_timeout + 30
    settings.watching.connect_timeout = 30
    # Server-side selection: the API server sends only warm-up Jobs and opted-in pods.
    settings.watching.label_selectors["batch", "jobs"] = WARMUP_LABEL
    settings.watching.label_selectors["", "pods"] = CACHE_LABEL
    settings.peering.standalone = True
    # Kopf turns its log lines about objects into Kubernetes Events from this level: handler failures only
    # (one Event per handled event would be a request per change). The operator's own events are posted as such.
    settings.posting.level = logging.WARNING
    admission: Admission = memo["admission"]
    settings.admission.server = admission.server
    settings.admission.managed = admission.managed
    info = login(settings=settings)
    if info is None:
        raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig")
    state = _state(memo)
    state.indexes = controller.Indexes(
        caches=indexes["cache_objects"], jobs=indexes["warmup_jobs"], nodes=indexes["node_labels"]
    )
    state.api = KubeAPI(info, relogin=lambda: login(settings=settings))
    try:
        listed = await state.api.list_caches(state.settings.namespaces)
        state.early_views = {
            (str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"])):
            builders.cache_view(c, state.settings.defaults, state.settings.confinement) for c in listed
        }
    except KubeError as exc:  # readiness then waits for Kopf's index
        logger.warning("could not list the CompileCaches: %s", exc)
    if admission.server is not None:
        admission.server.answers = admission_answers(state, indexes["caches"])
        admission.server.draining = lambda: state.draining
    state.sidecars = await detect_native_sidecars(state.api, state.settings.native_sidecars)
    logger.info("native sidecars %s: %s", "available" if state.sidecars.available else "not available",
                state.sidecars.basis)
    where: Probes = memo.get("probes") or Probes()
    if where.port:
        memo["probes_server"] = await probes.serve(where.address, where.port,
                                                   readiness(state, admission.server, admission))
    memo["resync"] = asyncio.create_task(resync_loop(state, intervals.resync_seconds))
    if state.settings.operator_namespace and state.settings.confinement != Confinement():
        memo["grants"] = asyncio.create_task(grants_loop(state, state.settings.operator_namespace))
    election: Election | None = memo.get("election")
    if election is not None:
        elector = leader.Elector(state.api, election.namespace, election.name, identity(),
                                 lambda leading: lead(state, leading))
        state.leading = False
        memo["elector"] = elector
        memo["election_task"] = asyncio.create_task(elector.run())
    memo["cert_task"] = start_certificates(state, admission)
    key_secret: SigningSecret | None = memo.get("signing_secret")
    if key_secret is not None:
        memo["signing_task"] = await start_signing(state, key_secret)


def start_certificates(state: controller.State, admission: Admission) -> asyncio.Task[None] | None:
    """Keep the operator's serving certificate Secret (leader) and serve it (every replica), or watch the
    mounted files for a renewal."""
    reloader = admission.reloader
    if reloader is None:
        return None
    if admission.serving is not None and state.api is not None:
        directory = reloader.files.cert.parent

        def serve(material: servingcert.Material) -> None:
            certs.write_files(directory, material.cert, material.key, material.ca)
            if reloader.check():
                admission.cert_ready = True

        return asyncio.create_task(servingcert.keep(state.api, admission.serving, admission.policy,
                                                    leading=lambda: state.leading, serve=serve,
                                                    interval=admission.check_seconds))
    if admission.watch_files:
        return asyncio.create_task(reloader.watch(admission.check_seconds))
    return None


async def start_signing(state: controller.State, where: SigningSecret) -> asyncio.Task[None]:
    """Read the signing key from its Secret (the leader creating it on the first start), then follow
    its rotations."""
    assert state.api is not None
    keys = signingkey.KeySecret(state.api, where.namespace, where.name, where.labels, where.extra_trusted)
    signing = await keys.first(lambda: state.leading)
    state.settings = dataclasses.replace(state.settings, signing=signing)

    def changed(new: Signing) -> None:
        state.settings = dataclasses.replace(state.settings, signing=new)

    return asyncio.create_task(keys.keep(lambda: state.leading, changed, signing))


def admission_answers(state: controller.State, views: Any) -> dict[str, kopfadapter.Answer]:
    """Each webhook's answer, by id (the CompileCache one answers only where it is registered)."""

    async def pods(review: Mapping[str, Any]) -> dict[str, Any]:
        with state.metrics.timed(WEBHOOK_HANDLER):
            return review_pod(state, views, review)

    async def regrant() -> tuple[Grant, ...]:
        assert state.api is not None and state.settings.operator_namespace
        return (await read_grants(state.api, state.settings.operator_namespace))[0]

    async def caches(review: Mapping[str, Any]) -> dict[str, Any]:
        with_grants = state.api is not None and state.settings.operator_namespace
        return await review_cache(state.settings, regrant if with_grants else None, review)

    return {WEBHOOK_ID: pods, CACHE_WEBHOOK_ID: caches}


def readiness(state: controller.State, server: kopfadapter.AdmissionServer | None,
              admission: Admission | None = None) -> Callable[[], bool]:
    """What ``/readyz`` answers: the caches are known and, where this replica serves the webhook,
    its endpoint accepts connections with the certificate to serve; not while shutting down."""
    if server is None:
        return state.serving
    webhook = server
    certified = admission or Admission()
    return lambda: state.serving() and webhook.listening and certified.cert_ready


def identity() -> str:
    """This replica's name in the Lease: its pod (host) name and a random part."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def lead(state: controller.State, leading: bool) -> None:
    """Start or stop acting; a new leader looks at every cache once (nothing is settled for it)."""
    state.leading = leading
    state.settled.clear()
    for handle in state.retries.values():
        handle.cancel()
    state.retries.clear()
    if leading:
        task = asyncio.get_running_loop().create_task(controller.resync(state, _emit))
        state.background.add(task)
        task.add_done_callback(state.background.discard)


@kopf.on.cleanup(id="close")
async def close(memo: kopf.Memo, **_: Any) -> None:
    for task_name in ("resync", "election_task", "cert_task", "signing_task", "grants"):
        task: asyncio.Task[None] | None = memo.get(task_name)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    elector: leader.Elector | None = memo.get("elector")
    if elector is not None:
        try:
            await elector.release()
        except Exception as exc:  # the Lease expires by itself
            logger.warning("could not release the Lease: %s", exc)
    server: probes.Server | None = memo.get("probes_server")
    if server is not None:
        await server.cleanup()
    api = _state(memo).api
    if api is not None:
        await api.close()


# -- indexes --------------------------------------------------------------------------------------------
@kopf.index(*CC, id="caches")
def caches(namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    """The webhook's view of each CompileCache."""
    settings = _state(memo).settings
    return {(namespace or "", name): builders.cache_view(body, settings.defaults, settings.confinement)}


@kopf.index(*CC, id="cache_objects")
def cache_objects(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Each CompileCache as the controller reads it."""
    return {(namespace or "", name): plain(body)}


@kopf.index("batch", "v1", "jobs", id="warmup_jobs", labels={WARMUP_LABEL: kopf.PRESENT})
def warmup_jobs(body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """Warm-up Jobs by the uid of the CompileCache that owns them."""
    job = plain(body)
    return {uid: job for uid in controller.owner_uids(job)}


@kopf.index("v1", "nodes", id="node_labels")
def node_labels(labels: kopf.Labels, **_: Any) -> dict[Any, Any]:
    """Node label key → value, for ``gpuDiscovery.auto`` (whichever label key a spec names)."""
    return dict(labels)


@kopf.on.event("v1", "nodes", id="ready-nodes", when=lambda memo, **_: not _state(memo).ready)
@kopf.on.event(*CC, id="ready-caches", when=lambda memo, **_: not _state(memo).ready)
async def mark_ready(memo: kopf.Memo, **_: Any) -> None:
    """Kopf runs this only after every index is loaded: from now on the webhook knows every cache."""
    state = _state(memo)
    if not state.ready:
        state.ready = True
        state.early_views = None
        logger.info("indexes loaded: %d CompileCache(s); ready", len(state.indexes.caches))
        stop: threading.Event | None = memo.get("stop")
        if stop is not None:
            drain_on_sigterm(state, stop, float(memo.get("shutdown_delay") or 0.0))


def drain_on_sigterm(state: controller.State, stop: threading.Event, delay: float) -> None:
    """On SIGTERM, report not ready at once and stop ``delay`` seconds later: the webhook goes on
    answering while the Service's endpoints (and the API server) stop sending admissions here."""
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        if state.draining:
            stop.set()  # a second SIGTERM: now
            return
        state.draining = True
        logger.info("SIGTERM: not ready; stopping in %.1fs", delay)
        loop.call_later(delay, stop.set)

    loop.add_signal_handler(signal.SIGTERM, on_term)


# -- CompileCaches and their Jobs ------------------------------------------------------------------------
@kopf.on.event(*CC, id="cache-events")
@instrumented("reconcile")
async def cache_event(
    type: str, namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """A created, changed or deleted CompileCache: reconcile it if what it reads changed, finish its
    deletion, or forget it. Plain events (no Kopf change handlers) keep Kopf from writing anything
    to the objects, so standby replicas can watch them too."""
    state = _state(memo)
    key = (namespace or "", name)
    if type == "DELETED":
        state.forget(key)
        return
    state.metrics.observe_cache(*key, body.get("status"))  # the Ready gauge, on every replica
    node_gpus = state.indexes.nodes.get(state.settings.defaults.gpu_label_key, ())
    state.metrics.know_cache(*key, cache_gpus(body.get("status"), node_gpus))  # its counters at 0, before events
    if state.leading:
        await controller.handle(state, key, _emit)


@kopf.on.event("batch", "v1", "jobs", id="jobs", labels={WARMUP_LABEL: kopf.PRESENT})
@instrumented("jobs")
async def job_event(type: str, body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A warm-up Job finished: record its result at once."""
    finished = job_condition(body, "Complete") or job_condition(body, "Failed")
    if type == "DELETED" or not finished or RECORDED_ANNOTATION in body.metadata.annotations:
        return
    state = _state(memo)
    if not state.leading:
        return
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            await controller.handle(state, (namespace or "", str(ref["name"])), _emit)


# -- opted-in pods ---------------------------------------------------------------------------------------
@kopf.on.event(
    "v1", "pods",
    id="count-preloads",
    labels={CACHE_LABEL: kopf.PRESENT},
    when=lambda memo, **_: _state(memo).leading,
)
@instrumented("count-preloads")
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, uid: str, memo: kopf.Memo, **_: Any
) -> None:
    """An opted-in pod changed: count its preload's result, then its workload's verdict, each once
    (the annotations say what was counted; Kopf filters on them on its side, so one handler)."""
    annotations = body.metadata.annotations
    if COUNTED_ANNOTATION not in annotations:
        await count_preload(_state(memo), memo["counted"], type, body, namespace or "", name, uid)
    if COLD_COUNTED_ANNOTATION not in annotations:
        counted = memo.setdefault("cold_counted", CountedPods())
        await count_cold_start(_state(memo), counted, type, body, namespace or "", name, uid)


async def count_cold_start(
    state: controller.State,
    counted: CountedPods,
    event_type: str,
    body: Mapping[str, Any],
    namespace: str,
    name: str,
    uid: str,
) -> None:
    """Tally one pod's verdict (hit, or the factor that made it compile afresh) into its cache's
    ``status.coldStarts`` once; when most pods started cold for one cause, the ``ColdStarts``
    condition turns True and a Warning event names the cause."""
    verdict = coldstarts.pod_verdict(body)
    if verdict is None or state.api is None or not counted.add(uid):
        return
    cache = str(((body.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL, ""))
    try:
        current = await state.api.get_cache(namespace, cache)
        if current is None:
            return
        status = current.get("status") or {}
        cold = coldstarts.tally(status.get("coldStarts"), verdict)
        patch: dict[str, Any] = {"coldStarts": cold}
        wanted = coldstarts.condition(cold)
        if wanted is not None:
            generation = int(status.get("observedGeneration") or current.get("metadata", {}).get("generation") or 0)
            conditions = status.get("conditions")
            patch["conditions"] = merge_conditions(conditions, [wanted], generation=generation, now=now_rfc3339())
            before = find(conditions, coldstarts.CONDITION)
            if wanted.status and (before is None or before.get("status") != "True"):
                _emit(current, "Warning", wanted.reason, wanted.message)
        await state.api.patch_cache_status(namespace, cache, patch)
        if event_type != "DELETED":
            await state.api.annotate_pod(namespace, name, {COLD_COUNTED_ANNOTATION: verdict.cause})
    except Exception as exc:  # counted in memory; a restart before the retry could count it again
        logger.warning("could not tally the cold start of pod %s/%s: %s", namespace, name, exc)


def admission_hooks(check_caches: bool = False) -> list[kopfadapter.Hook]:
    """The webhooks the operator serves: the pod-mutating one (fails open) and, with ``check_caches``, the
    CompileCache validating one (fails closed)."""
    pods = kopfadapter.Hook(WEBHOOK_ID, "mutating", ("v1", "pods"), ("CREATE",), fail_open=True,
                            labels={CACHE_LABEL: kopf.PRESENT})
    caches = kopfadapter.Hook(CACHE_WEBHOOK_ID, "validating", CC, ("CREATE", "UPDATE"), fail_open=False)
    return [pods, caches] if check_caches else [pods]


def register_webhook(registry: kopf.OperatorRegistry | None = None, *, check_caches: bool = False) -> None:
    """Register the admission webhooks (once each): only an operator that serves them may (Kopf refuses
    admission handlers without a server)."""
    kopfadapter.register(admission_hooks(check_caches), registry)


async def count_preload(
    state: controller.State,
    counted: CountedPods,
    event_type: str,
    body: kopf.Body,
    namespace: str,
    name: str,
    uid: str,
) -> None:
    """Count one opted-in pod's preload result once, then mark the pod as counted.

    An init container has terminated long before its pod ends; a native sidecar terminates only
    when the pod ends, and that status may first be seen in the DELETED event. It counts there
    too, without the annotation (no pod is left to carry it; ``counted`` keeps the count single).
    """
    outcome = preload_outcome(body, gpu_annotation=GPU_ANNOTATION)
    if outcome is None or not counted.add(uid):
        return
    cache = str(body.metadata.labels.get(CACHE_LABEL, ""))
    gpu = gpu_slug(outcome.gpu) if outcome.gpu else "unknown"
    state.metrics.count_preload(
        namespace, cache, gpu=gpu, result=outcome.result, reason=outcome.code,
        seconds=outcome.seconds if outcome.ran else None, size=outcome.bytes,
    )
    if state.api is not None and event_type != "DELETED":
        try:
            await state.api.annotate_pod(namespace, name, {COUNTED_ANNOTATION: outcome.result})
        except Exception as exc:  # counted in memory; only a restart before the retry could recount
            logger.warning("could not mark pod %s/%s as counted: %s", namespace, name, exc)


GRANTS_SECONDS = 5.0
"""How often the grant ConfigMaps of the operator's namespace are read."""


async def grants_loop(state: controller.State, namespace: str, interval: float = GRANTS_SECONDS) -> None:
    """Keep the confinement's grants those of the ConfigMaps labelled ``compilecache.io/allow`` in the operator's
    namespace; on a change, reconcile at once the CompileCaches of every namespace whose grants changed. A
    ConfigMap that cannot be read as a grant grants nothing and is logged (once per content)."""
    assert state.api is not None
    said: set[str] = set()
    while True:
        try:
            grants, refused = await read_grants(state.api, namespace)
            for message in refused:
                if message not in said:
                    logger.warning("grant refused: %s", message)
            said = set(refused)
            await apply_grants(state, grants)
        except KubeError as exc:
            logger.warning("could not read the grant ConfigMaps of %s: %s", namespace, exc)
        await asyncio.sleep(interval)


async def apply_grants(state: controller.State, grants: tuple[Any, ...]) -> None:
    old = state.settings.confinement
    if grants == old.grants:
        return
    new = dataclasses.replace(old, grants=grants)
    changed = {ns for ns in old.namespaces_granted() | new.namespaces_granted()
               if old.for_namespace(ns) != new.for_namespace(ns)}
    state.settings = dataclasses.replace(state.settings, confinement=new)
    logger.info("grants now: %s", ", ".join(f"{g.source} -> {','.join(g.namespaces)}" for g in grants) or "none")
    for key in [k for k in list(state.indexes.caches) if isinstance(k, tuple) and k[0] in changed]:
        state.settled.pop(key, None)
        if state.leading:
            await controller.handle(state, key, _emit)


async def resync_loop(state: controller.State, interval: float) -> None:
    """Once the indexes are loaded, reconcile what is unsettled, then again every ``interval``
    seconds; errors are logged, never fatal."""
    while not state.ready:
        await asyncio.sleep(0.1)
    while True:
        count = await controller.resync(state, _emit) if state.leading else 0
        if count:
            logger.debug("resync: reconciled %d CompileCache(s)", count)
        await asyncio.sleep(interval)
