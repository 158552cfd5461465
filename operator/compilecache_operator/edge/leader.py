"""Leader election with a ``coordination.k8s.io/v1`` Lease, as Kubernetes' own controllers do it.

Every replica keeps its indexes and serves the webhook; only the holder of the Lease acts
(reconciles, deletes bundles, counts results). The holder renews the Lease every
``renew_seconds``; the others take it over once it has not changed for ``lease_seconds`` by their
own clocks (so clock skew between nodes does not matter), or at once when the holder released it
on shutdown. A replica that cannot renew for ``lease_seconds`` stops acting before anyone else
may take over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from compilecache_operator.edge.kube import KubeAPI, KubeError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seen:
    """What a replica last saw of the Lease, and when by its own clock."""

    holder: str
    renewed: str
    since: float


def micro_time(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def step(lease: Mapping[str, Any] | None, me: str, seen: Seen | None, now: float, lease_seconds: float) -> str:
    """What to do with the Lease: ``create`` it, ``renew`` it (ours), ``take`` it (free or
    expired), or ``wait`` (another replica holds it)."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if holder == me:
        return "renew"
    if not holder:
        return "take"
    current = (holder, str(spec.get("renewTime") or ""))
    if seen is None or (seen.holder, seen.renewed) != current:
        return "wait"
    return "take" if now - seen.since >= lease_seconds else "wait"


def observe(lease: Mapping[str, Any] | None, seen: Seen | None, now: float) -> Seen | None:
    """Remember the Lease's holder and renew time, and since when they are unchanged."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    current = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
    if seen is not None and (seen.holder, seen.renewed) == current:
        return seen
    return Seen(current[0], current[1], now)


def held_by(me: str, lease: Mapping[str, Any] | None, lease_seconds: float, *, take: bool) -> dict[str, Any]:
    """The Lease as ``me`` holds it (renewed now; a take-over counts a transition)."""
    spec = dict((lease or {}).get("spec") or {})
    now = micro_time()
    spec.update(holderIdentity=me, leaseDurationSeconds=int(lease_seconds), renewTime=now)
    if take or lease is None:
        spec.update(acquireTime=now, leaseTransitions=int(spec.get("leaseTransitions") or 0) + (1 if lease else 0))
    return {**(lease or {}), "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec}


class Elector:
    """Keeps ``on_change(True/False)`` told whether this replica leads."""

    def __init__(
        self,
        api: KubeAPI,
        namespace: str,
        name: str,
        me: str,
        on_change: Callable[[bool], None],
        *,
        lease_seconds: float = 15.0,
        renew_seconds: float = 5.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.api, self.namespace, self.name, self.me = api, namespace, name, me
        self.on_change = on_change
        self.lease_seconds, self.renew_seconds, self.retry_seconds = lease_seconds, renew_seconds, retry_seconds
        self.leading = False
        self._seen: Seen | None = None
        self._renewed_at = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except (KubeError, OSError) as exc:
                logger.warning("leader election: %s", exc)
            if self.leading and time.monotonic() - self._renewed_at >= self.lease_seconds:
                self._set(False)  # could not renew in time: someone else may hold it now
            await asyncio.sleep(self.renew_seconds if self.leading else self.retry_seconds)

    async def once(self) -> None:
        lease = await self.api.get_lease(self.namespace, self.name)
        now = time.monotonic()
        what = step(lease, self.me, self._seen, now, self.lease_seconds)
        self._seen = observe(lease, self._seen, now)
        if what == "wait":
            self._set(False)
            return
        new = held_by(self.me, lease, self.lease_seconds, take=what == "take")
        try:
            if what == "create":
                new["metadata"] = {"name": self.name, "namespace": self.namespace}
                await self.api.create_lease(self.namespace, new)
            else:
                await self.api.replace_lease(self.namespace, self.name, new)
        except KubeError as exc:
            if exc.status in (409, 422):  # another replica was faster
                self._set(False)
                return
            raise
        self._renewed_at = now
        self._set(True)

    async def release(self) -> None:
        """Give the Lease up (on shutdown) so that another replica takes over at once."""
        if not self.leading:
            return
        self._set(False)
        lease = await self.api.get_lease(self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.me:
            return
        spec = {**lease["spec"], "holderIdentity": None, "renewTime": micro_time()}
        await self.api.replace_lease(self.namespace, self.name, {**lease, "spec": spec})

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            logger.info("%s the leader (Lease %s/%s, identity %s)", "became" if leading else "no longer",
                        self.namespace, self.name, self.me)
            self.on_change(leading)
