"""When a CompileCache is reconciled: on its changes and its Jobs', on the resync, and again after a
problem that may pass.

The watches (:mod:`compilecache_operator.controller.watches`) hand every change to :func:`cache_changed` or
:func:`job_changed`, which put the cache in the queue when this replica acts; ``concurrency`` workers
(:func:`work`) take caches from it, each cache once however often it was asked for while waiting. A
reconcile (:mod:`compilecache_operator.controller.reconcile`) is idempotent, so changes, Job results and the
resync may all ask for one; :class:`~compilecache_operator.controller.state.KeyedLocks` keeps two for the same
cache from interleaving, and a semaphore bounds how many run at once. :func:`fingerprint` lets the
resync skip every cache whose inputs did not change. A cache being deleted goes to
:mod:`compilecache_operator.controller.deletion` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from compilecache_operator.controller.cache_warnings import failure_warning, post_warnings
from compilecache_operator.controller.deletion import finalize
from compilecache_operator.controller.reconcile import (
    Outcome,
    apply_actions,
    cache_spec,
    decide_actions,
    is_deleting,
    read_snapshot,
    write_status,
)
from compilecache_operator.controller.reconcile_failures import describe, failure_of
from compilecache_operator.controller.state import Emit, Key, State, WarningEvent
from compilecache_operator.decisions import cache_status
from compilecache_operator.decisions.job_reports import job_condition
from compilecache_operator.edge.informer import Change
from compilecache_operator.edge.metrics import cache_gpus
from compilecache_operator.model.conditions import now_rfc3339
from compilecache_operator.model.names import GROUP, KIND, RECORDED_ANNOTATION
from compilecache_operator.model.spec import CacheSpec

logger = logging.getLogger(__name__)
RECONCILE = "reconcile"
JOBS = "jobs"
"""The handlers' names in the metrics: a cache's own change, a warm-up Job's result."""


def cache_changed(state: State, change: Change) -> None:
    """A CompileCache was created, changed or deleted: forget a deleted one; on every replica, its Ready
    gauge and its counters (at 0 until something is counted); queue it where this replica acts. Before
    every watch has listed, nothing is queued: the first resync looks at every cache."""
    key = change.key
    if change.new is None:
        state.forget(key)
        return
    if not state.cluster.ready:
        return
    observe(state, key, change.new)
    if state.lifecycle.leading:
        enqueue(state, key, RECONCILE)


def observe(state: State, key: Key, body: Mapping[str, Any]) -> None:
    """The metrics of one CompileCache from the object the API server holds."""
    state.metrics.observe_cache(*key, body.get("status"))
    node_gpus = state.cluster.indexes.nodes.get(state.settings.defaults.gpu_label_key, ())
    state.metrics.know_cache(*key, cache_gpus(body.get("status"), node_gpus))


def job_changed(state: State, change: Change) -> None:
    """A warm-up Job changed: once it has finished and its result is not recorded yet, queue its owner."""
    job = change.new
    if job is None or not state.cluster.ready or not state.lifecycle.leading:
        return
    finished = job_condition(job, "Complete") or job_condition(job, "Failed")
    meta = job.get("metadata") or {}
    if not finished or RECORDED_ANNOTATION in (meta.get("annotations") or {}):
        return
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            enqueue(state, (str(meta.get("namespace") or ""), str(ref["name"])), JOBS)


def enqueue(state: State, key: Key, handler: str = RECONCILE) -> None:
    """Have a worker handle ``key`` (once, however often asked while it waits)."""
    if key in state.scheduler.queued:
        return
    state.scheduler.queued[key] = handler
    state.scheduler.queue.put_nowait(key)


async def work(state: State, emit: Emit | None) -> None:
    """One worker: handle the queued caches one after the other, each run timed under the handler that
    asked for it (none once this replica stopped acting); errors are logged, never fatal."""
    while True:
        key = await state.scheduler.queue.get()
        handler = state.scheduler.queued.pop(key, RECONCILE)
        if not state.lifecycle.leading:
            continue
        try:
            with state.metrics.timed(handler):
                await handle(state, key, emit)
        except Exception as exc:
            logger.warning("handling CompileCache %s/%s failed: %s", key[0], key[1], exc)
        await asyncio.sleep(0)  # a long queue of caches that need no request lets the event loop run


async def handle(state: State, key: Key, emit: Emit | None) -> None:
    """What an event or the resync does about a cache: finish its deletion, or reconcile it if
    unsettled; a problem that may pass is looked at again after ``settings.retry_seconds``."""
    body = state.cluster.cache(key)
    if body is None:
        return
    if is_deleting(body):
        try:
            delay = await finalize(state, body, emit)
        except Exception as exc:  # said in the log and an event; tried again
            logger.warning("CompileCache %s/%s: finishing its deletion failed: %s", *key, describe(exc))
            post_warnings(state, body, [WarningEvent("CleanupFailed", f"deleting its bundles failed: {describe(exc)}")],
                          emit)
            delay = state.settings.retry_seconds
    else:
        result = await reconcile(state, *key, emit=emit, if_unsettled=True)
        delay = result.retry_after if result is not None and result.problem else None
    if delay is not None:
        look_again(state, key, delay, emit)


def look_again(state: State, key: Key, delay: float, emit: Emit | None) -> None:
    """Handle ``key`` again in ``delay`` seconds (once, however often asked)."""
    if key in state.scheduler.retries:
        return

    def fire() -> None:
        state.scheduler.retries.pop(key, None)
        task = asyncio.ensure_future(handle(state, key, emit))
        task.add_done_callback(_log_failure)

    state.scheduler.retries[key] = asyncio.get_running_loop().call_later(delay, fire)


