"""Pure builders: the warm-up Job, the pod patch of the webhook, the CompileCache status.

Nothing here talks to the API server; the handlers call these and send the results.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compilecache_operator import conditions as cond
from compilecache_operator.names import (
    API_VERSION,
    CACHE_MOUNT,
    CACHE_VOLUME,
    DONE_FILE,
    DONE_FILE_ENV,
    DONE_FILE_NAME,
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
    SKIPPED_ANNOTATION,
    VARIANT_LABEL,
    WARMUP_LABEL,
    WORK_DIR,
    WORK_VOLUME,
)
from compilecache_operator.plan import CPU, BundleRecord, Variant, bundles_from_status, plan_id, variant_id
from compilecache_operator.results import COMPILE_CONTAINER, HARNESS_CONTAINER, PUBLISH_CONTAINER, JobState
from compilecache_operator.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.spec import (
    INIT_CONTAINER,
    SIDECAR,
    CacheSpec,
    Defaults,
    InvalidSpec,
    PreloadSpec,
    RemoteCacheSpec,
    Resources,
    StorageSpec,
    parse_spec,
)

from cachelib.keys import gpu_slug
from cachelib.stores.urls import mask_url

HARNESS_FILE = f"{HARNESS_DIR}/harness.py"
# Copies cachelib's harness module, and the built-in targets it loads from beside itself, out of the
# preloader image without importing them (they need torch).
COPY_HARNESS = (
    "import importlib.util, os, shutil, sys; "
    "[shutil.copyfile(importlib.util.find_spec('cachelib.' + m).origin, "
    "os.path.join(os.path.dirname(sys.argv[1]), m + '.py')) for m in ('harness', 'targets')]"
)
DEFAULT_PRELOAD_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}}


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
    args += model.compile.harness_args()
    if model.backward:
        args.append("--backward")
    return args


def build_job(
    owner: Mapping[str, Any],
    spec: CacheSpec,
    variant: Variant,
    *,
    name: str,
    job_id: str,
    settings: JobSettings,
) -> dict[str, Any]:
    """The warm-up Job of one variant.

    Containers run in this order: ``harness`` (init, preloader image) copies harness.py into a
    shared volume; ``compile`` (init, the user's image) compiles into ``/work/out``; ``publish``
    (the one main container, preloader image) packs, verifies and publishes the bundle and
    reports it in its termination message. Init containers run one after another and all before
    the main container, which is what puts publish strictly after compile.
    """
    meta = owner.get("metadata") or {}
    namespace = str(meta.get("namespace"))
    cache_name = str(meta.get("name"))
    generation = int(meta.get("generation") or 1)
    warm = spec.warmup
    labels = warmup_labels(cache_name, variant, generation)

    compile_env = [{"name": "TORCH_COMPILE_JOB_ID", "value": job_id}]
    if variant.gpu:
        compile_env.append({"name": "COMPILECACHE_GPU", "value": variant.gpu})
    if spec.remote_cache is not None:
        compile_env += [{"name": k, "value": v} for k, v in spec.remote_cache.env().items()]
    compile_env += [{"name": k, "value": v} for k, v in warm.env]

    resources = _resources_dict(warm.resources)
    if variant.gpu and warm.gpus_per_job > 0:
        limits = resources.setdefault("limits", {})
        limits.setdefault(warm.gpu_resource_name, str(warm.gpus_per_job))

    compile_container: dict[str, Any] = {
        "name": COMPILE_CONTAINER,
        "image": spec.image,
        "command": harness_command(namespace, cache_name, spec),
        "env": compile_env,
        "volumeMounts": [
            {"name": HARNESS_VOLUME, "mountPath": HARNESS_DIR, "readOnly": True},
            {"name": WORK_VOLUME, "mountPath": WORK_DIR},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if resources:
        compile_container["resources"] = resources
    if spec.image_pull_policy:
        compile_container["imagePullPolicy"] = spec.image_pull_policy

    node_selector = dict(warm.node_selector)
    if variant.gpu:
        node_selector[spec.gpu_discovery.label_key] = variant.gpu

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "volumes": [{"name": HARNESS_VOLUME, "emptyDir": {}}, {"name": WORK_VOLUME, "emptyDir": {}}],
        "initContainers": [
            {
                "name": HARNESS_CONTAINER,
                "image": settings.preloader_image,
                "command": ["python", "-c", COPY_HARNESS, HARNESS_FILE],
                "volumeMounts": [{"name": HARNESS_VOLUME, "mountPath": HARNESS_DIR}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            },
            compile_container,
        ],
        "containers": [
            {
                "name": PUBLISH_CONTAINER,
                "image": settings.preloader_image,
                "command": ["compilecache", "publish", OUT_DIR, "--store", spec.storage.url],
                "env": storage_env(spec.storage),
                "volumeMounts": [{"name": WORK_VOLUME, "mountPath": WORK_DIR}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
        ],
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if warm.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in warm.tolerations]
    if warm.service_account_name:
        pod_spec["serviceAccountName"] = warm.service_account_name
    pull_secrets = list(dict.fromkeys([*settings.image_pull_secrets, *warm.image_pull_secrets]))
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]

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
    """The webhook's answer: new values for some pod fields, or a reason to leave the pod alone."""

    skipped: str | None = None
    init_containers: list[dict[str, Any]] | None = None
    containers: list[dict[str, Any]] | None = None
    volumes: list[dict[str, Any]] | None = None
    annotations: dict[str, str] = field(default_factory=dict)

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


def select_keys(pod: Mapping[str, Any], view: CacheView) -> list[str]:
    """Bundle keys to preload: those warmed with one of the pod's images, else the current plan's."""
    images = {c.get("image") for c in (pod.get("spec") or {}).get("containers") or []}
    by_image = [b for b in view.bundles if b.image in images]
    chosen = by_image or [b for b in view.bundles if b.variant in view.current_variants] or list(view.bundles)
    return sorted({b.key for b in chosen})


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
    view: CacheView, keys: Sequence[str], gpu: str | None, *, done_file: str, sidecar: bool
) -> list[str]:
    assert view.spec is not None
    preload = view.spec.preload
    command = ["compilecache", "preload", "--store", view.spec.storage.url]
    if keys:
        for key in keys:
            command += ["--key", key]
    else:
        command += ["--cache", f"{view.namespace}/{view.name}"]
    command += ["--target", INDUCTOR_DIR, "--done-file", done_file]
    if sidecar:
        command.append("--sidecar")
    if gpu:
        command += ["--gpu", gpu_slug(gpu)]
    if preload.strict and not sidecar:
        command.append("--strict")
    if preload.max_bytes is not None:
        command += ["--max-bytes", str(preload.max_bytes)]
    return command


