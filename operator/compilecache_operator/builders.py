"""Pure builders: the warm-up Job, the pod patch of the webhook, the CompileCache status.

Nothing here talks to the API server; the handlers call these and send the results.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache_operator import conditions as cond
from compilecache_operator import reasons, store_ca
from compilecache_operator.confinement import Confinement, check_confinement
from compilecache_operator.names import (
    API_VERSION,
    CACHE_LABEL,
    CACHE_MOUNT,
    CACHE_VOLUME,
    DONE_FILE,
    DONE_FILE_ENV,
    DONE_FILE_NAME,
    ENV_FROM_ANNOTATION,
    EXCLUDED_NAMESPACES,
    GENERATION_LABEL,
    GPU_ANNOTATION,
    HANDOFF_DIR,
    HANDOFF_DONE_FILE,
    HANDOFF_VOLUME,
    HARNESS_DIR,
    HARNESS_VOLUME,
    INDUCTOR_DIR,
    INDUCTOR_SUBDIR,
    INJECTED_ANNOTATION,
    KIND,
    OUT_DIR,
    PRELOAD_CONTAINER,
    PRELOAD_MODE_ANNOTATION,
    PRELOAD_MODE_REASON_ANNOTATION,
    PRELOAD_SHARE_ANNOTATION,
    PRELOAD_TMPDIR,
    SKIPPED_ANNOTATION,
    SKIPPED_DETAIL_ANNOTATION,
    VARIANT_LABEL,
    WARMUP_LABEL,
    WORK_DIR,
    WORK_VOLUME,
)
from compilecache_operator.plan import CPU, BundleRecord, Variant, bundles_from_status, plan_id, variant_id
from compilecache_operator.results import COMPILE_CONTAINER, HARNESS_CONTAINER, PUBLISH_CONTAINER, JobState
from compilecache_operator.security import (
    PreloadIdentity,
    preload_identity,
    restricted_container_context,
    restricted_pod_context,
)
from compilecache_operator.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.spec import (
    INIT_CONTAINER,
    PRECOMPILE_AUTO,
    SIDECAR,
    CacheSpec,
    Defaults,
    InvalidSpec,
    PreloadSpec,
    RemoteCacheSpec,
    Resources,
    StorageSpec,
)
from compilecache_operator.spec_parse import parse_spec
from compilecache_operator.wiring import CACHE_DIR_ENV, cache_mount_point, env_from_overrides, unwired_containers

from cachelib.bytecode import PYCACHE_DIR, PYCACHE_ENV
from cachelib.keyformat import gpu_slug
from cachelib.masking import mask_url
from cachelib.podcontract import GPU_ENV, JOB_ID_ENV, PRECOMPILE_ENV

HARNESS_FILE = f"{HARNESS_DIR}/harness.py"
# Copies cachelib's harness module, the key and options module it imports from beside itself and the
# built-in targets it loads from there, out of the preloader image without importing them (they need torch).
COPY_HARNESS = (
    "import importlib.util, os, shutil, sys; "
    "[shutil.copyfile(importlib.util.find_spec('cachelib.' + m).origin, "
    "os.path.join(os.path.dirname(sys.argv[1]), m + '.py')) "
    "for m in ('harness', 'compilekey', 'podcontract', 'targets', 'warmstart', 'precheck', 'bytecode', "
    "'triton_modules', 'factors', 'masking')]"
)


# -- warm-up Job ------------------------------------------------------------------------------------
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


def storage_env(storage: StorageSpec) -> list[dict[str, Any]]:
    """Credential variables from the storage Secret (``secretKeyRef``), none without a Secret."""
    if not storage.secret_name:
        return []
    env: list[dict[str, Any]] = []
    for cred in storage.secret_keys:
        ref: dict[str, Any] = {"name": storage.secret_name, "key": cred.key}
        if cred.optional:
            ref["optional"] = True
        env.append({"name": cred.env, "valueFrom": {"secretKeyRef": ref}})
    return env


def harness_command(namespace: str, name: str, spec: CacheSpec) -> list[str]:
    model = spec.model
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
    publish packs in ``TMPDIR=/work``; compile (the user's image) keeps a writable one.
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
        ],
        "initContainers": [
            {
                "name": HARNESS_CONTAINER,
                "image": settings.preloader_image,
                "command": ["python", "-c", COPY_HARNESS, HARNESS_FILE],
                "volumeMounts": [{"name": HARNESS_VOLUME, "mountPath": HARNESS_DIR}],
                "resources": _resources_dict(spec.warmup.helper_resources),
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
    compile_env += [dict(e) for e in warm.env]

    resources = _resources_dict(warm.resources)
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
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # The user's image: torch and its libraries write temporary files where they please.
        "securityContext": restricted_container_context(read_only_root=False),
    }
    if resources:
        container["resources"] = resources
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    return container


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
        "resources": _resources_dict(spec.warmup.helper_resources),
        "securityContext": restricted_container_context(),
    }


def _warmup_placement(spec: CacheSpec, variant: Variant, settings: JobSettings) -> dict[str, Any]:
    """Where and as whom the warm-up pod runs: node selector (the variant's GPU), tolerations,
    service account and image pull secrets; only those that are set."""
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
    pull_secrets = list(dict.fromkeys([*settings.image_pull_secrets, *warm.image_pull_secrets]))
    if pull_secrets:
        placement["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    return placement


# -- the webhook's pod patch ------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheView:
    """What the webhook knows about one CompileCache (from the operator's index)."""

    namespace: str
    name: str
    ready: bool
    spec: CacheSpec | None
    bundles: tuple[BundleRecord, ...] = ()
    current_variants: frozenset[str] = frozenset()
    job_id: str = ""


@dataclass(frozen=True)
class PodPatch:
    """The webhook's answer: new values for some pod fields, or a reason to leave the pod alone;
    and warnings for whoever creates the pod (the API server shows them to the client)."""

    skipped: str | None = None
    init_containers: list[dict[str, Any]] | None = None
    containers: list[dict[str, Any]] | None = None
    volumes: list[dict[str, Any]] | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.init_containers is not None or self.containers is not None or self.volumes is not None
                    or self.annotations)


def pinned_gpu(pod: Mapping[str, Any], label_key: str) -> str | None:
    """The GPU product a pod is pinned to: the ``compilecache.io/gpu`` annotation, its node
    selector, or a required node affinity that allows exactly one value of the GPU label."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if annotations.get(GPU_ANNOTATION):
        return str(annotations[GPU_ANNOTATION])
    spec = pod.get("spec") or {}
    selected = (spec.get("nodeSelector") or {}).get(label_key)
    if selected:
        return str(selected)
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    values: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        term_values = [
            set(expr.get("values") or [])
            for expr in term.get("matchExpressions") or []
            if expr.get("key") == label_key and expr.get("operator") == "In"
        ]
        if not term_values:
            return None  # a term that does not constrain the GPU: any GPU may be picked
        allowed = set.intersection(*term_values)
        values |= allowed
    return values.pop() if len(values) == 1 else None


def pod_images(pod: Mapping[str, Any]) -> list[str]:
    """The images of the pod's app containers, in order, once each."""
    return list(dict.fromkeys(str(c.get("image")) for c in (pod.get("spec") or {}).get("containers") or []))


def keys_for_pod_images(pod: Mapping[str, Any], view: CacheView) -> list[str]:
    """Bundle keys to preload: those warmed with one of the pod's images (any generation still
    kept). None when no bundle was: another image's bundle would be preloaded for nothing (its
    torch may differ, and its keys never match), so it is never offered instead."""
    images = set(pod_images(pod))
    return sorted({b.key for b in view.bundles if b.image in images})


@dataclass(frozen=True)
class PreloadMode:
    """How an injected pod's preload runs, and why not as its cache asks when it cannot."""

    mode: str
    fallback_reason: str | None = None

    @property
    def sidecar(self) -> bool:
        return self.mode == SIDECAR

    def annotations(self) -> dict[str, str]:
        out = {PRELOAD_MODE_ANNOTATION: self.mode}
        if self.fallback_reason:
            out[PRELOAD_MODE_REASON_ANNOTATION] = self.fallback_reason
        return out


def preload_mode(preload: PreloadSpec, sidecars: SidecarSupport) -> PreloadMode:
    """``Sidecar`` where the cache asks for it and the cluster has native sidecars, else ``InitContainer``
    (with the reason when the cache asked for a sidecar)."""
    if preload.mode != SIDECAR:
        return PreloadMode(INIT_CONTAINER)
    if sidecars.available:
        return PreloadMode(SIDECAR)
    return PreloadMode(INIT_CONTAINER, sidecars.fallback_reason)


def uses_handoff_volume(preload: PreloadSpec, mode: PreloadMode) -> bool:
    """A sidecar preloading into a node cache writes its done file into a per-pod emptyDir: the node's
    directory outlives the pod and holds an earlier pod's done file, which the workload would take
    for this pod's. Before the workload starts (an init container) the new file is always in place."""
    return mode.sidecar and bool(preload.node_cache_path)


def preload_command(
    view: CacheView,
    keys: Sequence[str],
    gpu: str | None,
    *,
    done_file: str,
    sidecar: bool,
    identity: PreloadIdentity,
    trusted_keys: Sequence[str] = (),
) -> list[str]:
    """``compilecache preload`` for one pod: its keys, the cache directory and the done file, then
    the bounds (``--max-bytes``: ``preload.maxBytes``, else the cache volume's ``sizeLimit``;
    ``--deadline``: ``preload.deadlineSeconds``) and how to leave the tree for the app
    (``--share``, and ``--owner`` for a node cache); with ``trusted_keys`` (the operator signs
    bundles) a ``--trusted-key`` for each, so that only bundles it signed are unpacked."""
    assert view.spec is not None and keys
    preload = view.spec.preload
    command = ["compilecache", "preload", "--store", view.spec.storage.url]
    for key in keys:
        command += ["--key", key]
    command += ["--target", INDUCTOR_DIR, "--done-file", done_file]
    if sidecar:
        command.append("--sidecar")
    if gpu:
        command += ["--gpu", gpu_slug(gpu)]
    if preload.strict and not sidecar:
        command.append("--strict")
    command += ["--max-bytes", str(preload.byte_budget), "--deadline", str(preload.deadline_seconds)]
    command += identity.flags()
    for public_key in trusted_keys:
        command += ["--trusted-key", public_key]
    return command


def cache_volume(view: CacheView) -> dict[str, Any]:
    """The pod's cache volume: a hostPath under the node cache, else an emptyDir of
    ``preload.sizeLimit`` (the kubelet evicts a pod whose volume grows past it)."""
    assert view.spec is not None
    path = view.spec.preload.node_cache_path
    if path:
        return {
            "name": CACHE_VOLUME,
            "hostPath": {"path": f"{path.rstrip('/')}/{view.namespace}/{view.name}", "type": "DirectoryOrCreate"},
        }
    return {"name": CACHE_VOLUME, "emptyDir": {"sizeLimit": view.spec.preload.size_limit}}


def build_pod_patch(
    pod: Mapping[str, Any],
    view: CacheView | None,
    *,
    preloader_image: str,
    excluded_namespaces: frozenset[str] = EXCLUDED_NAMESPACES,
    sidecars: SidecarSupport = NOT_DETECTED,
    trusted_keys: Sequence[str] = (),
) -> PodPatch:
    """What the webhook adds to an opted-in pod: the cache volume, the preload container first
    in line (an init container, or a native sidecar where the cache asks for one and ``sidecars``
    says the cluster has them), and in every app container the cache directory, the done file's
    path (plus job id and remote-cache settings). Idempotent: a pod that already has the preload
    container gets nothing.

    A pod whose app would not read the preload is left alone, annotated with the reason (see
    :mod:`compilecache_operator.reasons`): its cache is unknown or not Ready, an app container
    cannot be wired (:mod:`compilecache_operator.wiring`), or no bundle was warmed with the pod's
    images (``image-mismatch``)."""
    refused = _not_patched(pod, view, excluded_namespaces)
    if refused is not None:
        return refused
    assert view is not None and view.spec is not None
    spec = pod.get("spec") or {}
    app_containers = list(spec.get("containers") or [])
    gpu = pinned_gpu(pod, view.spec.gpu_discovery.label_key)
    mode = preload_mode(view.spec.preload, sidecars)
    handoff = uses_handoff_volume(view.spec.preload, mode)
    identity = preload_identity(spec, app_containers, node_cache=bool(view.spec.preload.node_cache_path))
    keys = keys_for_pod_images(pod, view)
    preload = _preload_container(
        view, keys, gpu, preloader_image, mode=mode, handoff=handoff, identity=identity, trusted_keys=trusted_keys
    )
    containers, overridden, warnings = _wired_apps(app_containers, view, handoff=handoff, sidecar=mode.sidecar)
    annotations = {INJECTED_ANNOTATION: view.name, **mode.annotations(), PRELOAD_SHARE_ANNOTATION: identity.share}
    if gpu:
        annotations[GPU_ANNOTATION] = gpu
    if overridden:
        annotations[ENV_FROM_ANNOTATION] = ",".join(overridden)
    return PodPatch(
        init_containers=[preload, *(spec.get("initContainers") or [])],
        containers=containers,
        volumes=_pod_volumes(spec, view, handoff=handoff),
        annotations=annotations,
        warnings=tuple(warnings),
    )


def _not_patched(
    pod: Mapping[str, Any], view: CacheView | None, excluded_namespaces: frozenset[str]
) -> PodPatch | None:
    """Why the webhook leaves ``pod`` alone, or None when it patches it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    namespace = str(meta.get("namespace", ""))
    if namespace in excluded_namespaces:
        return PodPatch(skipped="excluded-namespace")
    if any(c.get("name") == PRELOAD_CONTAINER for c in spec.get("initContainers") or []):
        return PodPatch(skipped="already-injected")
    cache = str((meta.get("labels") or {}).get(CACHE_LABEL, ""))
    if view is None:
        return left_alone(reasons.UNKNOWN_CACHE, f"no CompileCache {cache!r} in namespace {namespace!r}")
    if not view.ready or view.spec is None:
        return left_alone(reasons.NOT_READY, f"CompileCache {view.namespace}/{view.name} is not Ready")
    problems = unwired_containers(list(spec.get("containers") or []))
    if problems:
        return left_alone(problems[0].reason, "; ".join(p.message for p in problems))
    if not keys_for_pod_images(pod, view):
        warmed = sorted({b.image for b in view.bundles if b.image})
        return left_alone(
            reasons.IMAGE_MISMATCH,
            f"no bundle of CompileCache {view.namespace}/{view.name} was warmed with the pod's image(s) "
            f"{_listed(pod_images(pod))}; its bundles are for {_listed(warmed) or 'no image'} "
            "(warm with the image you deploy: spec.image)",
        )
    return None


def _pod_volumes(spec: Mapping[str, Any], view: CacheView, *, handoff: bool) -> list[dict[str, Any]]:
    """The pod's volumes plus the cache volume (and the hand-off volume, the store's CA) unless it has them."""
    assert view.spec is not None
    volumes = list(spec.get("volumes") or [])
    if not any(v.get("name") == CACHE_VOLUME for v in volumes):
        volumes.append(cache_volume(view))
    if handoff and not any(v.get("name") == HANDOFF_VOLUME for v in volumes):
        volumes.append({"name": HANDOFF_VOLUME, "emptyDir": {}})
    if view.spec.storage.ca and not any(v.get("name") == store_ca.STORE_CA_VOLUME for v in volumes):
        volumes.append(store_ca.ca_volume(view.spec.storage.ca))
    return volumes


def _wired_apps(
    app_containers: Sequence[Mapping[str, Any]], view: CacheView, *, handoff: bool, sidecar: bool = False
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The app containers wired to the cache; the names of those whose ``envFrom`` the wiring
    overrides, and a warning for each."""
    assert view.spec is not None
    containers: list[dict[str, Any]] = []
    overridden: list[str] = []
    warnings: list[str] = []
    for container in app_containers:
        wired, added = _with_cache(
            container,
            job_id=view.job_id,
            remote=view.spec.remote_cache,
            handoff=handoff,
            precompile=precompile_verified(view),
            bytecode=not sidecar and bytecode_ready(view),
        )
        containers.append(wired)
        warning = env_from_overrides(container, added)
        if warning:
            overridden.append(str(container.get("name", "")))
            warnings.append(f"compilecache: {warning}")
    return containers, overridden, warnings


