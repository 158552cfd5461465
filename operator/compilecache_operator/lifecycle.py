"""The operator's runtime: one typed object, built once by ``main`` from the options, that Kopf hands every
handler as its memo (:func:`runtime_of` reads it back), and what it starts at start-up and stops at the end.

:class:`Runtime` holds the controller's State, the intervals, the webhook server and its certificate,
where the signing key and the Lease are, where the probes listen, the pods already counted, and the
tasks it started. Kopf gives each object's handlers a shallow copy of it: everything that changes lives
in the objects it holds (the State, :class:`Running`, the counted pods), shared by every copy.

:meth:`Runtime.start` (Kopf's start-up) configures Kopf, logs in, starts the watches of CompileCaches,
warm-up Jobs and Nodes and wires their indexes into the State, answers the webhook from them, detects
native sidecars, and starts the probes, the Event poster, the reconcile workers, the resync, the grants,
the election, the serving certificate and the signing key; it returns once the namespaces are listed
(the webhook then answers every pod as it will once the CompileCaches are all listed, reading a cache not
listed yet when its pod asks; the operator is Ready once Kopf has started the webhook server), and the
reconciles begin once every watch has listed. :meth:`Runtime.stop` undoes it.
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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from compilecache_operator.admission.validation import read_grants, review_cache
from compilecache_operator.admission.webhook import Views, asked_cache, review_pod
from compilecache_operator.controller import scheduling
from compilecache_operator.controller.state import Emit, State
from compilecache_operator.controller.watches import Watches
from compilecache_operator.edge import (
    certs,
    kopfadapter,
    kubeconfig,
    leader,
    probes,
    servingcert,
    signingkey,
    tlsreload,
)
from compilecache_operator.edge.events import EventPoster
from compilecache_operator.edge.kube import KubeAPI, KubeError
from compilecache_operator.edge.metrics import WEBHOOK_HANDLER
from compilecache_operator.edge.signing import Signing
from compilecache_operator.model import conversion
from compilecache_operator.model.confinement import Confinement, Grant
from compilecache_operator.model.names import CACHE_LABEL, CACHE_WEBHOOK_ID, PREFIX, WEBHOOK_ID
from compilecache_operator.model.sidecars import SidecarSupport, sidecar_support

logger = logging.getLogger(__name__)
MAX_COUNTED = 100_000
GRANTS_SECONDS = 5.0
"""How often the grant ConfigMaps of the operator's namespace are read."""
UNLISTED_READ_SECONDS = 2.0
"""The longest a pod's admission waits to read its CompileCache while the caches are not all listed (the
webhook's own timeout is longer: the pod is admitted unchanged, as for an unknown cache, past it)."""
ReadUnlisted = Callable[[tuple[str, str]], Awaitable[None]]


async def detect_native_sidecars(api: KubeAPI, switch: str) -> SidecarSupport:
    """Ask the API server (unless the switch decides alone); a failed call means no native sidecars."""
    if switch != "auto":
        return sidecar_support(switch, None)
    try:
        info: Mapping[str, Any] | None = await api.server_version()
        error = ""
    except Exception as exc:  # any failure: inject init containers, which work everywhere
        info, error = None, str(exc) or type(exc).__name__
        logger.warning("GET /version failed, so pods get the preload as an init container: %s", error)
    return sidecar_support(switch, info, error)


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
    policy: servingcert.Policy = field(default_factory=servingcert.Policy)
    check_seconds: float = 10.0
    cert_ready: bool = True
    """The certificate served is the one to serve (with ``serving``: once the Secret's is loaded)."""
    watch_files: bool = False
    """Whether the certificate files may be renewed (a mounted Secret)."""


@dataclass(frozen=True)
class SigningSecret:
    """The signing key's Secret (see :mod:`compilecache_operator.edge.signingkey`)."""

    namespace: str
    name: str
    extra_trusted: tuple[str, ...]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Election:
    """The Lease that decides which replica acts (see :mod:`compilecache_operator.edge.leader`)."""

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


@dataclass
class Running:
    """What :meth:`Runtime.start` started, for :meth:`Runtime.stop`."""

    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    elector: leader.Elector | None = None
    probes_server: probes.Server | None = None
    events: EventPoster | None = None
    watches: Watches | None = None


