"""Names shared by the CRD, the Jobs, the webhook and the metrics."""

from __future__ import annotations

from cachelib.in_image.podcontract import DONE_FILE_ENV as DONE_FILE_ENV
from cachelib.in_image.podcontract import DONE_FILE_NAME as DONE_FILE_NAME
from cachelib.in_image.podcontract import VLLM_CACHE_ROOT_ENV as VLLM_CACHE_ROOT_ENV
from cachelib.in_image.podcontract import VLLM_ROOT_SUBDIR as VLLM_ROOT_SUBDIR

GROUP = "compilecache.io"
VERSION = "v1alpha1"
PLURAL = "compilecaches"
KIND = "CompileCache"
API_VERSION = f"{GROUP}/{VERSION}"

PREFIX = GROUP
"""Prefix of every label and annotation the operator sets (and of Kopf's own progress annotations)."""
FINALIZER = f"{GROUP}/bundles"

CACHE_LABEL = f"{GROUP}/cache"
"""The opt-in label of workload pods: ``compilecache.io/cache: <CompileCache name>``."""
WARMUP_LABEL = f"{GROUP}/warmup-for"
"""On warm-up Jobs and their pods: the CompileCache they warm (never the opt-in label)."""
VARIANT_LABEL = f"{GROUP}/variant"
GENERATION_LABEL = f"{GROUP}/generation"

INJECTED_ANNOTATION = f"{GROUP}/injected"
SKIPPED_ANNOTATION = f"{GROUP}/skipped"
"""On an opted-in pod the webhook did not patch: the reason (a bounded value, see docs/operator.md)."""
SKIPPED_DETAIL_ANNOTATION = f"{GROUP}/skipped-detail"
"""Beside ``skipped``: the same in words, naming the container and path where there is one."""
ENV_FROM_ANNOTATION = f"{GROUP}/env-from-overridden"
"""On an injected pod: the app containers with ``envFrom`` whose variables of the names the webhook sets
are overridden by the webhook's (comma-separated container names)."""
PRELOAD_SHARE_ANNOTATION = f"{GROUP}/preload-share"
"""On an injected pod: how the preload leaves the tree for the app (``owner``, ``group`` or ``all``)."""
COUNTED_ANNOTATION = f"{GROUP}/preload-counted"
COLD_COUNTED_ANNOTATION = f"{GROUP}/cold-start-counted"
"""On an opted-in pod whose workload's verdict was tallied into its cache's status.coldStarts."""
GPU_ANNOTATION = f"{GROUP}/gpu"
"""Set by users on a pod to name the GPU product whose bundle to preload."""
RECORDED_ANNOTATION = f"{GROUP}/recorded"
"""On a warm-up Job once its result is counted in the metrics."""
PRELOAD_MODE_ANNOTATION = f"{GROUP}/preload-mode"
"""On an injected pod: how its preload runs, ``InitContainer`` or ``Sidecar``."""
PRELOAD_MODE_REASON_ANNOTATION = f"{GROUP}/preload-mode-reason"
PREDICTED_ANNOTATION = f"{GROUP}/predicted"
"""On an injected vLLM pod: what the admission predicted, ``warm`` or ``cold``
(compilecache_operator.decisions.prediction)."""
PREDICTED_DETAIL_ANNOTATION = f"{GROUP}/predicted-detail"
"""Beside ``predicted``: the key factors that differ from the warm-up's, each with both values."""
"""On an injected pod whose cache asks for ``Sidecar`` but got ``InitContainer``: why."""
NODE_CACHE_FALLBACK_ANNOTATION = f"{GROUP}/node-cache-fallback"
"""On an injected pod whose cache has a node cache that the namespace's Pod Security level refuses: the
pod preloads into its own emptyDir instead; the value is the reason (``pod-security-baseline``,
``pod-security-restricted``)."""

WEBHOOK_ID = "inject-pods"
"""The id of the pod-mutating webhook: the webhook server serves it at ``/inject-pods``."""
CACHE_WEBHOOK_ID = "validate-caches"
"""The id of the CompileCache validating webhook: the webhook server serves it at ``/validate-caches``."""

CACHE_VOLUME = "compilecache-cache"
CACHE_MOUNT = "/var/cache/compilecache"
INDUCTOR_SUBDIR = "inductor"
INDUCTOR_DIR = f"{CACHE_MOUNT}/{INDUCTOR_SUBDIR}"
VLLM_ROOT_DIR = f"{INDUCTOR_DIR}/{VLLM_ROOT_SUBDIR}"
"""A vLLM app's ``VLLM_CACHE_ROOT`` (cachelib.in_image.vllmwarm lays its bundles out so)."""
PRELOAD_CONTAINER = "compilecache-preload"
VLLM_WATCH_CONTAINER = "compilecache-vllm-watch"
"""The native sidecar beside a vLLM pod that says whether vLLM loaded the bundle (cachelib.vllmwatch)."""
PRELOAD_TMPDIR = CACHE_MOUNT
"""``TMPDIR`` of the preload container: its root file system is read-only, the cache volume is not."""

# The hand-off between the preloader and the workload.
DONE_FILE = f"{INDUCTOR_DIR}/{DONE_FILE_NAME}"
"""Where the preloader writes its result in the cache volume, as the preload container sees it."""
HANDOFF_VOLUME = "compilecache-handoff"
HANDOFF_DIR = "/run/compilecache"
HANDOFF_DONE_FILE = f"{HANDOFF_DIR}/{DONE_FILE_NAME}"
"""The done file of a sidecar preload into a node cache: a per-pod emptyDir, because the node's
cache directory outlives the pod and holds the done file of an earlier one."""

HARNESS_VOLUME = "harness"
HARNESS_DIR = "/opt/compilecache-harness"
WORK_VOLUME = "work"
WORK_DIR = "/work"
SCRATCH_VOLUME = "compilecache-tmp"
SCRATCH_DIR = "/tmp"
"""The warm-up compile container's writable /tmp (an emptyDir) under a read-only root file system."""
OUT_DIR = f"{WORK_DIR}/out"

EXCLUDED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