def left_alone(reason: str, detail: str) -> PodPatch:
    """The answer for a pod the webhook does not patch: the reason and its detail as annotations,
    and a warning for the client that creates the pod."""
    return PodPatch(
        skipped=reason,
        annotations={SKIPPED_ANNOTATION: reason, SKIPPED_DETAIL_ANNOTATION: detail},
        warnings=(f"compilecache: pod starts without a preloaded cache ({reason}): {detail}",),
    )


def _listed(items: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return f"{shown} and {len(items) - limit} more" if len(items) > limit else shown


def _preload_container(
    view: CacheView,
    keys: Sequence[str],
    gpu: str | None,
    image: str,
    *,
    mode: PreloadMode,
    handoff: bool,
    identity: PreloadIdentity,
    trusted_keys: Sequence[str] = (),
) -> dict[str, Any]:
    assert view.spec is not None
    preload: PreloadSpec = view.spec.preload
    done_file = HANDOFF_DONE_FILE if handoff else DONE_FILE
    mounts = [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}]
    if handoff:
        mounts.append({"name": HANDOFF_VOLUME, "mountPath": HANDOFF_DIR})
    if view.spec.storage.ca:
        mounts.append(dict(store_ca.CA_MOUNT))
    container: dict[str, Any] = {
        "name": PRELOAD_CONTAINER,
        "image": image,
        "command": preload_command(
            view, keys, gpu, done_file=done_file, sidecar=mode.sidecar, identity=identity, trusted_keys=trusted_keys
        ),
        "env": [{"name": "TMPDIR", "value": PRELOAD_TMPDIR}, *storage_env(view.spec.storage)],
        "volumeMounts": mounts,
        "resources": _resources_dict(preload.resources),
        "terminationMessagePolicy": "File",
        "securityContext": identity.security_context(),
    }
    if mode.sidecar:
        container["restartPolicy"] = "Always"  # a native sidecar: the app starts once it has started
    return container


