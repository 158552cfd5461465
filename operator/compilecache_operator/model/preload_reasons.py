"""The preload results the operator counts, and their reasons: fixed sets (bounded metric labels).

``compilecache_preloads_total{result, reason}`` counts every opted-in pod once. ``hit`` means
that the app containers read a cache preloaded for their own image (so for the torch, triton,
CUDA and Python versions the bundle was compiled with) and for the GPU the pod runs on, as far
as the operator can know before the app runs: the webhook wires the cache only into pods whose
every app container will read it, never preloads a bundle warmed with another image, and the
preloader then reports that it installed the bundle. The workload's own counters
(``cachelib.runtime``) say whether torch then hit; the dashboard shows both.

Pods the webhook left alone carry ``compilecache.io/skipped: <reason>``; the result they count
as comes from :data:`WEBHOOK_RESULTS` (``image-mismatch`` is a miss: the cache covers other
images, the pod starts cold). A preload the preloader ran reports its own result in its
termination message; :func:`preload_reason` files its free-text reason under a fixed name.
"""

from __future__ import annotations

from cachelib.preload import ERROR, HIT, MISS, SOURCE_NODE_CACHE
from cachelib.preload import RESULTS as PRELOAD_RESULTS
from compilecache_operator.model.cache_readers import CACHE_DIR_NOT_ABSOLUTE, CACHE_DIR_VALUE_FROM, VOLUME_AT_CACHE_DIR

SKIPPED = "skipped"
"""An opted-in pod that got no preload (the webhook left it alone)."""
RESULTS = (*PRELOAD_RESULTS, SKIPPED)
"""What the operator counts per opted-in pod: the preloader's results, and ``skipped``."""

# The webhook's reasons for leaving a pod alone (the value of compilecache.io/skipped).
UNKNOWN_CACHE = "unknown-cache"
NOT_READY = "not-ready"
IMAGE_MISMATCH = "image-mismatch"
NOT_INJECTED = "not-injected"
"""An opted-in pod without the preload container and without the webhook's annotation: the webhook
did not see it (it fails open: down, timed out, or the namespace is excluded)."""
WEBHOOK_RESULTS: dict[str, str] = {
    UNKNOWN_CACHE: SKIPPED,
    NOT_READY: SKIPPED,
    CACHE_DIR_VALUE_FROM: SKIPPED,
    CACHE_DIR_NOT_ABSOLUTE: SKIPPED,
    VOLUME_AT_CACHE_DIR: SKIPPED,
    IMAGE_MISMATCH: MISS,
}

# The preloader's results, filed by reason.
PRELOADED = "preloaded"
NODE_CACHE = "node-cache"
"""A hit whose bundles the node cache already held complete: nothing was fetched."""
NO_BUNDLE = "no-bundle"
STORE_UNAVAILABLE = "store-unavailable"
DEADLINE_EXCEEDED = "deadline-exceeded"
PRELOAD_FAILED = "preload-failed"
SIGNATURE_REFUSED = "signature-refused"
"""A bundle refused because it carried no signature by a trusted key (cachelib.signing)."""
RESULT_UNREADABLE = "result-unreadable"

REASONS = (
    *WEBHOOK_RESULTS, NOT_INJECTED,
    PRELOADED, NODE_CACHE, NO_BUNDLE, STORE_UNAVAILABLE, DEADLINE_EXCEEDED, PRELOAD_FAILED, RESULT_UNREADABLE,
    SIGNATURE_REFUSED,
)


def not_injected(annotation: str | None) -> tuple[str, str]:
    """(result, reason) of an opted-in pod without the preload container, from its
    ``compilecache.io/skipped`` annotation (anyone may write an annotation: unknown values are
    ``not-injected``)."""
    reason = annotation if annotation in WEBHOOK_RESULTS else NOT_INJECTED
    assert reason is not None
    return WEBHOOK_RESULTS.get(reason, SKIPPED), reason


def preload_reason(result: str, text: str, *, code: str = "", source: str = "") -> str:
    """The fixed reason of a result the preloader reported (hit, miss or error): its ``code`` when
    it is one of ours, else from its ``source`` (a hit) or its message (``store unavailable: …``,
    ``deadline of 30 s passed …``)."""
    if code in REASONS:
        return code
    if result == HIT:
        return NODE_CACHE if source == SOURCE_NODE_CACHE else PRELOADED
    lowered = text.lower()
    if "deadline" in lowered:
        return DEADLINE_EXCEEDED
    if lowered.startswith("store unavailable"):
        return STORE_UNAVAILABLE
    if lowered.startswith("signatureerror"):
        return SIGNATURE_REFUSED
    if result == MISS:
        return NO_BUNDLE
    return PRELOAD_FAILED


__all__ = [
    "CACHE_DIR_NOT_ABSOLUTE",
    "CACHE_DIR_VALUE_FROM",
    "DEADLINE_EXCEEDED",
    "ERROR",
    "HIT",
    "IMAGE_MISMATCH",
    "MISS",
    "NODE_CACHE",
    "NOT_INJECTED",
    "NOT_READY",
    "NO_BUNDLE",
    "PRELOADED",
    "PRELOAD_FAILED",
    "PRELOAD_RESULTS",
    "REASONS",
    "RESULTS",
    "RESULT_UNREADABLE",
    "SKIPPED",
    "SOURCE_NODE_CACHE",
    "STORE_UNAVAILABLE",
    "UNKNOWN_CACHE",
    "VOLUME_AT_CACHE_DIR",
    "WEBHOOK_RESULTS",
    "not_injected",
    "preload_reason",
]