@dataclass
class Runtime:
    """Everything the operator runs with, built once from its options (see the module's docstring)."""

    state: State
    intervals: Intervals = field(default_factory=Intervals)
    admission: Admission = field(default_factory=Admission)
    probes: Probes = field(default_factory=Probes)
    signing_secret: SigningSecret | None = None
    """Where the signing key is kept (None: a key file, or unsigned bundles)."""
    election: Election | None = None
    """The Lease (None: this replica always acts)."""
    stop_flag: threading.Event | None = None
    """Set to stop Kopf: after ``shutdown_delay`` seconds of draining, on SIGTERM."""
    shutdown_delay: float = 0.0
    counted: CountedPods = field(default_factory=CountedPods)
    """Pods whose preload result was counted."""
    cold_counted: CountedPods = field(default_factory=CountedPods)
    """Pods whose workload's verdict was tallied into ``status.coldStarts``."""
    running: Running = field(default_factory=Running)

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """Configure Kopf, log in, start the watches and everything that runs beside the handlers; return
        once the webhook can answer pods (the namespaces listed: :meth:`mark_admitting`). Stopped while it
        waits (SIGTERM then: Kopf cancels its start-up activity and runs no cleanup after it), it stops what
        it started itself."""
        try:
            await self._start(settings)
        except asyncio.CancelledError:
            await self.stop()
            raise

    async def _start(self, settings: kopf.OperatorSettings) -> None:
        configure_kopf(settings, self.intervals, self.admission)
        info = login(settings=settings)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials: neither a service account nor a kubeconfig")
        state = self.state
        state.api = KubeAPI(info, relogin=lambda: login(settings=settings))
        self.running.events = EventPoster(state.api)
        watches = self.running.watches = Watches(
            state.api, state.settings.namespaces, lambda: state.settings,
            on_cache=lambda change: scheduling.cache_changed(state, change),
            on_job=lambda change: scheduling.job_changed(state, change),
            watch_seconds=self.intervals.watch_server_timeout,
        )
        state.cluster.indexes = watches.indexes()
        state.injection.namespace_levels = watches.namespace_levels
        api = state.api
        answer_webhook(state, self.admission.server, watches.views,
                       lambda key: watches.fetch_unlisted(api, key, UNLISTED_READ_SECONDS))
        state.injection.sidecars = await detect_native_sidecars(state.api, state.settings.native_sidecars)
        logger.info("native sidecars %s: %s", "available" if state.injection.sidecars.available else "not available",
                    state.injection.sidecars.basis)
        if self.probes.port:
            self.running.probes_server = await probes.serve(
                self.probes.address, self.probes.port, readiness(state, self.admission.server, self.admission)
            )
        tasks = self.running.tasks
        tasks += watches.start()
        tasks.append(asyncio.create_task(self.running.events.run(), name="event poster"))
        tasks += [asyncio.create_task(scheduling.work(state, self.emit), name=f"reconcile worker {i}")
                  for i in range(max(1, state.settings.concurrency))]
        tasks.append(asyncio.create_task(resync_loop(state, self.intervals.resync_seconds, self.emit,
                                                     readiness(state, self.admission.server, self.admission))))
        if state.settings.operator_namespace and state.settings.confinement != Confinement():
            tasks.append(asyncio.create_task(grants_loop(state, state.settings.operator_namespace, self.emit)))
        if self.election is not None:
            elector = leader.Elector(state.api, self.election.namespace, self.election.name, identity(),
                                     lambda leading: lead(state, leading, self.emit))
            state.lifecycle.leading = False
            self.running.elector = elector
            tasks.append(asyncio.create_task(elector.run()))
        cert_task = start_certificates(state, self.admission)
        if cert_task is not None:
            tasks.append(cert_task)
        if self.signing_secret is not None:
            tasks.append(await start_signing(state, self.signing_secret))
        await watches.wait_admitting()
        self.mark_admitting()
        tasks.append(asyncio.create_task(self.until_listed(watches), name="until every watch has listed"))

    async def until_listed(self, watches: Watches) -> None:
        await watches.wait_synced()
        self.mark_ready()

    def emit(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a Kubernetes Event about ``body`` (through the Event poster; before start-up, to the log)."""
        if self.running.events is None:
            logger.warning("event %s not posted (not started): %s", reason, message)
            return
        self.running.events.emit(body, type_, reason, message)

    def mark_admitting(self) -> None:
        """The namespaces are listed: the webhook answers every pod as it will once every watch has listed
        (a cache not listed yet is read when its pod asks): Ready from now on, and SIGTERM drains."""
        state = self.state
        if state.cluster.admitting:
            return
        state.cluster.admitting = True
        logger.info("the namespaces listed: admitting pods (CompileCaches read one by one until listed)")
        if self.stop_flag is not None:
            drain_on_sigterm(state, self.stop_flag, self.shutdown_delay)

    def mark_ready(self) -> None:
        """Every watch has listed: the webhook knows every cache, each cache's metrics are made, reconciles
        may begin."""
        state = self.state
        if state.cluster.ready:
            return
        self.mark_admitting()
        state.cluster.ready = True
        caches = state.cluster.indexes.caches
        for key in list(caches):
            body = state.cluster.indexes.cache(key)
            if body is not None:
                scheduling.observe(state, key, body)
        logger.info("every watch listed: %d CompileCache(s)", len(caches))

    async def stop(self) -> None:
        """Stop what :meth:`start` started; release the Lease; close the API client; and raise the stop flag.

        Kopf waits for the stop flag (a ``threading.Event``) in a thread of the loop's default executor, which
        the loop joins when it closes: stopped by Kopf's own SIGTERM handler (before every watch had listed and
        :func:`drain_on_sigterm` was installed), nothing else would set it, and the process would hang until
        SIGKILL with its Lease still held."""
        try:
            await self._stop()
        finally:
            if self.stop_flag is not None:
                self.stop_flag.set()

    async def _stop(self) -> None:
        for task in self.running.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.running.elector is not None:
            try:
                await self.running.elector.release()
            except Exception as exc:  # the Lease expires by itself
                logger.warning("could not release the Lease: %s", exc)
        if self.running.probes_server is not None:
            await self.running.probes_server.cleanup()
        if self.state.api is not None:
            await self.state.api.close()


def runtime_of(memo: object) -> Runtime:
    """The :class:`Runtime` a handler receives as its ``memo`` (Kopf's copy of the one ``main`` built)."""
    if not isinstance(memo, Runtime):
        raise TypeError(f"the operator's memo must be its Runtime, got {type(memo).__name__}")
    return memo


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


def configure_kopf(settings: kopf.OperatorSettings, intervals: Intervals, admission: Admission) -> None:
    """Kopf's settings: no finalizer nor progress of its own, the watch timeouts, server-side label selection,
    standalone, events only for handler failures, and the admission server."""
    # No Kopf handler needs a finalizer or stores progress: the controller manages its own finalizer
    # (compilecache.io/bundles). Kopf's is named so that it never matches one on an object.
    settings.persistence.finalizer = f"{PREFIX}/kopf-unused"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.watching.server_timeout = intervals.watch_server_timeout
    settings.watching.client_timeout = intervals.watch_server_timeout + 30
    settings.watching.connect_timeout = 30
    # Server-side selection: the API server sends Kopf only opted-in pods (the operator's own watch of Jobs
    # selects the warm-up ones: watches.py).
    settings.watching.label_selectors["", "pods"] = CACHE_LABEL
    settings.peering.standalone = True
    # Kopf turns its log lines about objects into Kubernetes Events from this level: handler failures only
    # (one Event per handled event would be a request per change). The operator's own events are posted as such.
    settings.posting.level = logging.WARNING
    settings.admission.server = admission.server
    settings.admission.managed = admission.managed


def answer_webhook(state: State, server: kopfadapter.AdmissionServer | None, views: Views,
                   unlisted: ReadUnlisted | None = None) -> None:
    """Let the operator's own webhook server answer each webhook from the State and the cache views
    (``unlisted``: read a cache the views do not hold while the caches are not all listed)."""
    if server is None:
        return
    server.answers = admission_answers(state, views, unlisted)
    server.draining = lambda: state.lifecycle.draining


def admission_answers(state: State, views: Views, unlisted: ReadUnlisted | None = None
                      ) -> dict[str, kopfadapter.Answer]:
    """Each webhook's answer, by id (the CompileCache one answers only where it is registered), and the CRD's
    conversion (:mod:`compilecache_operator.model.conversion`, at ``/convert``)."""

    async def pods(review: Mapping[str, Any]) -> dict[str, Any]:
        with state.metrics.timed(WEBHOOK_HANDLER):
            key = asked_cache(review)
            if unlisted is not None and key is not None:  # returns at once once listed, or when held
                await unlisted(key)
            return review_pod(state, views, review)

    async def regrant() -> tuple[Grant, ...]:
        """The grants read afresh, adopted at once (the reconcile of a cache they admit sees what its
        admission saw; the caches whose grants changed are queued)."""
        assert state.api is not None and state.settings.operator_namespace
        grants = (await read_grants(state.api, state.settings.operator_namespace))[0]
        for key in adopt_grants(state, grants):
            if state.lifecycle.leading:
                scheduling.enqueue(state, key)
        return grants

    async def caches(review: Mapping[str, Any]) -> dict[str, Any]:
        with_grants = state.api is not None and state.settings.operator_namespace
        return await review_cache(state.settings, regrant if with_grants else None, review)

    async def convert(review: Mapping[str, Any]) -> dict[str, Any]:
        return conversion.review(review)

    return {WEBHOOK_ID: pods, CACHE_WEBHOOK_ID: caches, conversion.CONVERSION_ID: convert}


def start_certificates(state: State, admission: Admission) -> asyncio.Task[None] | None:
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
                                                    leading=lambda: state.lifecycle.leading, serve=serve,
                                                    interval=admission.check_seconds))
    if admission.watch_files:
        return asyncio.create_task(reloader.watch(admission.check_seconds))
    return None