def done_file_seen_by(mounts: Sequence[Mapping[str, Any]]) -> str | None:
    """The done file's path as a container with ``mounts`` sees it: in the inductor directory of
    the cache volume, mounted whole or (``subPath: inductor``) at the container's own
    ``TORCHINDUCTOR_CACHE_DIR``; None when the container does not see that directory."""
    for mount in mounts:
        if mount.get("name") != CACHE_VOLUME:
            continue
        base = str(mount.get("mountPath") or "").rstrip("/")
        sub = str(mount.get("subPath") or "").strip("/")
        if not sub:
            return f"{base}/{INDUCTOR_SUBDIR}/{DONE_FILE_NAME}"
        if sub == INDUCTOR_SUBDIR:
            return f"{base}/{DONE_FILE_NAME}"
    return None


def _with_cache(
    container: Mapping[str, Any],
    *,
    job_id: str,
    remote: RemoteCacheSpec | None,
    handoff: bool,
    precompile: bool = False,
    bytecode: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """One app container with the cache directory mounted and the environment set, keeping
    whatever it already sets in ``env``, and the names of the variables added. A
    ``TORCHINDUCTOR_CACHE_DIR`` of its own decides where the cache is mounted, and so where the
    container finds the done file (``COMPILECACHE_PRELOAD_DONE``). The container is one
    :func:`wiring.unwired` accepts."""
    out = copy.deepcopy(dict(container))
    pycache = pycache_path(container) if bytecode else None
    env = list(out.get("env") or [])
    names = {e.get("name") for e in env}
    mounts = list(out.get("volumeMounts") or [])
    extra: dict[str, str] = {}
    if not any(m.get("name") == CACHE_VOLUME for m in mounts):
        point = cache_mount_point(container)
        if CACHE_DIR_ENV not in names:
            extra[CACHE_DIR_ENV] = INDUCTOR_DIR
            mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT})
        elif point is not None:
            mounts.append({"name": CACHE_VOLUME, "mountPath": point, "subPath": INDUCTOR_SUBDIR})
    if handoff and not any(m.get("name") == HANDOFF_VOLUME for m in mounts):
        mounts.append({"name": HANDOFF_VOLUME, "mountPath": HANDOFF_DIR})
    if job_id:
        extra[JOB_ID_ENV] = job_id
    done_file = HANDOFF_DONE_FILE if handoff else done_file_seen_by(mounts)
    if done_file is not None:
        extra[DONE_FILE_ENV] = done_file
    if remote is not None:
        extra.update(remote.env())
    if precompile:  # Dynamo loads the bundle's verified precompiled entries (cachelib.warmstart): no code change
        extra[PRECOMPILE_ENV] = "1"
    if pycache is not None:  # the byte code of what the warm-up imported, from an init-container preload
        extra[PYCACHE_ENV] = pycache
    added = [k for k in extra if k not in names]
    env += [{"name": k, "value": extra[k]} for k in added]
    out["env"] = env
    out["volumeMounts"] = mounts
    return out, added


