"""What a namespace's Pod Security level lets the webhook inject (pure).

A node cache (``spec.preload.nodeCache``) needs a hostPath volume and a preload that runs as root with
``CHOWN``, ``DAC_OVERRIDE`` and ``FOWNER`` (:mod:`compilecache_operator.model.security`): the "baseline" level
refuses the hostPath, "restricted" refuses both. A pod the webhook made non-compliant would not start at
all, where without the opt-in label it would have started cold; so in such a namespace the webhook
preloads into the pod's own ``emptyDir`` instead, annotates the pod with
:data:`~compilecache_operator.model.names.NODE_CACHE_FALLBACK_ANNOTATION` (a bounded reason) and says why in
an admission warning. The leader counts those pods in ``compilecache_node_cache_fallbacks_total``.

The level is the namespace's ``pod-security.kubernetes.io/enforce`` label, as the API server's Pod
Security admission reads it; an unlabelled namespace has the cluster's default (``privileged`` unless
the API server's admission configuration says another: ``--pod-security-default``). A label value that
is not a level is enforced as ``restricted`` by the API server, and read so here.
"""

from __future__ import annotations

from collections.abc import Mapping

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
PRIVILEGED, BASELINE, RESTRICTED = "privileged", "baseline", "restricted"
LEVELS = (PRIVILEGED, BASELINE, RESTRICTED)

FALLBACK_REASONS = {BASELINE: "pod-security-baseline", RESTRICTED: "pod-security-restricted"}
"""The value of the fallback annotation (and the metric's ``reason`` label) per level: a fixed set."""
REFUSED_BY_LEVEL = {
    BASELINE: "hostPath volumes",
    RESTRICTED: "hostPath volumes, a container running as root and added capabilities (CHOWN, DAC_OVERRIDE, FOWNER)",
}
"""What a level refuses of a node-cache preload, in the API server's words."""


def enforced_level(labels: Mapping[str, str] | None, default: str = PRIVILEGED) -> str:
    """The Pod Security level a namespace with ``labels`` enforces (``default`` when unlabelled)."""
    value = (labels or {}).get(ENFORCE_LABEL)
    if value is None:
        return default
    return value if value in LEVELS else RESTRICTED


def node_cache_fallback(level: str) -> str | None:
    """The fallback reason when ``level`` refuses a node-cache preload; None where it is allowed."""
    return FALLBACK_REASONS.get(level)


def fallback_warning(namespace: str, level: str, cache: str) -> str:
    """The admission warning of a pod whose node cache is replaced by an ``emptyDir``."""
    return (f"compilecache: namespace {namespace!r} enforces Pod Security {level!r}, which refuses "
            f"{REFUSED_BY_LEVEL.get(level, 'the node cache')}: CompileCache {cache}'s node cache is left out and "
            "the pod preloads into its own emptyDir (label the namespace privileged to share the node cache)")
