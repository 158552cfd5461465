"""Whether a pod will start warm, told before it starts (pure; no Kubernetes library).

What a pod manifest shows is compared with what the CompileCache's bundles recorded of their warm-up
(``status.bundles``): each key factor that differs makes the prediction ``cold`` and is named with both values
(the warm-up's first); a factor the manifest cannot show makes it ``unknown`` with the reason; otherwise it is
``warm``. The factors, in the order a ``cold`` prediction names its ``cause``:

- ``image``: no bundle was warmed with the pod's image (references compare as written: a digest is not its tag);
- ``gpu``: the pod is pinned to a GPU type (``compilecache.io/gpu``, its node selector, or a required node
  affinity with one value) that has no bundle;
- ``env``: a variable that enters torch's keys (``TORCH*``, ``TRITON_*``, ``CUDA_*``, ... as
  :mod:`cachelib.in_image.factors` records them) whose value differs from the warm-up's, as its Job set it;
- ``job_id``: ``TORCH_COMPILE_JOB_ID`` set in the pod to another id than the warm-up's;
- ``precompile``: ``TORCH_CACHING_PRECOMPILE`` turned on in the pod where the bundle has no precompiled part;
- ``engine_argument`` (and ``env`` for hashed ``VLLM_*`` variables): a vLLM pod's start against the warm-up's
  (:func:`predict_vllm`).

``unknown``: no GPU pinned while the bundles cover only some of the planned types; a variable from ``valueFrom``
or ``envFrom``; a moving image tag (``latest`` or none); bundles recorded before their warm-up's environment was.
The code inside the image is never seen: ``warm`` means every factor the manifest shows matches.

Used by the operator's admission webhook and by ``compilecache predict`` on manifest files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachelib.in_image import vllmargs
from cachelib.in_image.factors import ENV_PER_RUN, ENV_PREFIXES
from cachelib.in_image.masking import is_secret_name
from cachelib.in_image.podcontract import JOB_ID_ENV, PRECOMPILE_ENV
from cachelib.in_image.vllm_options import HASHED_ENV
from cachelib.keyformat import CacheKey, InvalidKey, gpu_slug

WARM, COLD, UNKNOWN = "warm", "cold", "unknown"
OUTCOMES = (WARM, COLD, UNKNOWN)
IMAGE, GPU, ENV, JOB_ID, PRECOMPILE, ENGINE_ARGUMENT = "image", "gpu", "env", "job_id", "precompile", "engine_argument"
NONE = "none"
CAUSES = (NONE, IMAGE, GPU, ENV, JOB_ID, PRECOMPILE, ENGINE_ARGUMENT)
"""The bounded ``cause`` of a prediction (a metric label), in order of precedence: the first factor that
differs, for ``unknown`` the first factor that could not be compared."""
UNSET = "unset"
CPU = "cpu"
DEFAULT_GPU_LABEL_KEY = "nvidia.com/gpu.product"
GPU_ANNOTATION = "compilecache.io/gpu"
NOT_KEYED = frozenset({
    "TRITON_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_REDIS_HOST", "TORCHINDUCTOR_REDIS_PORT", "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PYTORCH_CUDA_ALLOC_CONF", PRECOMPILE_ENV,
})  # fmt: skip
"""Variables of the recorded prefixes that enter no cache key (where files go, which devices a process sees,
the allocator) or that are compared on their own (``TORCH_CACHING_PRECOMPILE``)."""
MOVING_TAGS = frozenset({"", "latest"})
MAX_VALUE = 200
MAX_RECORDED = 64
"""At most this many variables recorded per bundle (``status.bundles[].warmupEnv``)."""
DETAIL_LIMIT = 6
ON = frozenset({"1", "true", "True", "TRUE", "yes", "on"})


# -- what a bundle recorded ----------------------------------------------------------------------------------------
def key_factor_env(name: str) -> bool:
    """Whether variable ``name`` enters torch's cache keys as :mod:`cachelib.in_image.factors` records them
    (not the per-run
    ones, the remote-cache switches the webhook sets as the warm-up had them, nor :data:`NOT_KEYED`)."""
    return (name.startswith(ENV_PREFIXES) and name not in ENV_PER_RUN and name not in NOT_KEYED
            and not name.endswith("_REMOTE_CACHE"))  # fmt: skip


def recorded_value(name: str, value: str) -> str:
    """A value as a bundle's record keeps it: a digest for a variable whose name says secret, or a long one."""
    if is_secret_name(name) or len(value) > MAX_VALUE:
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]
    return value