def _resources_dict(resources: Resources) -> dict[str, dict[str, str]]:
    return resources.to_dict()


# -- status -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """Why the cache cannot be (fully) served: one reason for Ready and Degraded."""

    reason: str
    message: str


def warmup_conditions(
    variants: Sequence[Variant],
    bundles: Sequence[BundleRecord],
    jobs: Mapping[str, JobState],
) -> list[cond.Condition]:
    """Ready, Warming and Degraded from the plan, the bundles and the Jobs of missing variants.

    Ready is True when every planned variant has a bundle, or when some have and the rest
    failed (reason PartiallyAvailable, Degraded True): pods are served where a bundle exists.
    """
    have = {b.variant for b in bundles}
    missing = [v for v in variants if v.id not in have]
    active = [(v, jobs[v.id]) for v in missing if v.id in jobs and jobs[v.id].phase == "active"]
    failed = [(v, jobs[v.id]) for v in missing if v.id in jobs and jobs[v.id].phase == "failed"]
    served = [v for v in variants if v.id in have]
    warming = _warming_condition(active, len(variants))
    degraded = _degraded_condition(failed)
    return [_ready_condition(served, bool(missing), warming, degraded), warming, degraded]


def _warming_condition(active: Sequence[tuple[Variant, JobState]], planned: int) -> cond.Condition:
    if not active:
        return cond.Condition(cond.WARMING, False, "Idle", "no warm-up running")
    text = "; ".join(f"{v.gpu_label}: job {j.name}: {j.message}" for v, j in active)
    return cond.Condition(cond.WARMING, True, "WarmupInProgress", f"warming {len(active)} of {planned}: {text}")