async def start_signing(state: State, where: SigningSecret) -> asyncio.Task[None]:
    """Read the signing key from its Secret (the leader creating it on the first start), then follow
    its rotations."""
    assert state.api is not None
    keys = signingkey.KeySecret(state.api, where.namespace, where.name, where.labels, where.extra_trusted)
    signing = await keys.first(lambda: state.lifecycle.leading)
    state.settings = dataclasses.replace(state.settings, signing=signing)

    def changed(new: Signing) -> None:
        state.settings = dataclasses.replace(state.settings, signing=new)

    return asyncio.create_task(keys.keep(lambda: state.lifecycle.leading, changed, signing))


def readiness(state: State, server: kopfadapter.AdmissionServer | None,
              admission: Admission | None = None) -> Callable[[], bool]:
    """What ``/readyz`` answers: the webhook answers pods as it will once every cache is known and, where
    this replica serves the webhook, its endpoint accepts connections with the certificate to serve; not
    while shutting down."""
    if server is None:
        return state.serving
    webhook = server
    certified = admission or Admission()
    return lambda: state.serving() and webhook.listening and certified.cert_ready


def identity() -> str:
    """This replica's name in the Lease: its pod (host) name and a random part."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def lead(state: State, leading: bool, emit: Emit | None) -> None:
    """Start or stop acting; a new leader looks at every cache once (nothing is settled for it), or, before
    every watch has listed, leaves that to the first resync."""
    state.lifecycle.leading = leading
    state.scheduler.settled.clear()
    for handle in state.scheduler.retries.values():
        handle.cancel()
    state.scheduler.retries.clear()
    if leading and state.cluster.ready:
        task = asyncio.get_running_loop().create_task(scheduling.resync(state, emit))
        state.scheduler.background.add(task)
        task.add_done_callback(state.scheduler.background.discard)


def drain_on_sigterm(state: State, stop: threading.Event, delay: float) -> None:
    """On SIGTERM, report not ready at once and stop ``delay`` seconds later: the webhook goes on
    answering while the Service's endpoints (and the API server) stop sending admissions here."""
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        if state.lifecycle.draining:
            stop.set()  # a second SIGTERM: now
            return
        state.lifecycle.draining = True
        logger.info("SIGTERM: not ready; stopping in %.1fs", delay)
        loop.call_later(delay, stop.set)

    loop.add_signal_handler(signal.SIGTERM, on_term)