def recorded_env(entries: Iterable[Mapping[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The key-factor variables of a container's ``env`` entries as a bundle records them: values (digested where
    :func:`recorded_value` says), and the names of those taken from ``valueFrom``; the last entry of a name wins."""
    values: dict[str, str] = {}
    elsewhere: dict[str, None] = {}
    for entry in entries:
        name = str(entry.get("name", ""))
        if not key_factor_env(name):
            continue
        if "valueFrom" in entry:
            elsewhere[name] = None
            values.pop(name, None)
        else:
            elsewhere.pop(name, None)
            values[name] = recorded_value(name, str(entry.get("value", "")))
    kept = sorted(values)[:MAX_RECORDED]
    return {k: values[k] for k in kept}, sorted(elsewhere)[:MAX_RECORDED]


@dataclass(frozen=True)
class Warmed:
    """One bundle a pod may get, as ``status.bundles`` records its warm-up."""

    image: str
    gpu: str = CPU
    """The GPU the warm-up compiled on (the key's GPU segment), ``cpu`` without one."""
    variant: str = ""
    generation: int = 0
    job_id: str = ""
    precompile: str = ""
    """``Verified``: the bundle has a precompiled part; ``LeftOut`` or empty: it has none."""
    env: Mapping[str, str] | None = None
    """The warm-up's key-factor variables (:func:`recorded_env`); None: recorded before these were."""
    env_elsewhere: tuple[str, ...] = ()

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> Warmed:
        try:
            gpu = CacheKey.parse(str(entry.get("key", ""))).gpu
        except InvalidKey:
            label = str(entry.get("gpu") or CPU)
            gpu = CPU if label == CPU else gpu_slug(label)
        recorded = entry.get("warmupEnv")
        env: dict[str, str] | None = None
        elsewhere: tuple[str, ...] = ()
        if isinstance(recorded, Mapping):
            values = recorded.get("values")
            env = {str(k): str(v) for k, v in values.items()} if isinstance(values, Mapping) else {}
            named = recorded.get("fromElsewhere")
            elsewhere = tuple(str(n) for n in named) if isinstance(named, list) else ()
        return cls(
            image=str(entry.get("image", "")),
            gpu=gpu,
            variant=str(entry.get("variant", "")),
            generation=int(entry.get("generation") or 0),
            job_id=str(entry.get("jobId", "")),
            precompile=str(entry.get("precompile", "")),
            env=env,
            env_elsewhere=elsewhere,
        )


@dataclass(frozen=True)
class Cache:
    """What the prediction knows of a CompileCache: its kept bundles, the current ones among them, its plan."""

    name: str
    """``namespace/name``, for messages."""
    bundles: tuple[Warmed, ...]
    current: frozenset[str] = frozenset()
    """Variants of the current plan; empty: every kept bundle counts as current."""
    planned_gpus: tuple[str, ...] = ()
    """The GPU types the plan warms (slugs), ``cpu`` for a CPU cache."""
    gpu_label_key: str = DEFAULT_GPU_LABEL_KEY


# -- what the pod shows ------------------------------------------------------------------------------------------
def container_env(container: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The container's variables with a value in the spec, and the names of those it takes from elsewhere
    (``valueFrom``; ``envFrom`` sources, whose names are not known at admission)."""
    values: dict[str, str] = {}
    elsewhere: list[str] = []
    for entry in container.get("env") or []:
        name = str(entry.get("name", ""))
        if "valueFrom" in entry:
            elsewhere.append(name)
            values.pop(name, None)
        else:
            values[name] = str(entry.get("value", ""))
    for source in container.get("envFrom") or []:
        kind = "configMap" if "configMapRef" in source else "secret" if "secretRef" in source else "source"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        elsewhere.append(f"envFrom {kind} {ref.get('name', '')}".strip())
    return values, elsewhere


def pod_images(pod: Mapping[str, Any]) -> list[str]:
    """The images of the pod's app containers, in order, once each."""
    return list(dict.fromkeys(str(c.get("image")) for c in (pod.get("spec") or {}).get("containers") or []))


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


def image_tag(image: str) -> str | None:
    """The tag of an image reference; None for one by digest (``@sha256:...``)."""
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def image_repository(image: str) -> str:
    """The repository of an image reference, without tag and digest."""
    bare = image.split("@", 1)[0]
    head, _, last = bare.rpartition("/")
    return (head + "/" if head else "") + last.split(":", 1)[0]


# -- the prediction --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Factor:
    """A key factor whose value differs between the warm-up and the pod."""

    kind: str
    """One of :data:`CAUSES` (never ``none``)."""
    name: str
    warmup: str
    pod: str
    container: str = ""
    """The app container it was seen in, where the pod has several."""

    def text(self) -> str:
        where = f" (container {self.container!r})" if self.container else ""
        if self.kind == ENGINE_ARGUMENT:
            return f"{self.name} {self.warmup} → {self.pod}{where}"
        if self.kind in (ENV, JOB_ID, PRECOMPILE):
            return f"env {self.name}: {self.warmup} → {self.pod}{where}"
        return f"{self.name} {self.warmup} → {self.pod}{where}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "factor": self.name, "warmup": self.warmup, "pod": self.pod,
                **({"container": self.container} if self.container else {})}  # fmt: skip


@dataclass(frozen=True)
class Unknown:
    """A key factor the manifest cannot show, and why."""

    kind: str
    reason: str


@dataclass(frozen=True)
class Prediction:
    """A pod's start against its cache's warm-up, told before it starts."""

    differences: tuple[Factor, ...] = ()
    unknown: tuple[Unknown, ...] = ()
    compared: tuple[str, ...] = ()
    """The factors compared, as said in a warm prediction's detail (``image``, ``gpu NVIDIA-L4``, ``env X``)."""

    @property
    def outcome(self) -> str:
        return COLD if self.differences else UNKNOWN if self.unknown else WARM

    @property
    def cause(self) -> str:
        kinds = [d.kind for d in self.differences] or [u.kind for u in self.unknown]
        return min(kinds, key=CAUSES.index) if kinds else NONE

    def detail(self) -> str:
        """One line: the differences (``--max-model-len 8192 → 4096; env X: unset → 1``) and what was not compared,
        or what was compared when every factor matches."""
        if self.differences:
            texts = [d.text() for d in self.differences[:DETAIL_LIMIT]]
            if len(self.differences) > DETAIL_LIMIT:
                texts.append(f"and {len(self.differences) - DETAIL_LIMIT} more")
            said = "; ".join(texts)
        elif self.unknown:
            said = "cannot be told before the pod starts"
        else:
            said = "every key factor matches the warm-up" + (f" ({', '.join(self.compared)})" if self.compared else "")
        return said + (f" (not compared: {', '.join(u.reason for u in self.unknown)})" if self.unknown else "")

    def warning(self) -> str | None:
        """The admission warning of a cold prediction (the text ``Deny`` refuses with); None otherwise."""
        return f"compilecache: this pod will compile: {self.detail()}" if self.differences else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prediction": self.outcome,
            "cause": self.cause,
            "detail": self.detail(),
            "differences": [d.to_dict() for d in self.differences],
            "unknown": [{"kind": u.kind, "reason": u.reason} for u in self.unknown],
            "compared": list(self.compared),
        }


@dataclass
class _Found:
    differences: dict[tuple[str, str, str], Factor] = field(default_factory=dict)
    unknown: dict[str, Unknown] = field(default_factory=dict)
    compared: dict[str, None] = field(default_factory=dict)

    def differ(self, factor: Factor) -> None:
        self.differences.setdefault((factor.kind, factor.name, factor.container), factor)

    def cannot(self, kind: str, reason: str) -> None:
        self.unknown.setdefault(reason, Unknown(kind, reason))

    def prediction(self) -> Prediction:
        ordered = sorted(self.differences.values(), key=lambda d: CAUSES.index(d.kind))
        unknown = sorted(self.unknown.values(), key=lambda u: CAUSES.index(u.kind))
        return Prediction(tuple(ordered), tuple(unknown), tuple(self.compared))


def predict(pod: Mapping[str, Any], cache: Cache, vllm: Sequence[VllmPrediction] = ()) -> Prediction:
    """The prediction for ``pod`` (a Pod manifest; its app containers) against ``cache``'s bundles; ``vllm``: the
    vLLM start predictions of its containers (:func:`predict_vllm`), for a vLLM cache."""
    found = _Found()
    images = pod_images(pod)
    warmed = [b for b in cache.bundles if b.image in images]
    found.compared[IMAGE] = None
    if not warmed:
        _image_differs(found, images, cache)
        return found.prediction()
    current = [b for b in warmed if not cache.current or b.variant in cache.current] or warmed
    _moving_tags(found, images, warmed)
    reference = _gpu(found, pod, cache, current)
    _containers(found, pod, images, reference)
    _vllm_starts(found, vllm)
    return found.prediction()


def _moving_tags(found: _Found, images: Sequence[str], warmed: Sequence[Warmed]) -> None:
    for image in images:
        if image in {b.image for b in warmed} and image_tag(image) in MOVING_TAGS:
            found.cannot(IMAGE, f"image {image} is a moving tag: its code may have changed since the warm-up")


def _containers(found: _Found, pod: Mapping[str, Any], images: Sequence[str], reference: Sequence[Warmed]) -> None:
    """Compare the environment of each app container that runs a warmed image with the bundles' warm-ups."""
    every = (pod.get("spec") or {}).get("containers") or []
    several = len(every) > 1
    for container in every:
        if container.get("image") not in images or container.get("image") not in {b.image for b in reference}:
            continue
        name = str(container.get("name", "")) if several else ""
        values, elsewhere = container_env(container)
        _env(found, values, elsewhere, reference, name)
        _job_id(found, values, elsewhere, reference, name)
        _precompile(found, values, reference, name)


def _vllm_starts(found: _Found, vllm: Sequence[VllmPrediction]) -> None:
    for start in vllm:
        for d in start.differences:
            kind = ENV if d.kind == "env" else ENGINE_ARGUMENT
            found.differ(Factor(kind, d.factor, d.before, d.after, start.container if len(vllm) > 1 else ""))
        for reason in start.unknown:
            found.cannot(ENV, reason)
        found.compared["vLLM start"] = None


def _image_differs(found: _Found, images: Sequence[str], cache: Cache) -> None:
    warmed = sorted({b.image for b in cache.bundles if b.image})
    said = ", ".join(warmed) or "no bundle"
    for image in images:
        same_repository = [w for w in warmed if image_repository(w) == image_repository(image)]
        hint = " (the same repository: a digest and a tag are different references)" if same_repository and (
            image_tag(image) is None or any(image_tag(w) is None for w in same_repository)) else ""
        found.differ(Factor(IMAGE, "image", said, image + hint))


def _gpu(found: _Found, pod: Mapping[str, Any], cache: Cache, current: Sequence[Warmed]) -> list[Warmed]:
    """Compare the GPU the pod is pinned to; the bundles it would get (every current one when not pinned)."""
    gpus = sorted({b.gpu for b in current})
    pinned = pinned_gpu(pod, cache.gpu_label_key)
    if pinned is not None:
        slug = gpu_slug(pinned)
        found.compared[f"gpu {slug}"] = None
        mine = [b for b in current if b.gpu == slug]
        if not mine:
            found.differ(Factor(GPU, "gpu", ", ".join(gpus), slug))
            return list(current)
        return mine
    uncovered = sorted(set(cache.planned_gpus) - set(gpus) - {CPU})
    if uncovered:
        found.cannot(GPU, f"no GPU pinned, and bundles for {', '.join(gpus)} only (none yet for "
                          f"{', '.join(uncovered)})")  # fmt: skip
    return list(current)


def _env(found: _Found, values: Mapping[str, str], elsewhere: Sequence[str], reference: Sequence[Warmed],
         container: str) -> None:  # fmt: skip
    for name in elsewhere:
        if name.startswith("envFrom"):
            found.cannot(ENV, f"{name} (its variables are not known at admission)")
        elif key_factor_env(name) or name in (JOB_ID_ENV, PRECOMPILE_ENV):
            found.cannot(ENV, f"{name} from valueFrom")
    mine = {k: recorded_value(k, v) for k, v in values.items() if key_factor_env(k)}
    for bundle in reference:
        if bundle.env is None:
            found.cannot(ENV, "the bundles' records predate the warm-up's environment (warm again to compare)")
            continue
        for name in bundle.env_elsewhere:
            found.cannot(ENV, f"the warm-up's {name} from valueFrom")
        for name in sorted(set(bundle.env) | set(mine)):
            if name in elsewhere or name in bundle.env_elsewhere:
                continue
            found.compared[f"env {name}"] = None
            before, after = bundle.env.get(name, UNSET), mine.get(name, UNSET)
            if before != after:
                found.differ(Factor(ENV, name, before, after, container))
    if reference and all(b.env is not None for b in reference) and not mine:
        found.compared["env"] = None


def _job_id(found: _Found, values: Mapping[str, str], elsewhere: Sequence[str], reference: Sequence[Warmed],
            container: str) -> None:  # fmt: skip
    ids = sorted({b.job_id for b in reference if b.job_id})
    if JOB_ID_ENV in values and ids and JOB_ID_ENV not in elsewhere:
        found.compared["job id"] = None
        if values[JOB_ID_ENV] not in ids:
            found.differ(Factor(JOB_ID, JOB_ID_ENV, ", ".join(ids), values[JOB_ID_ENV], container))


def _precompile(found: _Found, values: Mapping[str, str], reference: Sequence[Warmed], container: str) -> None:
    if values.get(PRECOMPILE_ENV) not in ON:
        return
    found.compared["precompile"] = None
    if not any(b.precompile == "Verified" for b in reference):
        states = sorted({b.precompile or "Off" for b in reference})
        found.differ(Factor(PRECOMPILE, PRECOMPILE_ENV, f"{UNSET} (no precompiled part: precompile "
                            f"{', '.join(states)})", values[PRECOMPILE_ENV], container))  # fmt: skip


# -- vLLM -------------------------------------------------------------------------------------------------------------
DEFAULT_PORT = 8000


@dataclass(frozen=True)
class VllmPrediction:
    """One app container's vLLM start against the warm-up's."""

    container: str
    differences: tuple[vllmargs.Difference, ...] = ()
    unknown: tuple[str, ...] = ()
    """Key factors whose value the pod spec does not show (``VLLM_X from valueFrom``)."""
    port: int = DEFAULT_PORT
    """Where the container's vLLM serves (``--port``): where its readiness shows."""

    @property
    def outcome(self) -> str:
        return COLD if self.differences else WARM

    def to_json(self) -> list[dict[str, str]]:
        """The differences as the pod's verdict reads them (``compilecache vllm-watch --prediction``)."""
        return [d.to_dict() for d in self.differences]


def container_argv(container: Mapping[str, Any], image_command: Sequence[str]) -> list[str]:
    """What a container runs: its ``command`` (else the image's entrypoint, taken to be ``image_command``) and
    its ``args``."""
    command = container.get("command")
    args = container.get("args")
    head = [str(w) for w in command] if isinstance(command, list) and command else list(image_command)
    return head + ([str(w) for w in args] if isinstance(args, list) else [])


def predict_vllm(
    containers: Sequence[Mapping[str, Any]], warmup_argv: Sequence[str], warmup_env: Mapping[str, str],
    command: Sequence[str],
) -> list[VllmPrediction]:  # fmt: skip
    """A prediction for each app container that starts vLLM (its image's entrypoint taken to be ``command``, the
    cache's, when it sets none) against the warm-up's start ``warmup_argv`` with ``warmup_env``; none for the
    others."""
    warmup = vllmargs.parse(list(warmup_argv), dict(warmup_env))
    if warmup is None:
        raise ValueError(f"the warm-up's command line does not start vLLM: {' '.join(warmup_argv)}")
    found = []
    for container in containers:
        values, elsewhere = container_env(container)
        pod = vllmargs.parse(container_argv(container, command), values)
        if pod is None:
            continue
        unknown = tuple(
            f"{name} from valueFrom" if not name.startswith("envFrom") else f"{name} (VLLM_* variables there)"
            for name in elsewhere if name.startswith(("VLLM_", "envFrom")) or name in HASHED_ENV
        )  # fmt: skip
        port = pod.options.get("--port", str(DEFAULT_PORT))
        found.append(VllmPrediction(
            str(container.get("name", "")), tuple(vllmargs.differences(warmup, pod)), unknown,
            int(port) if port.isdigit() else DEFAULT_PORT,
        ))  # fmt: skip
    return found


# -- a CompileCache and workloads read from manifests (``compilecache predict``) ---------------------------------------
CACHE_LABEL = "compilecache.io/cache"
DEFAULT_VLLM_COMMAND = ("vllm", "serve")
TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job"})


class ManifestError(ValueError):
    """A manifest the prediction cannot read, with what is wrong in it."""


def current_variants(bundles: Sequence[Warmed]) -> frozenset[str]:
    """The variants of the newest plan among ``bundles`` (what status shows of it outside the operator): those
    with the job id of the bundle of the highest generation; empty when no bundle has a job id."""
    if not bundles:
        return frozenset()
    newest = max(bundles, key=lambda b: b.generation)
    return frozenset(b.variant for b in bundles if newest.job_id and b.job_id == newest.job_id)


def cache_from_body(body: Mapping[str, Any]) -> Cache:
    """What the prediction knows of a CompileCache object as ``kubectl get compilecache -o json`` shows it."""
    if body.get("kind") != "CompileCache":
        raise ManifestError(f"expected a CompileCache, got kind {body.get('kind')!r}")
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    entries = status.get("bundles") or []
    if not isinstance(entries, list):
        raise ManifestError("status.bundles is not a list")
    bundles = tuple(Warmed.from_status(e) for e in entries if isinstance(e, Mapping) and e.get("key"))
    planned = [g for g in str(status.get("plannedGPUs") or "").split(",") if g]
    discovery = spec.get("gpuDiscovery") or {}
    return Cache(
        name=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        bundles=bundles,
        current=current_variants(bundles),
        planned_gpus=tuple(CPU if g == CPU else gpu_slug(g) for g in planned),
        gpu_label_key=str(discovery.get("labelKey") or DEFAULT_GPU_LABEL_KEY) if isinstance(discovery, Mapping)
        else DEFAULT_GPU_LABEL_KEY,
    )  # fmt: skip


def vllm_starts(body: Mapping[str, Any], pod: Mapping[str, Any]) -> list[VllmPrediction]:
    """For a vLLM CompileCache (``spec.model.vllm``), each app container's start against the warm-up's."""
    vllm = ((body.get("spec") or {}).get("model") or {}).get("vllm")
    if not isinstance(vllm, Mapping):
        return []
    command = tuple(str(w) for w in vllm.get("command") or DEFAULT_VLLM_COMMAND)
    argv = vllmargs.command_line(command, str(vllm.get("model", "")), [str(a) for a in vllm.get("args") or []])
    env = {str(e.get("name")): str(e.get("value", "")) for e in vllm.get("env") or [] if isinstance(e, Mapping)}
    return predict_vllm((pod.get("spec") or {}).get("containers") or [], argv, env, command)


def cache_ready(body: Mapping[str, Any]) -> bool:
    """Whether the CompileCache's Ready condition is True: only then does the webhook inject its pods."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pods_of(document: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The pods a manifest makes, each as ``kind/name`` and a Pod manifest: a Pod, the template of a Deployment,
    StatefulSet, DaemonSet, ReplicaSet or Job, a CronJob's job template, the items of a List; none for other
    kinds."""
    kind = str(document.get("kind") or "")
    meta = document.get("metadata") or {}
    name = f"{kind}/{meta.get('name', '')}"
    if kind == "List":
        return [found for item in document.get("items") or [] if isinstance(item, Mapping) for found in pods_of(item)]
    if kind == "Pod":
        return [(name, dict(document))]
    spec = document.get("spec") or {}
    if kind == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    elif kind not in TEMPLATE_KINDS:
        return []
    template = spec.get("template")
    if not isinstance(template, Mapping):
        raise ManifestError(f"{name} has no spec.template")
    pod_meta = dict(template.get("metadata") or {})
    pod_meta.setdefault("namespace", meta.get("namespace", ""))
    return [(name, {"kind": "Pod", "metadata": pod_meta, "spec": template.get("spec") or {}})]


def opted_in_cache(pod: Mapping[str, Any]) -> str | None:
    """The CompileCache a pod opts in to (its ``compilecache.io/cache`` label); None when it does not."""
    label = ((pod.get("metadata") or {}).get("labels") or {}).get(CACHE_LABEL)
    return str(label) if label else None
