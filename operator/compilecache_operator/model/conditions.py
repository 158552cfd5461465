"""Status conditions after the Kubernetes API conventions.

Conditions are keyed by type; each carries status, reason, message (credentials masked, clipped),
``observedGeneration`` and ``lastTransitionTime``, which moves only when the status itself changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cachelib.in_image.masking import mask_text

READY = "Ready"
WARMING = "Warming"
DEGRADED = "Degraded"
TYPES = (READY, WARMING, DEGRADED)
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "True" if self.status else "False"


def now_rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    existing: Sequence[Mapping[str, Any]] | None,
    wanted: Iterable[Condition],
    *,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """The new conditions list: ``wanted`` replaces conditions of the same type, keeping
    ``lastTransitionTime`` when the status did not change; other types are kept as they are."""
    by_type: dict[str, dict[str, Any]] = {str(c.get("type")): dict(c) for c in existing or [] if c.get("type")}
    for cond in wanted:
        old = by_type.get(cond.type)
        kept = old.get("lastTransitionTime") if old is not None and old.get("status") == cond.status_text else None
        by_type[cond.type] = {
            "type": cond.type,
            "status": cond.status_text,
            "reason": cond.reason,
            "message": shown_message(cond.message),
            "observedGeneration": generation,
            "lastTransitionTime": kept or now,
        }
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c["type"], len(order)), c["type"]))


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in conditions or []:
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def shown_message(message: str) -> str:
    """A message as a condition or an event shows it: credentials masked, at most :data:`MAX_MESSAGE` characters."""
    message = mask_text(message)
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"