def cache_volume(view: CacheView) -> dict[str, Any]:
    assert view.spec is not None
    path = view.spec.preload.node_cache_path
    if path:
        return {
            "name": CACHE_VOLUME,
            "hostPath": {"path": f"{path.rstrip('/')}/{view.namespace}/{view.name}", "type": "DirectoryOrCreate"},
        }
    return {"name": CACHE_VOLUME, "emptyDir": {}}


def build_pod_patch(
    pod: Mapping[str, Any],
    view: CacheView | None,
    *,
    preloader_image: str,
    excluded_namespaces: frozenset[str] = EXCLUDED_NAMESPACES,
    sidecars: SidecarSupport = NOT_DETECTED,
) -> PodPatch:
    """What the webhook adds to an opted-in pod: the cache volume, the preload container first
    in line (an init container, or a native sidecar where the cache asks for one and ``sidecars``
    says the cluster has them), and in every app container the cache directory, the done file's
    path (plus job id and remote-cache settings). Idempotent: a pod that already has the preload
    container gets nothing."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if meta.get("namespace") in excluded_namespaces:
        return PodPatch(skipped="excluded-namespace")
    init_containers = list(spec.get("initContainers") or [])
    if any(c.get("name") == PRELOAD_CONTAINER for c in init_containers):
        return PodPatch(skipped="already-injected")
    if view is None:
        return PodPatch(skipped="unknown-cache", annotations={SKIPPED_ANNOTATION: "unknown-cache"})
    if not view.ready or view.spec is None:
        return PodPatch(skipped="not-ready", annotations={SKIPPED_ANNOTATION: "not-ready"})

    gpu = pinned_gpu(pod, view.spec.gpu_discovery.label_key)
    keys = select_keys(pod, view)
    mode = preload_mode(view.spec.preload, sidecars)
    handoff = uses_handoff_volume(view.spec.preload, mode)
    preload = _preload_container(view, keys, gpu, preloader_image, mode=mode, handoff=handoff)
    volumes = list(spec.get("volumes") or [])
    if not any(v.get("name") == CACHE_VOLUME for v in volumes):
        volumes.append(cache_volume(view))
    if handoff and not any(v.get("name") == HANDOFF_VOLUME for v in volumes):
        volumes.append({"name": HANDOFF_VOLUME, "emptyDir": {}})
    containers = [
        _with_cache(c, job_id=view.job_id, remote=view.spec.remote_cache, handoff=handoff)
        for c in spec.get("containers") or []
    ]
    annotations = {INJECTED_ANNOTATION: view.name, **mode.annotations()}
    if gpu:
        annotations[GPU_ANNOTATION] = gpu
    return PodPatch(
        init_containers=[preload, *init_containers],
        containers=containers,
        volumes=volumes,
        annotations=annotations,
    )


def apply_pod_patch(pod: Mapping[str, Any], patch: PodPatch) -> dict[str, Any]:
    """The pod as it will be after ``patch`` (for tests and for computing JSON patches)."""
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    if patch.init_containers is not None:
        spec["initContainers"] = copy.deepcopy(patch.init_containers)
    if patch.containers is not None:
        spec["containers"] = copy.deepcopy(patch.containers)
    if patch.volumes is not None:
        spec["volumes"] = copy.deepcopy(patch.volumes)
    if patch.annotations:
        out.setdefault("metadata", {}).setdefault("annotations", {}).update(patch.annotations)
    return out


def _preload_container(
    view: CacheView, keys: Sequence[str], gpu: str | None, image: str, *, mode: PreloadMode, handoff: bool
) -> dict[str, Any]:
    assert view.spec is not None
    preload: PreloadSpec = view.spec.preload
    done_file = HANDOFF_DONE_FILE if handoff else DONE_FILE
    mounts = [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}]
    if handoff:
        mounts.append({"name": HANDOFF_VOLUME, "mountPath": HANDOFF_DIR})
    container: dict[str, Any] = {
        "name": PRELOAD_CONTAINER,
        "image": image,
        "command": preload_command(view, keys, gpu, done_file=done_file, sidecar=mode.sidecar),
        "volumeMounts": mounts,
        "resources": _resources_dict(preload.resources) or copy.deepcopy(DEFAULT_PRELOAD_RESOURCES),
        "terminationMessagePolicy": "File",
    }
    if mode.sidecar:
        container["restartPolicy"] = "Always"  # a native sidecar: the app starts once it has started
    env = storage_env(view.spec.storage)
    if env:
        container["env"] = env
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
    container: Mapping[str, Any], *, job_id: str, remote: RemoteCacheSpec | None, handoff: bool
) -> dict[str, Any]:
    """One app container with the cache directory mounted and the environment set, keeping
    whatever it already sets; a ``TORCHINDUCTOR_CACHE_DIR`` of its own decides where the cache is
    mounted, and so where the container finds the done file (``COMPILECACHE_PRELOAD_DONE``)."""
    out = copy.deepcopy(dict(container))
    env = list(out.get("env") or [])
    names = {e.get("name") for e in env}
    mounts = list(out.get("volumeMounts") or [])
    existing = next((e for e in env if e.get("name") == "TORCHINDUCTOR_CACHE_DIR"), None)
    if not any(m.get("name") == CACHE_VOLUME for m in mounts):
        if existing is None:
            env.append({"name": "TORCHINDUCTOR_CACHE_DIR", "value": INDUCTOR_DIR})
            mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT})
        elif existing.get("value") and not any(m.get("mountPath") == existing["value"] for m in mounts):
            mounts.append({"name": CACHE_VOLUME, "mountPath": existing["value"], "subPath": INDUCTOR_SUBDIR})
    if handoff and not any(m.get("name") == HANDOFF_VOLUME for m in mounts):
        mounts.append({"name": HANDOFF_VOLUME, "mountPath": HANDOFF_DIR})
    extra = {"TORCH_COMPILE_JOB_ID": job_id} if job_id else {}
    done_file = HANDOFF_DONE_FILE if handoff else done_file_seen_by(mounts)
    if done_file is not None:
        extra[DONE_FILE_ENV] = done_file
    if remote is not None:
        extra.update(remote.env())
    env += [{"name": k, "value": v} for k, v in extra.items() if k not in names]
    out["env"] = env
    out["volumeMounts"] = mounts
    return out


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
    gpus = ", ".join(v.gpu_label for v in served)

    warming = cond.Condition(cond.WARMING, False, "Idle", "no warm-up running")
    if active:
        text = "; ".join(f"{v.gpu_label}: job {j.name}: {j.message}" for v, j in active)
        text = f"warming {len(active)} of {len(variants)}: {text}"
        warming = cond.Condition(cond.WARMING, True, "WarmupInProgress", text)

    degraded = cond.Condition(cond.DEGRADED, False, "AsExpected", "no warm-up failed")
    if failed:
        reasons = {j.reason for _, j in failed}
        text = "; ".join(f"{v.gpu_label}: job {j.name} failed: {j.reason}: {j.message}" for v, j in failed)
        degraded = cond.Condition(cond.DEGRADED, True, reasons.pop() if len(reasons) == 1 else "WarmupFailed", text)

    if not missing:
        ready = cond.Condition(cond.READY, True, "BundlesAvailable", f"{len(served)} bundle(s): {gpus}")
    elif active:
        ready = cond.Condition(cond.READY, False, "WarmupInProgress", warming.message)
    elif failed and served:
        ready = cond.Condition(cond.READY, True, "PartiallyAvailable", f"bundles for {gpus}; {degraded.message}")
    elif failed:
        ready = cond.Condition(cond.READY, False, "WarmupFailed", degraded.message)
    else:
        ready = cond.Condition(cond.READY, False, "WarmupPending", "warm-up Jobs are being created")
    return [ready, warming, degraded]


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


def cache_view(body: Mapping[str, Any], defaults: Defaults) -> CacheView:
    """The webhook's view of a CompileCache: Ready, the parsed spec, the bundles, the current plan."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    status = body.get("status") or {}
    try:
        spec: CacheSpec | None = parse_spec(body.get("spec"), defaults)
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
