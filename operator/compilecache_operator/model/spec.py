"""The CompileCache spec as the operator holds it once checked: frozen dataclasses, their defaults and
limits, and :class:`InvalidSpec`, the error that names every bad field with its path.

:func:`compilecache_operator.model.spec_parse.parse_spec` builds these from the raw ``spec`` mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachelib.in_image.compilekey import CompileOptions, dynamic_text
from cachelib.in_image.masking import mask_text
from cachelib.in_image.vllmargs import command_line
from cachelib.stores.base import MAX_SEGMENT_LENGTH
from cachelib.stores.urls import StoreURL
from compilecache_operator.model.formats import DEFAULT_NODE_CACHE_ROOTS

DEFAULT_GPU_LABEL_KEY = "nvidia.com/gpu.product"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DELETION_POLICIES = ("Keep", "Delete")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
INIT_CONTAINER = "InitContainer"
SIDECAR = "Sidecar"
PRELOAD_MODES = (INIT_CONTAINER, SIDECAR)
WARN, DENY = "Warn", "Deny"
ON_PREDICTED_COLD = (WARN, DENY)
"""spec.preload.onPredictedCold: what the admission does with a pod predicted to start cold (always warned)."""
DEFAULT_PRELOAD_DEADLINE_SECONDS = 30
MAX_PRELOAD_DEADLINE_SECONDS = 600
DEFAULT_PRELOAD_SIZE_LIMIT = "16Gi"
DEFAULT_PRELOAD_SIZE_LIMIT_BYTES = 16 * 2**30
DEFAULT_WARMUP_ID = 65532
MAX_INDUCTOR_CONFIG = 64
MAX_ID = 2**31 - 1
MAX_ACTIVE_DEADLINE_SECONDS = 7 * 24 * 3600
"""A warm-up Job runs at most a week: a larger value is a mistake, not a plan (and past 2**63 the Job fails at once)."""
MAX_TOLERATION_SECONDS = 365 * 24 * 3600
MAX_NODE_SELECTOR = 32

MAX_NAME_LENGTH = MAX_SEGMENT_LENGTH
"""The longest CompileCache name: the name is one segment of every cache key, as it is."""


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidSpec(ValueError):
    """A spec that can never work; ``errors`` name every offending field (credentials in the
    messages masked: they end up in conditions, events and logs)."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = tuple(FieldError(e.path, mask_text(e.message)) for e in errors)
        super().__init__("; ".join(str(e) for e in self.errors))


PRECOMPILE_AUTO = "Auto"
PRECOMPILE_OFF = "Off"
PRECOMPILE = (PRECOMPILE_AUTO, PRECOMPILE_OFF)
"""spec.model.precompile: Auto carries Dynamo's precompiled entries and torch's and Triton's source keys
(cachelib.in_image.warmstart)."""


DEFAULT_VLLM_COMMAND = ("vllm", "serve")
MAX_VLLM_ARGS = 256
MAX_VLLM_ENV = 64


@dataclass(frozen=True)
class VllmSpec:
    """``spec.model.vllm``: a vLLM server, started by the warm-up as the pods start it (with dummy weights)."""

    model: str
    """The model as the pods name it (a hub id or a path): vLLM hashes this very string."""
    args: tuple[str, ...] = ()
    """The pods' engine arguments after the model (``--max-model-len 8192``)."""
    env: tuple[tuple[str, str], ...] = ()
    """The pods' ``VLLM_*`` variables (the hashed ones enter vLLM's key), name and value."""
    command: tuple[str, ...] = DEFAULT_VLLM_COMMAND
    """What starts the server: ``vllm serve`` or ``python -m vllm.entrypoints.openai.api_server``."""

    def argv(self) -> list[str]:
        """The pods' command line: ``vllm serve MODEL ARGS`` (positional model), else ``... --model MODEL ARGS``."""
        return command_line(self.command, self.model, self.args)

    def identity(self) -> dict[str, Any]:
        return {"model": self.model, "args": list(self.args), "env": dict(self.env), "command": list(self.command)}