def _degraded_condition(failed: Sequence[tuple[Variant, JobState]]) -> cond.Condition:
    if not failed:
        return cond.Condition(cond.DEGRADED, False, "AsExpected", "no warm-up failed")
    reasons = {j.reason for _, j in failed}
    text = "; ".join(f"{v.gpu_label}: job {j.name} failed: {j.reason}: {j.message}" for v, j in failed)
    return cond.Condition(cond.DEGRADED, True, reasons.pop() if len(reasons) == 1 else "WarmupFailed", text)


def _ready_condition(
    served: Sequence[Variant], missing: bool, warming: cond.Condition, degraded: cond.Condition
) -> cond.Condition:
    """Ready from what is served and the other two conditions (a True one means Jobs run, or failed)."""
    gpus = ", ".join(v.gpu_label for v in served)
    if not missing:
        return cond.Condition(cond.READY, True, "BundlesAvailable", f"{len(served)} bundle(s): {gpus}")
    if warming.status:
        return cond.Condition(cond.READY, False, "WarmupInProgress", warming.message)
    if degraded.status and served:
        return cond.Condition(cond.READY, True, "PartiallyAvailable", f"bundles for {gpus}; {degraded.message}")
    if degraded.status:
        return cond.Condition(cond.READY, False, "WarmupFailed", degraded.message)
    return cond.Condition(cond.READY, False, "WarmupPending", "warm-up Jobs are being created")