async def resync(state: State, emit: Emit | None) -> int:
    """Reconcile every unsettled cache, ``settings.concurrency`` at a time; errors are logged. Each cache
    looked at lets the event loop run (a reconcile that changes nothing makes no request, so ten thousand of
    them would otherwise hold the webhook's answers for seconds). Returns how many were reconciled."""
    pending = iter(state.cluster.indexes.cache_keys())
    handled = 0

    async def worker() -> None:
        nonlocal handled
        for key in pending:
            if is_unsettled(state, key):
                handled += 1
                try:
                    await handle(state, key, emit)
                except Exception as exc:
                    logger.warning("resync of %s/%s failed: %s", key[0], key[1], exc)
            await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(max(1, state.settings.concurrency))))
    return handled


def unsettled(state: State) -> list[Key]:
    """The caches whose inputs changed since their last settled reconcile, or that wait for
    something (a Job, a Secret, a GPU node): the only ones a resync reconciles."""
    return [key for key in state.cluster.indexes.cache_keys() if is_unsettled(state, key)]


def is_unsettled(state: State, key: Key) -> bool:
    return state.scheduler.settled.get(key) != fingerprint(state, key) and key not in state.scheduler.retries


async def reconcile(
    state: State, namespace: str, name: str, *, emit: Emit | None = None, if_unsettled: bool = False
) -> Outcome | None:
    """Read, decide, apply for one cache; at most ``settings.concurrency`` at once, one at a time per
    cache. With ``if_unsettled``, nothing happens (None) when its inputs are those of its last
    settled reconcile."""
    key = (namespace, name)
    async with state.scheduler.slots, state.scheduler.locks.hold(key):
        before = fingerprint(state, key)
        if if_unsettled and state.scheduler.settled.get(key) == before:
            return None
        try:
            snapshot = await read_snapshot(state, key)
            if snapshot is None:
                return Outcome(gone=True)
            actions = decide_actions(snapshot, state.settings)
            result = await apply_actions(state, snapshot, actions, emit)
        except Exception as exc:  # every failure ends in a condition and an event, and is looked at again
            body = state.cluster.cache(key)
            if body is None:
                raise
            result = await report_failure(state, body, exc, emit)
        if result.until_changed:  # settled on what it read: the next change of its inputs tries again
            state.scheduler.settled[key] = _settled_fingerprint(state, key, before)
        elif result.problem or result.warming or actions.create or actions.count or actions.records:
            state.scheduler.settled.pop(key, None)
        elif actions.finalizers is None:
            state.scheduler.settled[key] = _settled_fingerprint(state, key, before)
        if result.problem and result.retry_after:
            return replace(result, retry_after=state.scheduler.backoff(key, result.retry_after))
        state.scheduler.failures.pop(key, None)
        return result


def fingerprint(state: State, key: Key) -> tuple[Any, ...]:
    """What a reconcile of ``key`` reads from memory, reduced to versions: the same fingerprint
    means the same decisions (the Secret and pods aside, which only caches with unfinished
    business read, and those are never settled)."""
    body = state.cluster.cache(key) or {}
    meta = body.get("metadata") or {}
    jobs = state.cluster.indexes.jobs.get(str(meta.get("uid", "")), ())
    versions = sorted(str((j.get("metadata") or {}).get("resourceVersion", "")) for j in jobs)
    spec = cache_spec(state, body) if body else None
    label_key = spec.gpu_discovery.label_key if isinstance(spec, CacheSpec) else ""
    return (meta.get("resourceVersion"), tuple(versions), frozenset(state.cluster.indexes.nodes.get(label_key, ())))


def _settled_fingerprint(state: State, key: Key, before: tuple[Any, ...]) -> tuple[Any, ...]:
    """The fingerprint to remember: the one read, with the version of a status just written."""
    written = state.cluster.written.get(key)
    return (written[1]["metadata"].get("resourceVersion"), *before[1:]) if written else before


async def report_failure(state: State, body: Mapping[str, Any], exc: BaseException, emit: Emit | None) -> Outcome:
    """A reconcile that failed: Ready=False with the reason and what failed (:func:`failures.failure_of`),
    a Warning event, a log line; the cache is looked at again after ``settings.retry_seconds`` (longer while
    the failure lasts: :meth:`Scheduler.backoff`), or, refused for good, once its inputs change. When even the
    status cannot be written, the event and the log say both."""
    failure = failure_of(exc)
    meta = body["metadata"]
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    warning = failure_warning(failure)
    # A failure said once while it stands: looking again (with a growing pause) repeats it at INFO only.
    level = logging.INFO if warning in state.scheduler.warnings.get(key, frozenset()) else logging.WARNING
    logger.log(level, "CompileCache %s: %s: %s%s", where, failure.reason, failure.message,
               " (not tried again until the CompileCache changes)" if failure.until_changed else "",
               exc_info=exc if failure.reason == "ReconcileFailed" and level == logging.WARNING else None)
    generation = int(meta.get("generation") or 1)
    status = cache_status.build_status(body.get("status"), generation=generation,
                                   conditions=cache_status.failure_conditions(failure), bundles=None,
                                   planned_gpus=None, storage_url=None, now=now_rfc3339())
    try:
        await write_status(state, body, status)
    except Exception as write_exc:
        logger.error("CompileCache %s: the status saying so could not be written either: %s", where, write_exc)
        warning = WarningEvent(failure.reason, f"{failure.message} (and the status could not be written: {write_exc})")
    post_warnings(state, body, [warning], emit)
    if failure.until_changed:
        return Outcome(problem=failure.message, until_changed=True)
    return Outcome(problem=failure.message, retry_after=state.settings.retry_seconds)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.warning("looking again failed: %s", task.exception())