@dataclass(frozen=True)
class ModelSpec:
    target: str | None
    command: str | None
    compile: CompileOptions = field(default_factory=CompileOptions)
    """The options the harness compiles with (``backward`` included)."""
    backward: bool = False
    """``spec.model.backward`` as written (``compile.backward`` is also true with compiled autograd)."""
    vllm: VllmSpec | None = None
    """``spec.model.vllm``: the workload is a vLLM server (then neither target nor command)."""

    @property
    def precompile(self) -> str:
        """``spec.model.precompile`` as written: Auto or Off."""
        return PRECOMPILE_AUTO if self.compile.precompile == "auto" else PRECOMPILE_OFF

    def identity(self) -> dict[str, Any]:
        """Everything about the model that changes the compiled artifacts."""
        identity: dict[str, Any] = {
            "target": self.target,
            "command": self.command,
            "mode": self.compile.mode,
            "dynamic": dynamic_text(self.compile.dynamic),
            "fullgraph": self.compile.fullgraph,
            "backend": self.compile.backend,
            "compiled_autograd": self.compile.compiled_autograd,
            "backward": self.backward,
        }
        if self.compile.inductor_config:  # only when set: the ids of caches without it stay as they were
            identity["inductor_config"] = dict(self.compile.inductor_config)
        if self.compile.precompile != "off":  # only when Auto: the ids of caches without it stay as they were
            identity["precompile"] = self.precompile
        if self.vllm is not None:  # only for vLLM: the ids of other caches stay as they were
            identity["vllm"] = self.vllm.identity()
        return identity


@dataclass(frozen=True)
class GpuDiscovery:
    auto: bool = False
    label_key: str = DEFAULT_GPU_LABEL_KEY


@dataclass(frozen=True)
class SecretKey:
    """One credential: the environment variable the store reads, from one key of the Secret."""

    env: str
    key: str
    optional: bool = False


@dataclass(frozen=True)
class StorageSpec:
    url: str
    secret_name: str | None = None
    secret_keys: tuple[SecretKey, ...] = ()
    ca: Mapping[str, Any] | None = None
    """The pod volume source of ``spec.storage.ca`` (see :mod:`compilecache_operator.model.store_ca`)."""
    store: StoreURL | None = field(default=None, compare=False, repr=False)
    """``url`` parsed, as :func:`parse_spec` checked it (None only in a StorageSpec built by hand)."""


@dataclass(frozen=True)
class Resources:
    limits: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        if self.limits:
            out["limits"] = dict(self.limits)
        if self.requests:
            out["requests"] = dict(self.requests)
        return out

    def or_else(self, default: Resources) -> Resources:
        """These requests and limits, or ``default`` when neither is set (a set section replaces the default whole)."""
        return self if self.limits or self.requests else default


DEFAULT_WARMUP_RESOURCES = Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "4", "memory": "16Gi"})
"""The compile container's, when neither ``spec.warmup.resources`` nor the operator's setting gives any."""
DEFAULT_HELPER_RESOURCES = Resources(requests={"cpu": "100m", "memory": "128Mi"}, limits={"cpu": "1", "memory": "1Gi"})
"""The warm-up's harness and publish containers' (preloader image): both stream what they copy and publish."""
DEFAULT_PRELOAD_RESOURCES = Resources(requests={"cpu": "100m", "memory": "128Mi"},
                                      limits={"cpu": "1", "memory": "256Mi"})
"""The injected preload's. It streams a bundle from the store into the cache directory, so its memory does not grow
with the bundle (a 160 MiB bundle preloads under a 96Mi limit on a real kubelet: tests/e2e/test_real_node.py)."""


@dataclass(frozen=True)
class WarmupSpec:
    resources: Resources = field(default_factory=Resources)
    helper_resources: Resources = DEFAULT_HELPER_RESOURCES
    """Requests and limits of the harness and publish containers (``spec.warmup.helperResources``)."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    backoff_limit: int = 2
    active_deadline_seconds: int = 3600
    gpu_resource_name: str = DEFAULT_GPU_RESOURCE
    gpus_per_job: int = 1
    service_account_name: str | None = None
    automount_service_account_token: bool = False
    """Whether the warm-up pod mounts its ServiceAccount's API token (``spec.warmup.automountServiceAccountToken``):
    never unless asked for, and only for a ServiceAccount the cluster admin allows it for."""
    image_pull_secrets: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    """The compile container's extra ``env`` entries: ``{name, value}`` or ``{name, valueFrom}``."""
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    """Extra volumes of the warm-up pod, and where the compile container mounts them."""
    run_as_user: int = DEFAULT_WARMUP_ID
    """The warm-up pod's uid, gid and fsGroup: never 0, so the Job passes the "restricted" standard."""
    run_as_group: int = DEFAULT_WARMUP_ID
    fs_group: int = DEFAULT_WARMUP_ID
    read_only_root_filesystem: bool = True
    """The compile container's root file system is read-only, with an emptyDir on /tmp and the caches torch and
    Triton write pointed into it or into the work volume (``spec.warmup.readOnlyRootFilesystem``)."""


