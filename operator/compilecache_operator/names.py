"""Names shared by the CRD, the Jobs, the webhook and the metrics."""

from __future__ import annotations

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
COUNTED_ANNOTATION = f"{GROUP}/preload-counted"
GPU_ANNOTATION = f"{GROUP}/gpu"
"""Set by users on a pod to name the GPU product whose bundle to preload."""
RECORDED_ANNOTATION = f"{GROUP}/recorded"
"""On a warm-up Job once its result is counted in the metrics."""

WEBHOOK_ID = "inject-pods"
"""Kopf's handler id of the pod-mutating webhook: the webhook server serves it at ``/inject-pods``."""

CACHE_VOLUME = "compilecache-cache"
CACHE_MOUNT = "/var/cache/compilecache"
INDUCTOR_SUBDIR = "inductor"
INDUCTOR_DIR = f"{CACHE_MOUNT}/{INDUCTOR_SUBDIR}"
PRELOAD_CONTAINER = "compilecache-preload"

HARNESS_VOLUME = "harness"
HARNESS_DIR = "/opt/compilecache-harness"
WORK_VOLUME = "work"
WORK_DIR = "/work"
OUT_DIR = f"{WORK_DIR}/out"

EXCLUDED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