async def grants_loop(state: State, namespace: str, emit: Emit | None, interval: float = GRANTS_SECONDS) -> None:
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
            await apply_grants(state, grants, emit)
        except KubeError as exc:
            logger.warning("could not read the grant ConfigMaps of %s: %s", namespace, exc)
        await asyncio.sleep(interval)


def adopt_grants(state: State, grants: tuple[Any, ...]) -> list[tuple[str, str]]:
    """Make ``grants`` the confinement's; returns the caches of the namespaces whose grants changed (no longer
    settled: each must be reconciled again)."""
    old = state.settings.confinement
    if grants == old.grants:
        return []
    new = dataclasses.replace(old, grants=grants)
    changed = {ns for ns in old.namespaces_granted() | new.namespaces_granted()
               if old.for_namespace(ns) != new.for_namespace(ns)}
    state.settings = dataclasses.replace(state.settings, confinement=new)
    logger.info("grants now: %s", ", ".join(f"{g.source} -> {','.join(g.namespaces)}" for g in grants) or "none")
    keys = [k for k in list(state.cluster.indexes.caches) if isinstance(k, tuple) and k[0] in changed]
    for key in keys:
        state.scheduler.settled.pop(key, None)
    return keys


async def apply_grants(state: State, grants: tuple[Any, ...], emit: Emit | None = None) -> None:
    """Adopt ``grants`` and reconcile at once, while leading, the caches whose grants changed."""
    for key in adopt_grants(state, grants):
        if state.lifecycle.leading:
            await scheduling.handle(state, key, emit)


async def resync_loop(state: State, interval: float, emit: Emit | None,
                      ready: Callable[[], bool] | None = None) -> None:
    """Once every watch has listed and the replica is Ready (``ready``: its webhook answers; a restarted
    operator injects pods before it looks at every cache again), reconcile what is unsettled, then again
    every ``interval`` seconds; errors are logged, never fatal."""
    while not state.cluster.ready or (ready is not None and not ready()):
        await asyncio.sleep(0.1)
    while True:
        count = await scheduling.resync(state, emit) if state.lifecycle.leading else 0
        if count:
            logger.debug("resync: reconciled %d CompileCache(s)", count)
        await asyncio.sleep(interval)