@dataclass(frozen=True)
class RemoteCacheSpec:
    host: str
    port: int = 6379
    fx_graph: bool = True
    autograd: bool = True
    autotune: bool = True

    def env(self) -> dict[str, str]:
        """PyTorch's own remote-cache switches and the Redis address they use."""
        out = {"TORCHINDUCTOR_REDIS_HOST": self.host, "TORCHINDUCTOR_REDIS_PORT": str(self.port)}
        if self.fx_graph:
            out["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] = "1"
        if self.autograd:
            out["TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE"] = "1"
        if self.autotune:
            out["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] = "1"
        return out


@dataclass(frozen=True)
class PreloadSpec:
    mode: str = INIT_CONTAINER
    """``InitContainer``: the preload runs before the workload; ``Sidecar``: beside it (Kubernetes 1.29+)."""
    strict: bool = False
    max_bytes: int | None = None
    node_cache_path: str | None = None
    resources: Resources = field(default_factory=Resources)
    deadline_seconds: int = DEFAULT_PRELOAD_DEADLINE_SECONDS
    """Overall deadline of one preload; past it the preload ends as an error result and the pod starts."""
    size_limit: str = DEFAULT_PRELOAD_SIZE_LIMIT
    """The sizeLimit of the pod's cache emptyDir, as written in the spec (a Kubernetes quantity)."""
    size_limit_bytes: int = DEFAULT_PRELOAD_SIZE_LIMIT_BYTES
    """``size_limit`` in bytes: the preload's byte budget when ``max_bytes`` is unset."""
    on_predicted_cold: str = WARN
    """``Warn``: a pod predicted to start cold is admitted with a warning; ``Deny``: refused with it."""

    @property
    def byte_budget(self) -> int:
        """The most bytes one preload may fetch or unpack: ``maxBytes``, else the volume's size."""
        return self.max_bytes if self.max_bytes is not None else self.size_limit_bytes


@dataclass(frozen=True)
class CacheSpec:
    image: str
    model: ModelSpec
    storage: StorageSpec
    image_pull_policy: str | None = None
    gpu_types: tuple[str, ...] = ()
    gpu_discovery: GpuDiscovery = field(default_factory=GpuDiscovery)
    warmup: WarmupSpec = field(default_factory=WarmupSpec)
    keep_generations: int = 2
    deletion_policy: str = "Keep"
    remote_cache: RemoteCacheSpec | None = None
    preload: PreloadSpec = field(default_factory=PreloadSpec)


@dataclass(frozen=True)
class Defaults:
    """Operator-wide defaults (command-line flags) that a spec may leave to the operator."""

    gpu_label_key: str = DEFAULT_GPU_LABEL_KEY
    storage_url: str | None = None
    storage_secret: str | None = None
    node_cache_path: str | None = None
    node_cache_roots: tuple[str, ...] = DEFAULT_NODE_CACHE_ROOTS
    """Where a spec may put a node cache (``spec.preload.nodeCache.hostPath``): these directories or below."""
    storage_ca: Mapping[str, Any] | None = None
    """The default store's CA (``--default-storage-ca``): the volume source warm-ups and preloads of CompileCaches
    on the default store mount, from a Secret or ConfigMap of that name in their own namespace."""
    warmup_resources: Resources = DEFAULT_WARMUP_RESOURCES
    helper_resources: Resources = DEFAULT_HELPER_RESOURCES
    preload_resources: Resources = DEFAULT_PRELOAD_RESOURCES
    """Requests and limits of the containers the operator creates, where a spec sets none."""
