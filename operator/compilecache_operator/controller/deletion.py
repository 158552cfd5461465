"""The deletion of a CompileCache with ``deletionPolicy: Delete``: its warm-up Jobs, then its bundles
in the store, then the finalizer that held the object until they were gone."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachelib.keyformat import cache_prefix
from cachelib.stores import Store, StoreError, in_store_thread
from compilecache_operator.controller import reconcile
from compilecache_operator.controller.cache_warnings import emit_event
from compilecache_operator.controller.state import Emit, State
from compilecache_operator.decisions import warmup_job
from compilecache_operator.decisions.plan import Variant
from compilecache_operator.edge import storeops
from compilecache_operator.model.names import FINALIZER, WARMUP_LABEL
from compilecache_operator.model.spec import CacheSpec, InvalidSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CleanupOutcome:
    done: bool
    message: str
    retry_after: float | None = None
    warning: str | None = None
    """The reason of a Warning event to post at the first attempt that meets it: something only the cache's
    owner or an admin can fix (SecretForbidden), said once rather than only logged."""


async def finalize(state: State, body: Mapping[str, Any], emit: Emit | None) -> float | None:
    """A cache being deleted that carries our finalizer: delete its bundles, then the finalizer
    (after ``settings.delete_attempts`` failed attempts, anyway: BundlesLeft). The delay before
    the next attempt, or None when done."""
    meta = body["metadata"]
    current = list(meta.get("finalizers") or [])
    if FINALIZER not in current:
        return None
    key = (str(meta["namespace"]), str(meta["name"]))
    async with state.scheduler.slots, state.scheduler.locks.hold(key):
        result = await cleanup(state, body)
        attempts = state.lifecycle.delete_attempts[key] = state.lifecycle.delete_attempts.get(key, 0) + 1
        if result.done:
            emit_event(emit, body, "Normal", "BundlesDeleted", result.message)
        elif attempts >= state.settings.delete_attempts:
            emit_event(emit, body, "Warning", "BundlesLeft", f"gave up deleting bundles: {result.message}")
        else:
            if result.warning and attempts == 1:
                emit_event(emit, body, "Warning", result.warning, result.message)
            logger.info("deleting the bundles of %s/%s: %s", key[0], key[1], result.message)
            return result.retry_after or state.settings.retry_seconds
        assert state.api is not None
        await state.api.set_finalizers(key[0], key[1], current, [f for f in current if f != FINALIZER])
        state.lifecycle.delete_attempts.pop(key, None)
        return None


async def cleanup(state: State, body: Mapping[str, Any]) -> CleanupOutcome:
    """Delete the bundles of a CompileCache with deletionPolicy Delete.

    Warm-up Jobs go first, and the store is cleared only once their pods are gone, so that no
    publish lands after the delete.
    """
    api = state.api
    assert api is not None
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for job in state.cluster.indexes.jobs.get(str(meta.get("uid", "")), ()):
        await api.delete_job(namespace, job["metadata"]["name"])
    label = warmup_job.warmup_labels(name, Variant("", "", ""), 0)[WARMUP_LABEL]
    pods = [p for p in await api.list_pods(namespace, f"{WARMUP_LABEL}={label}")
            if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    if pods:
        return CleanupOutcome(False, f"waiting for {len(pods)} warm-up pod(s) to stop", retry_after=5.0)
    spec = reconcile.cache_spec(state, body)
    if isinstance(spec, InvalidSpec):
        return CleanupOutcome(True, f"spec is invalid, bundles left in place: {spec}")
    secret, forbidden = await reconcile.read_storage_secret(api, namespace, spec.storage)
    if forbidden:
        problem = reconcile.secret_forbidden(spec.storage, namespace, state.settings.secret_reader)
        return CleanupOutcome(False, problem.message, retry_after=state.settings.retry_seconds,
                              warning=problem.reason)
    return await _clear_store(state, spec, secret, namespace, name)


async def _clear_store(
    state: State, spec: CacheSpec, secret: Mapping[str, bytes] | None, namespace: str, name: str
) -> CleanupOutcome:
    credentials = reconcile.secret_credentials(spec.storage, secret)

    def run(store: Store) -> storeops.DeleteReport:
        return storeops.delete_cache(store, namespace, name)

    try:
        report = await in_store_thread(spec.storage.url, run, credentials)
    except StoreError as exc:
        return CleanupOutcome(False, f"store unavailable: {exc}", retry_after=state.settings.retry_seconds)
    if report.failed:
        return CleanupOutcome(False, f"{len(report.failed)} bundle(s) not deleted: {report.failed[0][1]}",
                              retry_after=state.settings.retry_seconds)
    state.metrics.forget_cache(namespace, name)
    return CleanupOutcome(True, f"deleted {len(report.deleted)} object(s) under {cache_prefix(namespace, name)}")
