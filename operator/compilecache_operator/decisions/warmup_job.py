"""The warm-up Job of one variant (pure): harness copy, compile in the user's image, publish.

Nothing here talks to the API server; the reconcile builds the manifest here and creates it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachelib.in_image.podcontract import GPU_ENV, JOB_ID_ENV
from compilecache_operator.decisions.job_reports import COMPILE_CONTAINER, HARNESS_CONTAINER, PUBLISH_CONTAINER
from compilecache_operator.decisions.plan import Variant
from compilecache_operator.model import store_ca
from compilecache_operator.model.names import (
    API_VERSION,
    GENERATION_LABEL,
    GPU_ANNOTATION,
    HARNESS_DIR,
    HARNESS_VOLUME,
    KIND,
    OUT_DIR,
    SCRATCH_DIR,
    SCRATCH_VOLUME,
    VARIANT_LABEL,
    WARMUP_LABEL,
    WORK_DIR,
    WORK_VOLUME,
)
from compilecache_operator.model.security import restricted_container_context, restricted_pod_context
from compilecache_operator.model.spec import CacheSpec
from compilecache_operator.model.store_access import storage_env

HARNESS_FILE = f"{HARNESS_DIR}/harness.py"
# Copies cachelib's harness module, the key and options module it imports from beside itself and the
# built-in targets it loads from there, out of the preloader image without importing them (they need torch).
COPY_HARNESS = (
    "import importlib.util, os, shutil, sys; "
    "[shutil.copyfile(importlib.util.find_spec('cachelib.in_image.' + m).origin, "
    "os.path.join(os.path.dirname(sys.argv[1]), m + '.py')) "
    "for m in ('harness', 'compilekey', 'compilestep', 'podcontract', 'targets', 'warmstart', 'precompileguard', "
    "'precheck', 'bytecode', 'triton_modules', 'factors', 'masking', 'vllmwarm', 'vllmargs', 'vllm_options', "
    "'stagelog', 'precompileparts')]"
)
VLLM_WARMUP_FILE = f"{HARNESS_DIR}/vllmwarm.py"
SCRATCH_ENV = (("TMPDIR", SCRATCH_DIR), ("TRITON_HOME", SCRATCH_DIR))
"""Under a read-only root, where the compile container's temporary files and Triton's home (its dumps and
overrides; its cache is kept in the inductor cache on the work volume) go, unless ``spec.warmup.env`` says."""


@dataclass(frozen=True)
class JobSettings:
    """Operator-wide settings of warm-up Jobs."""

    preloader_image: str
    image_pull_secrets: tuple[str, ...] = ()


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def warmup_labels(cache_name: str, variant: Variant, generation: int) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "compilecache-warmup",
        "app.kubernetes.io/managed-by": "compilecache-operator",
        WARMUP_LABEL: cache_name[:63].rstrip("-."),
        VARIANT_LABEL: variant.id,
        GENERATION_LABEL: str(generation),
    }


def harness_command(namespace: str, name: str, spec: CacheSpec) -> list[str]:
    model = spec.model
    if model.vllm is not None:  # vLLM started as the pods start it (cachelib.in_image.vllmwarm)
        invocation = {"command": list(model.vllm.command), "model": model.vllm.model, "args": list(model.vllm.args)}
        return ["python3", VLLM_WARMUP_FILE, "--out", OUT_DIR, "--namespace", namespace, "--name", name,
                "--invocation", json.dumps(invocation, separators=(",", ":"))]  # fmt: skip
    what = ["--target", model.target] if model.target is not None else ["--command", model.command or ""]
    args = ["python", HARNESS_FILE, *what, "--out", OUT_DIR, "--namespace", namespace, "--name", name]
    return args + model.compile.harness_args()


def build_job(
    owner: Mapping[str, Any],
    spec: CacheSpec,
    variant: Variant,
    *,
    name: str,
    job_id: str,
    settings: JobSettings,
) -> dict[str, Any]:
    """The warm-up Job of one variant, "restricted" by Pod Security Standards.

    Containers run in this order: ``harness`` (init, preloader image) copies harness.py into a
    shared volume; ``compile`` (init, the user's image) compiles into ``/work/out``; ``publish``
    (the one main container, preloader image) packs, verifies and publishes the bundle and
    reports it in its termination message. Init containers run one after another and all before
    the main container, which is what puts publish strictly after compile.

    The pod runs as ``spec.warmup.securityContext`` (uid, gid, fsGroup; 65532 by default) with
    the runtime's default seccomp profile; every container drops all capabilities and may not
    escalate; harness and publish (the preloader image) have a read-only root file system and
    publish packs in ``TMPDIR=/work``; compile (the user's image) too, with an emptyDir on ``/tmp``
    (``TMPDIR``, ``TRITON_HOME``), unless ``spec.warmup.readOnlyRootFilesystem`` is false.
    """
    meta = owner.get("metadata") or {}
    namespace = str(meta.get("namespace"))
    cache_name = str(meta.get("name"))
    generation = int(meta.get("generation") or 1)
    warm = spec.warmup
    labels = warmup_labels(cache_name, variant, generation)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": restricted_pod_context(
            run_as_user=warm.run_as_user, run_as_group=warm.run_as_group, fs_group=warm.fs_group
        ),
        "volumes": [
            {"name": HARNESS_VOLUME, "emptyDir": {}},
            {"name": WORK_VOLUME, "emptyDir": {}},
            *(dict(v) for v in warm.volumes),
            *([store_ca.ca_volume(spec.storage.ca)] if spec.storage.ca else []),
            *([{"name": SCRATCH_VOLUME, "emptyDir": {}}] if scratch_mounted(spec) else []),
        ],
        "initContainers": [
            {
                "name": HARNESS_CONTAINER,
                "image": settings.preloader_image,
                "command": ["python", "-c", COPY_HARNESS, HARNESS_FILE],
                "volumeMounts": [{"name": HARNESS_VOLUME, "mountPath": HARNESS_DIR}],
                "resources": spec.warmup.helper_resources.to_dict(),
                "securityContext": restricted_container_context(),
            },
            _compile_container(namespace, cache_name, spec, variant, job_id),
        ],
        "containers": [_publish_container(spec, settings)],
        **_warmup_placement(spec, variant, settings),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {GPU_ANNOTATION: variant.gpu_label},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "backoffLimit": warm.backoff_limit,
            "activeDeadlineSeconds": warm.active_deadline_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def compile_env(job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ``env`` entries of a warm-up Job's compile container, as the Job holds them (none when it has none)."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
        if container.get("name") == COMPILE_CONTAINER:
            return [e for e in container.get("env") or [] if isinstance(e, Mapping)]
    return []


def _compile_container(
    namespace: str, cache_name: str, spec: CacheSpec, variant: Variant, job_id: str
) -> dict[str, Any]:
    """The warm-up's ``compile`` container: the user's image running the harness into ``/work/out``."""
    warm = spec.warmup
    compile_env = [{"name": JOB_ID_ENV, "value": job_id}]
    if variant.gpu:
        compile_env.append({"name": GPU_ENV, "value": variant.gpu})
    if spec.remote_cache is not None:
        compile_env += [{"name": k, "value": v} for k, v in spec.remote_cache.env().items()]
    if warm.read_only_root_filesystem:
        own = {str(e.get("name")) for e in warm.env}
        compile_env += [{"name": k, "value": v} for k, v in SCRATCH_ENV if k not in own]
    compile_env += [dict(e) for e in warm.env]
    if spec.model.vllm is not None:
        compile_env += [{"name": k, "value": v} for k, v in spec.model.vllm.env]

    resources = warm.resources.to_dict()
    if variant.gpu and warm.gpus_per_job > 0:
        limits = resources.setdefault("limits", {})
        limits.setdefault(warm.gpu_resource_name, str(warm.gpus_per_job))

    container: dict[str, Any] = {
        "name": COMPILE_CONTAINER,
        "image": spec.image,
        "command": harness_command(namespace, cache_name, spec),
        "env": compile_env,
        "volumeMounts": [
            {"name": HARNESS_VOLUME, "mountPath": HARNESS_DIR, "readOnly": True},
            {"name": WORK_VOLUME, "mountPath": WORK_DIR},
            *(dict(m) for m in warm.volume_mounts),
            *([{"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}] if scratch_mounted(spec) else []),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted_container_context(read_only_root=warm.read_only_root_filesystem),
    }
    if resources:
        container["resources"] = resources
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


def scratch_mounted(spec: CacheSpec) -> bool:
    """Whether the compile container gets the /tmp emptyDir: under a read-only root, unless a volume of the
    spec is mounted there already."""
    warm = spec.warmup
    return warm.read_only_root_filesystem and not any(
        str(m.get("mountPath", "")).rstrip("/") == SCRATCH_DIR for m in warm.volume_mounts
    )


def _publish_container(spec: CacheSpec, settings: JobSettings) -> dict[str, Any]:
    """The warm-up's ``publish`` container (preloader image): packs, verifies, publishes, reports."""
    return {
        "name": PUBLISH_CONTAINER,
        "image": settings.preloader_image,
        "command": ["compilecache", "publish", OUT_DIR, "--store", spec.storage.url],
        # The bundle is packed in a temporary directory: on the work volume, as the root file
        # system is read-only.
        "env": [{"name": "TMPDIR", "value": WORK_DIR}, *storage_env(spec.storage)],
        "volumeMounts": [
            {"name": WORK_VOLUME, "mountPath": WORK_DIR},
            *([dict(store_ca.CA_MOUNT)] if spec.storage.ca else []),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": spec.warmup.helper_resources.to_dict(),
        "securityContext": restricted_container_context(),
    }


def _warmup_placement(spec: CacheSpec, variant: Variant, settings: JobSettings) -> dict[str, Any]:
    """Where and as whom the warm-up pod runs: node selector (the variant's GPU), tolerations,
    service account and image pull secrets (only those that are set), and whether the pod mounts its
    ServiceAccount's API token (always said)."""
    warm = spec.warmup
    placement: dict[str, Any] = {}
    node_selector = dict(warm.node_selector)
    if variant.gpu:
        node_selector[spec.gpu_discovery.label_key] = variant.gpu
    if node_selector:
        placement["nodeSelector"] = node_selector
    if warm.tolerations:
        placement["tolerations"] = [dict(t) for t in warm.tolerations]
    if warm.service_account_name:
        placement["serviceAccountName"] = warm.service_account_name
    # The user's code runs in the compile container: no API token unless the spec asks and the admin allows it
    # (confinement), whatever the ServiceAccount's own automountServiceAccountToken says.
    placement["automountServiceAccountToken"] = warm.automount_service_account_token
    pull_secrets = list(dict.fromkeys([*settings.image_pull_secrets, *warm.image_pull_secrets]))
    if pull_secrets:
        placement["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return placement