PRECOMPILED = "Precompiled"
"""Condition type of caches with spec.model.precompile Auto: whether the current bundles carry a verified
precompiled part."""


def precompile_condition(bundles: Sequence[BundleRecord]) -> cond.Condition | None:
    """Precompiled from the warm-up checks of the current bundles; None before any was recorded."""
    checked = [b for b in bundles if b.precompile]
    if not checked:
        return None
    left_out = [b for b in checked if b.precompile != "Verified"]
    if not left_out:
        message = f"{len(checked)} bundle(s) carry a verified precompiled part"
        return cond.Condition(PRECOMPILED, True, "Verified", message)
    text = "; ".join(f"{b.gpu}: {b.precompile_reason or 'the check failed'}" for b in left_out)
    return cond.Condition(
        PRECOMPILED, False, "PrecompileUnverified",
        f"precompiled part left out of {len(left_out)} of {len(checked)} bundle(s) (they still serve the FX-graph "
        f"cache; pods compile with Dynamo as without Auto): {text}",
    )  # fmt: skip


def precompile_verified(view: CacheView) -> bool:
    """Whether pods of ``view`` may get TORCH_CACHING_PRECOMPILE: Auto, and every current bundle's
    precompiled part passed the warm-up's check (a pod's GPU picks its bundle only at preload time)."""
    if view.spec is None or view.spec.model.precompile != PRECOMPILE_AUTO:
        return False
    current = view_current_bundles(view)
    return bool(current) and all(b.precompile == "Verified" for b in current)


