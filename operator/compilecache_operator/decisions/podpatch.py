"""The webhook's pod patch (pure): what it adds to an opted-in pod — the cache volume, the preload
container first in line, the cache directory and its environment in every app container — or why it
leaves the pod alone; and the one way a patch applies to a pod.

Nothing here talks to the API server; the webhook builds the patch here from the index's
:class:`~compilecache_operator.decisions.cacheview.CacheView` and answers with it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachelib import prediction as predicted
from cachelib.in_image.bytecode import PYCACHE_DIR, PYCACHE_ENV
from cachelib.in_image.podcontract import JOB_ID_ENV
from cachelib.in_image.vllmargs import LAUNCH_MODULES
from cachelib.keyformat import gpu_slug
from cachelib.prediction import pinned_gpu, pod_images
from compilecache_operator.decisions import vllmpod
from compilecache_operator.decisions.cacheview import CacheView, bytecode_ready
from compilecache_operator.decisions.prediction import Prediction, predict_pod, predict_vllm
from compilecache_operator.model import podsecurity, preload_reasons, store_ca
from compilecache_operator.model.cache_readers import (
    CACHE_DIR_ENV,
    cache_mount_point,
    env_from_overrides,
    unwired_containers,
)
from compilecache_operator.model.names import (
    CACHE_LABEL,
    CACHE_MOUNT,
    CACHE_VOLUME,
    DONE_FILE,
    DONE_FILE_ENV,
    DONE_FILE_NAME,
    ENV_FROM_ANNOTATION,
    EXCLUDED_NAMESPACES,
    GPU_ANNOTATION,
    HANDOFF_DIR,
    HANDOFF_DONE_FILE,
    HANDOFF_VOLUME,
    INDUCTOR_DIR,
    INDUCTOR_SUBDIR,
    INJECTED_ANNOTATION,
    NODE_CACHE_FALLBACK_ANNOTATION,
    PREDICTED_ANNOTATION,
    PREDICTED_DETAIL_ANNOTATION,
    PRELOAD_CONTAINER,
    PRELOAD_MODE_ANNOTATION,
    PRELOAD_MODE_REASON_ANNOTATION,
    PRELOAD_SHARE_ANNOTATION,
    PRELOAD_TMPDIR,
    SKIPPED_ANNOTATION,
    SKIPPED_DETAIL_ANNOTATION,
)
from compilecache_operator.model.security import PreloadIdentity, preload_identity
from compilecache_operator.model.sidecars import NOT_DETECTED, SidecarSupport
from compilecache_operator.model.spec import DENY, INIT_CONTAINER, SIDECAR, PreloadSpec, RemoteCacheSpec
from compilecache_operator.model.store_access import storage_env


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
    predictions: tuple[Prediction, ...] = ()
    """For a vLLM cache: each vLLM container's start against the warm-up's."""
    prediction: predicted.Prediction | None = None
    """Whether the pod will start warm (counted by the webhook); None where nothing was predicted."""
    refusal: str | None = None
    """With ``spec.preload.onPredictedCold: Deny``: why the pod is refused (its cold prediction's warning)."""

    def pod_fields(self) -> dict[str, Any]:
        """The patch as a JSON merge patch of the pod (RFC 7386): the ``spec`` fields it sets whole and
        the ``metadata.annotations`` it adds; empty when it changes nothing."""
        spec = {
            name: value
            for name, value in (
                ("initContainers", self.init_containers), ("containers", self.containers), ("volumes", self.volumes)
            )
            if value is not None
        }
        fields: dict[str, Any] = {"spec": spec} if spec else {}
        if self.annotations:
            fields["metadata"] = {"annotations": dict(self.annotations)}
        return fields

    @property
    def changes(self) -> bool:
        return bool(self.pod_fields())


def patched_pod(pod: Mapping[str, Any], patch: PodPatch) -> dict[str, Any]:
    """The pod as the API server holds it after ``patch``: its fields merged in (lists replaced whole,
    annotations added to the pod's own); ``pod`` itself is left as it is."""
    merged: dict[str, Any] = _merged(copy.deepcopy(dict(pod)), copy.deepcopy(patch.pod_fields()))
    return merged


def _merged(target: Any, patch: Any) -> Any:
    """``patch`` merged into ``target`` after RFC 7386 (a patch without nulls: nothing is removed)."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        out[key] = _merged(out.get(key), value)
    return out


def build_pod_patch(
    pod: Mapping[str, Any],
    view: CacheView | None,
    *,
    preloader_image: str,
    excluded_namespaces: frozenset[str] = EXCLUDED_NAMESPACES,
    sidecars: SidecarSupport = NOT_DETECTED,
    trusted_keys: Sequence[str] = (),
    pod_security: str = podsecurity.PRIVILEGED,
) -> PodPatch:
    """What the webhook adds to an opted-in pod: the cache volume, the preload container first
    in line (an init container, or a native sidecar where the cache asks for one and ``sidecars``
    says the cluster has them), and in every app container the cache directory, the done file's
    path (plus job id and remote-cache settings). Idempotent: a pod that already has the preload
    container gets nothing.

    A pod whose app would not read the preload is left alone, annotated with the reason (see
    :mod:`compilecache_operator.model.preload_reasons`): its cache is unknown or not Ready, an app container
    cannot be wired (:mod:`compilecache_operator.model.cache_readers`), or no bundle was warmed with the pod's
    images (``image-mismatch``).

    A node cache the namespace's Pod Security level (``pod_security``) would refuse is left out: the pod
    preloads into its own ``emptyDir``, annotated and warned (:mod:`compilecache_operator.model.podsecurity`)."""
    refused = _not_patched(pod, view, excluded_namespaces)
    if refused is not None:
        return with_prediction(refused, view, pod=pod) if refused.skipped == preload_reasons.IMAGE_MISMATCH else refused
    assert view is not None and view.spec is not None
    indexed = view  # the index's own view, whose prediction input is made once
    fallback = podsecurity.node_cache_fallback(pod_security) if view.spec.preload.node_cache_path else None
    if fallback is not None:
        view = without_node_cache(view)
    assert view.spec is not None
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
    vllm = view.spec.model.vllm
    predictions = tuple(predict_vllm(app_containers, vllm)) if vllm is not None else ()
    watch = vllmpod.watched(predictions)
    sidecars_added = []
    prediction = predict_pod(pod, indexed, predictions)
    if vllm is not None and watch is None:
        prediction = dataclasses.replace(prediction, unknown=(
            *prediction.unknown, predicted.Unknown(predicted.ENGINE_ARGUMENT, "no container starts vLLM's server")))
        launchers = f"{' '.join(vllm.command)}, or python -m {LAUNCH_MODULES[0]}; through sh -c too"
        warnings.append(f"compilecache: no container of this pod starts vLLM's server as CompileCache {view.name} "
                        f"does ({launchers}): whether it starts warm cannot be told before it starts, nor "
                        "afterwards")  # fmt: skip
    if watch is not None and sidecars.available:
        resources = view.spec.preload.resources.to_dict()
        sidecars_added.append(vllmpod.watch_container(watch, preloader_image, resources,
                                                      identity.security_context()))  # fmt: skip
    if fallback is not None:
        annotations[NODE_CACHE_FALLBACK_ANNOTATION] = fallback
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        warnings.append(podsecurity.fallback_warning(namespace, pod_security, f"{view.namespace}/{view.name}"))
    return with_prediction(PodPatch(
        init_containers=[preload, *sidecars_added, *(spec.get("initContainers") or [])],
        containers=containers,
        volumes=_pod_volumes(spec, view, handoff=handoff),
        annotations=annotations,
        warnings=tuple(warnings),
        predictions=predictions,
    ), view, prediction)  # fmt: skip


def with_prediction(
    patch: PodPatch, view: CacheView | None, prediction: predicted.Prediction | None = None, *,
    pod: Mapping[str, Any] | None = None,
) -> PodPatch:  # fmt: skip
    """``patch`` with the pod's prediction (``prediction``, else made from ``pod`` and ``view``): its annotations,
    the warning of a cold one, and the refusal where the cache denies pods predicted cold."""
    assert view is not None and view.spec is not None
    if prediction is None:
        assert pod is not None
        prediction = predict_pod(pod, view)
    annotations = {**patch.annotations, PREDICTED_ANNOTATION: prediction.outcome,
                   PREDICTED_DETAIL_ANNOTATION: prediction.detail()[:1000]}  # fmt: skip
    warning = prediction.warning()
    if patch.skipped and warning is not None:  # its skip warning says it already, with the bundles' images
        warning = patch.warnings[0] if patch.warnings else warning
    warnings = (*patch.warnings, warning) if warning is not None and warning not in patch.warnings else patch.warnings
    refusal = warning if warning is not None and view.spec.preload.on_predicted_cold == DENY else None
    return dataclasses.replace(patch, annotations=annotations, warnings=warnings, prediction=prediction,
                               refusal=refusal)  # fmt: skip


def without_node_cache(view: CacheView) -> CacheView:
    """``view`` as if its cache had no node cache: the pod's own ``emptyDir``, a "restricted" preload."""
    assert view.spec is not None
    preload = dataclasses.replace(view.spec.preload, node_cache_path=None)
    return dataclasses.replace(view, spec=dataclasses.replace(view.spec, preload=preload))


def _not_patched(
    pod: Mapping[str, Any], view: CacheView | None, excluded_namespaces: frozenset[str]
) -> PodPatch | None:
    """Why the webhook leaves ``pod`` alone, or None when it patches it."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    if namespace in excluded_namespaces:
        return PodPatch(skipped="excluded-namespace")
    if any(c.get("name") == PRELOAD_CONTAINER for c in (pod.get("spec") or {}).get("initContainers") or []):
        return PodPatch(skipped="already-injected")
    cache = str((meta.get("labels") or {}).get(CACHE_LABEL, ""))
    if view is None:
        return left_alone(preload_reasons.UNKNOWN_CACHE, f"no CompileCache {cache!r} in namespace {namespace!r}")
    if not view.ready or view.spec is None:
        return left_alone(preload_reasons.NOT_READY, f"CompileCache {view.namespace}/{view.name} is not Ready")
    return _unwired(pod, view) or _image_mismatch(pod, view)


def _unwired(pod: Mapping[str, Any], view: CacheView) -> PodPatch | None:
    """Containers whose cache directories the webhook cannot point at the preloaded tree."""
    assert view.spec is not None
    containers = list((pod.get("spec") or {}).get("containers") or [])
    problems = unwired_containers(containers)
    if view.spec.model.vllm is not None:
        problems += [u for c in containers if (u := vllmpod.unwired_root(c)) is not None]
    if problems:
        return left_alone(problems[0].reason, "; ".join(p.message for p in problems))
    return None


def _image_mismatch(pod: Mapping[str, Any], view: CacheView) -> PodPatch | None:
    if keys_for_pod_images(pod, view):
        return None
    warmed = sorted({b.image for b in view.bundles if b.image})
    return left_alone(
        preload_reasons.IMAGE_MISMATCH,
        f"no bundle of CompileCache {view.namespace}/{view.name} was warmed with the pod's image(s) "
        f"{_listed(pod_images(pod))}; its bundles are for {_listed(warmed) or 'no image'} "
        "(warm with the image you deploy: spec.image)",
    )


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
        "resources": preload.resources.to_dict(),
        "terminationMessagePolicy": "File",
        "securityContext": identity.security_context(),
    }
    if mode.sidecar:
        container["restartPolicy"] = "Always"  # a native sidecar: the app starts once it has started
    return container


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
            bytecode=not sidecar and bytecode_ready(view),
            vllm=view.spec.model.vllm is not None,
        )
        containers.append(wired)
        warning = env_from_overrides(container, added)
        if warning:
            overridden.append(str(container.get("name", "")))
            warnings.append(f"compilecache: {warning}")
    return containers, overridden, warnings


def _with_cache(
    container: Mapping[str, Any],
    *,
    job_id: str,
    remote: RemoteCacheSpec | None,
    handoff: bool,
    bytecode: bool = False,
    vllm: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """One app container with the cache directory mounted and the environment set, keeping
    whatever it already sets in ``env``, and the names of the variables added. A
    ``TORCHINDUCTOR_CACHE_DIR`` of its own decides where the cache is mounted, and so where the
    container finds the done file (``COMPILECACHE_PRELOAD_DONE``). The container is one
    :func:`wiring.unwired` accepts."""
    out = copy.deepcopy(dict(container))
    env = list(out.get("env") or [])
    names = {e.get("name") for e in env}
    mounts = list(out.get("volumeMounts") or [])
    extra = _mount_cache(container, mounts, names, handoff)
    extra.update(_cache_variables(container, mounts, job_id=job_id, remote=remote, handoff=handoff,
                                  bytecode=bytecode))  # fmt: skip
    added = [k for k in extra if k not in names]
    env += [{"name": k, "value": extra[k]} for k in added]
    if vllm:  # vLLM's cache root in the bundle (compilecache_operator.decisions.vllmpod)
        added += vllmpod.with_root(container, env, mounts)
    out["env"] = env
    out["volumeMounts"] = mounts
    return out, added


def _mount_cache(
    container: Mapping[str, Any], mounts: list[dict[str, Any]], names: set[Any], handoff: bool
) -> dict[str, str]:
    """Mount the cache volume (where the container's own ``TORCHINDUCTOR_CACHE_DIR`` says, else at the
    default with the variable set) and the hand-off volume into ``mounts``; the variables that takes."""
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
    return extra


def _cache_variables(
    container: Mapping[str, Any], mounts: Sequence[Mapping[str, Any]], *, job_id: str,
    remote: RemoteCacheSpec | None, handoff: bool, bytecode: bool,
) -> dict[str, str]:  # fmt: skip
    """The job id, the done file, the remote cache's variables and the byte-code prefix the container gets."""
    extra: dict[str, str] = {}
    if job_id:
        extra[JOB_ID_ENV] = job_id
    done_file = HANDOFF_DONE_FILE if handoff else done_file_seen_by(mounts)
    if done_file is not None:
        extra[DONE_FILE_ENV] = done_file
    if remote is not None:
        extra.update(remote.env())
    pycache = pycache_path(container) if bytecode else None
    if pycache is not None:  # the byte code of what the warm-up imported, from an init-container preload
        extra[PYCACHE_ENV] = pycache
    return extra


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