def view_current_bundles(view: CacheView) -> list[BundleRecord]:
    """The bundles of ``view``'s current plan (older generations may still be kept)."""
    return [b for b in view.bundles if b.variant in view.current_variants]


def bytecode_ready(view: CacheView) -> bool:
    """Whether every current bundle of ``view`` carries a byte-code part (cachelib.bytecode): only then
    may an app's ``PYTHONPYCACHEPREFIX`` point at it, since a prefix hides the image's own byte code."""
    current = view_current_bundles(view)
    return bool(current) and all(b.bytecode_files > 0 for b in current)


def pycache_path(container: Mapping[str, Any]) -> str | None:
    """Where the preloaded byte-code tree is in ``container``: in the cache directory the webhook
    mounts; None where the container mounts the cache itself or its directory cannot be wired."""
    if any(m.get("name") == CACHE_VOLUME for m in container.get("volumeMounts") or []):
        return None
    point = cache_mount_point(container)
    if point is None:
        return None
    own = any(e.get("name") == CACHE_DIR_ENV for e in container.get("env") or [])
    return f"{point if own else INDUCTOR_DIR}/{PYCACHE_DIR}"


def failure_conditions(failure: Failure) -> list[cond.Condition]:
    return [
        cond.Condition(cond.READY, False, failure.reason, failure.message),
        cond.Condition(cond.WARMING, False, "Idle", "no warm-up running"),
        cond.Condition(cond.DEGRADED, True, failure.reason, failure.message),
    ]


def build_status(
    current: Mapping[str, Any] | None,
    *,
    generation: int,
    conditions: Sequence[cond.Condition],
    bundles: Sequence[BundleRecord] | None,
    planned_gpus: Sequence[str] | None,
    storage_url: str | None,
    now: str,
) -> dict[str, Any]:
    """The full new status; ``bundles``/``planned_gpus``/``storage_url`` None keep the current values."""
    current = current or {}
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": cond.merge_conditions(current.get("conditions"), conditions, generation=generation, now=now),
    }
    if bundles is not None:
        status["bundles"] = [b.to_status() for b in bundles]
        status["bundleCount"] = len(bundles)
    else:
        status["bundles"] = list(current.get("bundles") or [])
        status["bundleCount"] = len(status["bundles"])
    if planned_gpus is not None:
        status["plannedGPUs"] = ",".join(planned_gpus) if planned_gpus else ""
    elif "plannedGPUs" in current:
        status["plannedGPUs"] = current["plannedGPUs"]
    if storage_url is not None:
        status["storage"] = mask_url(storage_url)
    elif "storage" in current:
        status["storage"] = current["storage"]
    if "coldStarts" in current:  # tallied from pods (compilecache_operator.coldstarts), not reconciled
        status["coldStarts"] = current["coldStarts"]
    compact: dict[str, Any] = without_empty_strings(status)
    return compact


def without_empty_strings(value: Any) -> Any:
    """``value`` with every ``""`` field dropped. API servers up to 1.20 read an empty string in a
    merge patch of a custom resource as null and reject it, so status never carries one."""
    if isinstance(value, Mapping):
        return {k: without_empty_strings(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [without_empty_strings(v) for v in value]
    return value


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` changes anything (timestamps of unchanged conditions are kept by merge)."""
    return {k: (current or {}).get(k) for k in new} != dict(new)


def cache_view(body: Mapping[str, Any], defaults: Defaults, confinement: Confinement | None = None) -> CacheView:
    """The webhook's view of a CompileCache: Ready, the parsed spec, the bundles, the current plan.
    A spec outside the operator's allow-lists (``confinement``) counts as invalid: no pod gets its
    store or Secret, even before the reconcile marks it InvalidSpec."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    status = body.get("status") or {}
    try:
        spec: CacheSpec | None = parse_spec(body.get("spec"), defaults, name=name)
        if confinement is not None and spec is not None:
            check_confinement(confinement, namespace, spec)
    except InvalidSpec:
        spec = None
    bundles = tuple(bundles_from_status(status))
    current: frozenset[str] = frozenset()
    job_id = ""
    if spec is not None:
        planned = [g for g in str(status.get("plannedGPUs") or "").split(",") if g]
        current = frozenset(variant_id(namespace, name, spec, "" if g == CPU else g) for g in planned)
        job_id = next((b.job_id for b in bundles if b.variant in current and b.job_id), "") or plan_id(
            namespace, name, spec
        )
    return CacheView(
        namespace=namespace,
        name=name,
        ready=cond.is_true(status.get("conditions"), cond.READY) and spec is not None,
        spec=spec,
        bundles=bundles,
        current_variants=current,
        job_id=job_id,
    )
