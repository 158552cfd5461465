"""The CompileCache spec, parsed and validated in one place.

:func:`parse_spec` turns the raw ``spec`` mapping (and the object's name) into frozen dataclasses
or raises :class:`InvalidSpec` listing every problem with its field path
(``spec.storage.url: ...``). The CRD's schema and CEL rules refuse most bad objects in the API
server already; the checks are repeated here because an object can predate a rule (or a cluster
may run without the CRD's rules), and this module adds what the schema cannot express: a store
URL that a backend accepts, GPU types that stay distinct once normalised, resource quantities in
bytes, defaults that come from the operator's flags.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any
from urllib.parse import urlsplit

from compilecache_operator import store_ca, warmup_inputs
from compilecache_operator.formats import (
    DEFAULT_NODE_CACHE_ROOTS,
    host_problem,
    image_problem,
    label_value_problem,
    node_path_problem,
    qualified_name_problem,
    resource_name_problem,
)

from cachelib.compilekey import (
    BUILTIN_TARGETS,
    DEFAULT_BACKEND,
    DYNAMIC,
    MODES,
    CompileOptions,
    config_value,
    dynamic_text,
    is_backend,
    is_config_name,
    is_target,
    parse_dynamic,
)
from cachelib.keyformat import gpu_slug
from cachelib.masking import mask_text
from cachelib.stores import CREDENTIALS
from cachelib.stores.base import MAX_SEGMENT_LENGTH, StoreURLError
from cachelib.stores.urls import StoreURL, parse_store_url

DEFAULT_GPU_LABEL_KEY = "nvidia.com/gpu.product"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DELETION_POLICIES = ("Keep", "Delete")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
INIT_CONTAINER = "InitContainer"
SIDECAR = "Sidecar"
PRELOAD_MODES = (INIT_CONTAINER, SIDECAR)
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
SHOWN_VALUE = 64
"""The most characters of a bad value an error message repeats."""

MAX_NAME_LENGTH = MAX_SEGMENT_LENGTH
"""The longest CompileCache name: the name is one segment of every cache key, as it is."""

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# Kubernetes quantity suffixes: binary (Ki..Ei), decimal (k..E) and the sub-unit ones (m, u, n).
_QUANTITY_PARTS = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([-+]?[0-9]+)|([KMGTPE]i|[kMGTPE]|[mun]))?$")
_SUFFIX_FACTORS: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    **{s: Fraction(1000**i) for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}


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
(cachelib.warmstart)."""


@dataclass(frozen=True)
class ModelSpec:
    target: str | None
    command: str | None
    compile: CompileOptions = field(default_factory=CompileOptions)
    """The options the harness compiles with (``backward`` included)."""
    backward: bool = False
    """``spec.model.backward`` as written (``compile.backward`` is also true with compiled autograd)."""

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
    """The pod volume source of ``spec.storage.ca`` (see :mod:`compilecache_operator.store_ca`)."""
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


class _Errors:
    """Collects field errors so that one pass reports all of them."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path, message))


def parse_spec(
    raw: Mapping[str, Any] | None, defaults: Defaults | None = None, *, name: str | None = None
) -> CacheSpec:
    """Parse a CompileCache ``spec``; raises :class:`InvalidSpec` naming every bad field.

    ``name`` is the object's ``metadata.name``, checked too when given: it becomes a segment of
    every cache key, so a name the stores cannot hold is refused before any warm-up runs.
    """
    defaults = defaults or Defaults()
    errors = _Errors()
    if name is not None:
        _check_name(name, errors)
    spec = _mapping(raw, "spec", errors, required=True)
    image = _string(spec, "image", "spec", errors, required=True, max_length=1024) or ""
    if image:
        _check(image, image_problem, "spec.image", errors)
    pull_policy = _enum(spec, "imagePullPolicy", "spec", errors, PULL_POLICIES, None)
    model_raw = _mapping(spec.get("model"), "spec.model", errors, required=True)
    model = _parse_model(model_raw, errors) if spec.get("model") is not None else None
    gpu_types = _parse_gpu_types(spec.get("gpuTypes"), errors)
    discovery = _parse_discovery(_mapping(spec.get("gpuDiscovery"), "spec.gpuDiscovery", errors), defaults, errors)
    storage = _parse_storage(spec.get("storage"), defaults, errors)
    raw_storage: Mapping[str, Any] = spec["storage"] if isinstance(spec.get("storage"), Mapping) else {}
    if storage is not None and raw_storage.get("ca") is not None:
        ca = store_ca.parse_store_ca(raw_storage["ca"], storage.store, "spec.storage.ca", errors)
        storage = replace(storage, ca=ca)
    elif storage is not None and raw_storage.get("url") is None and defaults.storage_ca is not None:
        storage = replace(storage, ca=defaults.storage_ca)  # the default store's CA, as the operator was told
    warmup = _parse_warmup(_mapping(spec.get("warmup"), "spec.warmup", errors), defaults, errors)
    retention = _mapping(spec.get("retention"), "spec.retention", errors)
    keep = _integer(retention, "keepGenerations", "spec.retention", errors, 2, low=1, high=100)
    deletion = _enum(spec, "deletionPolicy", "spec", errors, DELETION_POLICIES, "Keep") or "Keep"
    remote = _parse_remote_cache(spec.get("remoteCache"), errors)
    preload = _parse_preload(_mapping(spec.get("preload"), "spec.preload", errors), defaults, errors)
    if errors.items:
        raise InvalidSpec(errors.items)
    assert model is not None and storage is not None
    return CacheSpec(
        image=image,
        image_pull_policy=pull_policy,
        model=model,
        gpu_types=gpu_types,
        gpu_discovery=discovery,
        storage=storage,
        warmup=warmup,
        keep_generations=keep,
        deletion_policy=deletion,
        remote_cache=remote,
        preload=preload,
    )


# -- sections -------------------------------------------------------------------------------
def _check_name(name: str, errors: _Errors) -> None:
    if len(name) > MAX_NAME_LENGTH:
        errors.add(
            "metadata.name",
            f"at most {MAX_NAME_LENGTH} characters, got {len(name)}: the name is one segment of every cache key, "
            f"and a store key segment holds at most {MAX_SEGMENT_LENGTH} characters",
        )


def _parse_model(model: Mapping[str, Any], errors: _Errors) -> ModelSpec | None:
    path = "spec.model"
    target = _string(model, "target", path, errors, max_length=256)
    command = _string(model, "command", path, errors, max_length=4096)
    if target is not None and not is_target(target):
        errors.add(
            f"{path}.target",
            f"{target!r} is not module:function (mypkg.models:build) or a built-in target name "
            f"({', '.join(BUILTIN_TARGETS)})",
        )
    if target is None and command is None:
        errors.add(path, "set one of target or command")
    elif target is not None and command is not None:
        errors.add(path, "set only one of target or command, not both")
    backward = _boolean(model, "backward", path, errors, False)
    compile_options = _parse_compile(_mapping(model.get("compile"), f"{path}.compile", errors), backward, errors)
    precompile = _enum(model, "precompile", path, errors, PRECOMPILE, PRECOMPILE_OFF) or PRECOMPILE_OFF
    compile_options = replace(compile_options, precompile="auto" if precompile == PRECOMPILE_AUTO else "off")
    return ModelSpec(target=target, command=command, compile=compile_options, backward=backward)


def _parse_compile(opts: Mapping[str, Any], backward: bool, errors: _Errors) -> CompileOptions:
    cpath = "spec.model.compile"
    backend = _string(opts, "backend", cpath, errors, max_length=128) or DEFAULT_BACKEND
    if not is_backend(backend):
        errors.add(f"{cpath}.backend", f"{backend!r} is not a backend name")
    dynamic_raw = opts.get("dynamic", "auto")
    if isinstance(dynamic_raw, bool):  # a YAML true/false that skipped the schema
        dynamic_raw = dynamic_text(dynamic_raw)
    dynamic = _enum({"dynamic": dynamic_raw}, "dynamic", cpath, errors, DYNAMIC, "auto") or "auto"
    return CompileOptions(
        mode=_enum(opts, "mode", cpath, errors, MODES, "default") or "default",
        dynamic=parse_dynamic(dynamic),
        fullgraph=_boolean(opts, "fullgraph", cpath, errors, False),
        backend=backend,
        compiled_autograd=_boolean(opts, "compiledAutograd", cpath, errors, False),
        backward=backward,
        inductor_config=_parse_inductor_config(opts.get("inductorConfig"), f"{cpath}.inductorConfig", errors),
    )


def _parse_inductor_config(raw: Any, path: str, errors: _Errors) -> tuple[tuple[str, Any], ...]:
    """``torch._inductor.config`` settings, each value read as the harness reads ``--inductor-config NAME=VALUE``."""
    items = _string_map(raw, path, errors)
    if len(items) > MAX_INDUCTOR_CONFIG:
        errors.add(path, f"at most {MAX_INDUCTOR_CONFIG} settings, got {len(items)}")
    for name in items:
        if not is_config_name(name):
            errors.add(f"{path}.{name}", "not an inductor config option name (max_autotune, triton.cudagraphs)")
    return tuple((name, config_value(value)) for name, value in items.items() if is_config_name(name))


def _parse_gpu_types(raw: Any, errors: _Errors) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        errors.add("spec.gpuTypes", "must be a list of GPU products")
        return ()
    if len(raw) > 32:
        errors.add("spec.gpuTypes", f"at most 32 GPU types, got {len(raw)}")
    seen: dict[str, int] = {}
    out: list[str] = []
    for i, item in enumerate(raw):
        path = f"spec.gpuTypes[{i}]"
        if not isinstance(item, str) or not item.strip():
            errors.add(path, "must be a non-empty string")
            continue
        if len(item) > 63 or not _LABEL_VALUE.fullmatch(item):
            errors.add(path, f"{item!r} is not a GPU product as a Node label value shows it (NVIDIA-H100-80GB-HBM3)")
            continue
        slug = gpu_slug(item)
        if slug in seen:
            errors.add(path, f"{item!r} is the same GPU type as spec.gpuTypes[{seen[slug]}] ({slug})")
            continue
        seen[slug] = i
        out.append(item)
    return tuple(out)


def _parse_discovery(raw: Mapping[str, Any], defaults: Defaults, errors: _Errors) -> GpuDiscovery:
    path = "spec.gpuDiscovery"
    label_key = _string(raw, "labelKey", path, errors, max_length=317) or defaults.gpu_label_key
    _check(label_key, qualified_name_problem, f"{path}.labelKey", errors)
    return GpuDiscovery(auto=_boolean(raw, "auto", path, errors, False), label_key=label_key)


def _parse_storage(raw: Any, defaults: Defaults, errors: _Errors) -> StorageSpec | None:
    path = "spec.storage"
    storage = _mapping(raw, path, errors)
    url = _string(storage, "url", path, errors, max_length=2048)
    secret_raw = storage.get("secretRef")
    if url is None:
        url = defaults.storage_url
        if url is None:
            errors.add(f"{path}.url", "required (the operator has no default store)")
            return None
        if secret_raw is None and defaults.storage_secret:
            secret_raw = {"name": defaults.storage_secret}
    try:
        parsed = parse_store_url(url)
    except StoreURLError as exc:
        errors.add(f"{path}.url", str(exc))
        return None
    if getattr(parsed, "password", None) or getattr(parsed, "username", None) or "@" in url:
        errors.add(f"{path}.url", "must not carry user info (a user name, token or password): put credentials in the "
                                  "Secret named by spec.storage.secretRef")
        return None
    scheme = urlsplit(url).scheme.lower()
    if secret_raw is None:
        return StorageSpec(url=url, store=parsed)
    secret = _mapping(secret_raw, f"{path}.secretRef", errors)
    name = _string(secret, "name", f"{path}.secretRef", errors, required=True, max_length=253)
    if name is not None and not _DNS_SUBDOMAIN.fullmatch(name):
        errors.add(f"{path}.secretRef.name", f"{name!r} is not a Secret name")
    credentials = CREDENTIALS.get(scheme, ())
    if not credentials:
        errors.add(f"{path}.secretRef", f"{scheme}:// stores take no credentials")
        return None
    keys_raw = _mapping(secret.get("keys"), f"{path}.secretRef.keys", errors)
    known = {c.name for c in credentials}
    for extra in sorted(set(keys_raw) - known):
        accepted = ", ".join(sorted(known))
        errors.add(f"{path}.secretRef.keys.{extra}", f"not a credential of {scheme}:// stores ({accepted})")
    keys = tuple(
        SecretKey(env=c.env, key=_secret_key(keys_raw, c.name, f"{path}.secretRef.keys", errors) or c.default_key,
                  optional=c.optional)
        for c in credentials
    )
    return StorageSpec(url=url, secret_name=name, secret_keys=keys, store=parsed)


def _secret_key(keys: Mapping[str, Any], name: str, path: str, errors: _Errors) -> str | None:
    key = _string(keys, name, path, errors, max_length=253)
    if key is not None and not _SECRET_KEY.fullmatch(key):
        errors.add(f"{path}.{name}", f"{key!r} is not a Secret key ([-._a-zA-Z0-9]+)")
        return None
    return key


def _parse_resources(raw: Any, path: str, errors: _Errors) -> Resources:
    section = _mapping(raw, path, errors)
    out: dict[str, dict[str, str]] = {}
    for part in ("limits", "requests"):
        values = _mapping(section.get(part), f"{path}.{part}", errors)
        parsed: dict[str, str] = {}
        for name, value in values.items():
            if _check(str(name), resource_name_problem, f"{path}.{part}", errors, what="resource name"):
                continue
            text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
            if not isinstance(text, str) or not _QUANTITY_PARTS.fullmatch(text):
                errors.add(f"{path}.{part}.{name}", f"{shown(value)} is not a resource quantity")
                continue
            parsed[str(name)] = text
        out[part] = parsed
    _check_requests(out["requests"], out["limits"], path, errors)
    return Resources(limits=out["limits"], requests=out["requests"])


def parse_resources(raw: Any, path: str) -> Resources:
    """``{requests, limits}`` as in a container (an operator setting named ``path``); raises :class:`InvalidSpec`."""
    errors = _Errors()
    resources = _parse_resources(raw, path, errors)
    if errors.items:
        raise InvalidSpec(errors.items)
    return resources


def parse_ca_setting(raw: Any, url: str, path: str) -> Mapping[str, Any] | None:
    """A store CA as ``spec.storage.ca`` says it, for the store ``url`` (an operator setting named ``path``);
    raises :class:`InvalidSpec`."""
    errors = _Errors()
    try:
        store: StoreURL | None = parse_store_url(url)
    except ValueError:
        store = None  # parse_store_ca says what the URL must be
    source = store_ca.parse_store_ca(raw, store, path, errors)
    if errors.items:
        raise InvalidSpec(errors.items)
    return source


def _check_requests(requests: Mapping[str, str], limits: Mapping[str, str], path: str, errors: _Errors) -> None:
    """Kubernetes' rules between a container's requests and limits: a request at most its limit, and for
    what cannot be overcommitted (extended resources such as nvidia.com/gpu, hugepages) a limit, equal."""
    for name, request in requests.items():
        limit = limits.get(name)
        fixed = name.startswith("hugepages-") or ("/" in name and not name.split("/")[0].endswith("kubernetes.io"))
        if limit is None:
            if fixed:
                errors.add(f"{path}.requests.{name}", f"needs {path}.limits.{name} as well (equal to it): "
                                                      f"{name} cannot be overcommitted")
            continue
        wanted, most = quantity_value(request), quantity_value(limit)
        if wanted is None or most is None:
            continue
        if fixed and wanted != most:
            errors.add(f"{path}.requests.{name}", f"{request} must equal the limit {limit}: {name} cannot be "
                                                  "overcommitted")
        elif wanted > most:
            errors.add(f"{path}.requests.{name}", f"{request} must be at most the limit {limit}")


def _parse_warmup(raw: Mapping[str, Any], defaults: Defaults, errors: _Errors) -> WarmupSpec:
    path = "spec.warmup"
    resources = _parse_resources(raw.get("resources"), f"{path}.resources", errors).or_else(defaults.warmup_resources)
    helpers = _parse_resources(raw.get("helperResources"), f"{path}.helperResources", errors)
    selector = _parse_node_selector(raw.get("nodeSelector"), f"{path}.nodeSelector", errors)
    tolerations = _parse_tolerations(raw.get("tolerations"), f"{path}.tolerations", errors)
    gpu_resource = _string(raw, "gpuResourceName", path, errors, max_length=317) or DEFAULT_GPU_RESOURCE
    _check(gpu_resource, resource_name_problem, f"{path}.gpuResourceName", errors)
    account = _string(raw, "serviceAccountName", path, errors, max_length=253)
    if account is not None and not _DNS_SUBDOMAIN.fullmatch(account):
        errors.add(f"{path}.serviceAccountName", f"{account!r} is not a ServiceAccount name")
    pull_secrets: list[str] = []
    for i, item in enumerate(_list(raw.get("imagePullSecrets"), f"{path}.imagePullSecrets", errors)):
        secret_name = _string(_mapping(item, f"{path}.imagePullSecrets[{i}]", errors), "name",
                              f"{path}.imagePullSecrets[{i}]", errors, required=True, max_length=253)
        if secret_name is not None and not _DNS_SUBDOMAIN.fullmatch(secret_name):
            errors.add(f"{path}.imagePullSecrets[{i}].name", f"{secret_name!r} is not a Secret name")
        elif secret_name:
            pull_secrets.append(secret_name)
    volumes = warmup_inputs.parse_volumes(raw.get("volumes"), f"{path}.volumes", errors)
    return WarmupSpec(
        resources=resources,
        helper_resources=helpers.or_else(defaults.helper_resources),
        node_selector=selector,
        tolerations=tolerations,
        backoff_limit=_integer(raw, "backoffLimit", path, errors, 2, low=0, high=10),
        active_deadline_seconds=_integer(raw, "activeDeadlineSeconds", path, errors, 3600, low=1,
                                         high=MAX_ACTIVE_DEADLINE_SECONDS),
        gpu_resource_name=gpu_resource,
        gpus_per_job=_integer(raw, "gpusPerJob", path, errors, 1, low=0, high=16),
        service_account_name=account,
        image_pull_secrets=tuple(pull_secrets),
        env=warmup_inputs.parse_env(raw.get("env"), f"{path}.env", errors),
        volumes=volumes,
        volume_mounts=warmup_inputs.parse_volume_mounts(
            raw.get("volumeMounts"), f"{path}.volumeMounts", volumes, errors
        ),
        **_parse_warmup_ids(raw.get("securityContext"), f"{path}.securityContext", errors),
    )


def _parse_warmup_ids(raw: Any, path: str, errors: _Errors) -> dict[str, int]:
    """uid, gid and fsGroup of the warm-up pod; 0 (root) is refused: the Job must pass "restricted"."""
    context = _mapping(raw, path, errors)
    return {
        field_name: _integer(context, key, path, errors, DEFAULT_WARMUP_ID, low=1, high=MAX_ID)
        for key, field_name in (("runAsUser", "run_as_user"), ("runAsGroup", "run_as_group"), ("fsGroup", "fs_group"))
    }


def _parse_tolerations(raw: Any, path: str, errors: _Errors) -> tuple[Mapping[str, Any], ...]:
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(_list(raw, path, errors)):
        ipath = f"{path}[{i}]"
        entry = _mapping(item, ipath, errors)
        toleration: dict[str, Any] = {}
        for name, longest, problem in (("key", 317, qualified_name_problem), ("value", 63, label_value_problem)):
            value = _string(entry, name, ipath, errors, max_length=longest)
            if value is not None and not _check(value, problem, f"{ipath}.{name}", errors):
                toleration[name] = value
        operator = _enum(entry, "operator", ipath, errors, TOLERATION_OPERATORS, None)
        effect = _enum(entry, "effect", ipath, errors, TOLERATION_EFFECTS, None)
        if operator:
            toleration["operator"] = operator
        if effect:
            toleration["effect"] = effect
        if "tolerationSeconds" in entry:
            toleration["tolerationSeconds"] = _integer(entry, "tolerationSeconds", ipath, errors, 0, low=0,
                                                       high=MAX_TOLERATION_SECONDS)
        if operator == "Exists" and "value" in toleration:
            errors.add(f"{ipath}.value", "must be unset when operator is Exists")
        if "key" not in entry and operator != "Exists":
            errors.add(f"{ipath}.key", "required unless operator is Exists")
        if "tolerationSeconds" in entry and entry.get("effect") != "NoExecute":
            errors.add(f"{ipath}.tolerationSeconds", "only allowed with effect NoExecute")
        out.append(toleration)
    return tuple(out)


def _parse_remote_cache(raw: Any, errors: _Errors) -> RemoteCacheSpec | None:
    if raw is None:
        return None
    path = "spec.remoteCache"
    remote = _mapping(raw, path, errors)
    host = _string(remote, "host", path, errors, required=True, max_length=253)
    if host is not None:
        _check(host, host_problem, f"{path}.host", errors)
    return RemoteCacheSpec(
        host=host or "",
        port=_integer(remote, "port", path, errors, 6379, low=1, high=65535),
        fx_graph=_boolean(remote, "fxGraph", path, errors, True),
        autograd=_boolean(remote, "autograd", path, errors, True),
        autotune=_boolean(remote, "autotune", path, errors, True),
    )


def _parse_preload(raw: Mapping[str, Any], defaults: Defaults, errors: _Errors) -> PreloadSpec:
    path = "spec.preload"
    node_cache = _mapping(raw.get("nodeCache"), f"{path}.nodeCache", errors)
    host_path = _string(node_cache, "hostPath", f"{path}.nodeCache", errors, required="nodeCache" in raw)
    if host_path is not None:
        _check(host_path, lambda p: node_path_problem(p, defaults.node_cache_roots), f"{path}.nodeCache.hostPath",
               errors)
    max_bytes = _integer(raw, "maxBytes", path, errors, -1, low=0) if "maxBytes" in raw else None
    deadline = _integer(raw, "deadlineSeconds", path, errors, DEFAULT_PRELOAD_DEADLINE_SECONDS,
                        low=1, high=MAX_PRELOAD_DEADLINE_SECONDS)
    size_limit = _string(raw, "sizeLimit", path, errors, max_length=64) or DEFAULT_PRELOAD_SIZE_LIMIT
    size_limit_bytes = quantity_bytes(size_limit)
    if size_limit_bytes is None or size_limit_bytes < 1:
        errors.add(f"{path}.sizeLimit", f"{size_limit!r} is not a positive quantity of bytes (16Gi, 500M)")
        size_limit_bytes = DEFAULT_PRELOAD_SIZE_LIMIT_BYTES
    elif max_bytes is not None and max_bytes > size_limit_bytes:
        errors.add(
            f"{path}.maxBytes",
            f"{max_bytes} is larger than {path}.sizeLimit {size_limit} ({size_limit_bytes} bytes): a bundle that "
            f"big cannot fit the cache volume (raise {path}.sizeLimit or lower {path}.maxBytes)",
        )
    resources = _parse_resources(raw.get("resources"), f"{path}.resources", errors).or_else(defaults.preload_resources)
    mode = _enum(raw, "mode", path, errors, PRELOAD_MODES, INIT_CONTAINER) or INIT_CONTAINER
    strict = _boolean(raw, "strict", path, errors, False)
    if mode == SIDECAR and strict:
        errors.add(
            f"{path}.strict",
            f"must be false with {path}.mode {SIDECAR}: a sidecar runs beside the workload and cannot hold the "
            f"pod's start (set {path}.mode {INIT_CONTAINER} for a strict preload)",
        )
    return PreloadSpec(
        mode=mode,
        strict=strict,
        max_bytes=max_bytes,
        node_cache_path=host_path or defaults.node_cache_path,
        resources=resources,
        deadline_seconds=deadline,
        size_limit=size_limit,
        size_limit_bytes=size_limit_bytes,
    )


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes quantity (``16Gi``, ``500M``, ``1e9``) as whole bytes, rounded up; None if it is not one."""
    value = quantity_value(text)
    return None if value is None else math.ceil(value)


def quantity_value(text: str) -> Fraction | None:
    """A Kubernetes quantity (``16Gi``, ``500m``, ``1e9``) as an exact number; None if it is not one."""
    match = _QUANTITY_PARTS.fullmatch(text)
    if not match:
        return None
    number, exponent, suffix = match.groups()
    if exponent and abs(int(exponent)) > 30:  # far past any amount, and cheap to refuse
        return None
    return Fraction(number) * (Fraction(10) ** int(exponent) if exponent else _SUFFIX_FACTORS[suffix or ""])


def _parse_node_selector(raw: Any, path: str, errors: _Errors) -> dict[str, str]:
    """Label keys and values, as a Pod's nodeSelector takes them."""
    selector = _string_map(raw, path, errors)
    if len(selector) > MAX_NODE_SELECTOR:
        errors.add(path, f"at most {MAX_NODE_SELECTOR} labels, got {len(selector)}")
        return {}
    good: dict[str, str] = {}
    for key, value in selector.items():
        bad_key = _check(key, qualified_name_problem, path, errors, what="label key")
        if not bad_key and not _check(value, label_value_problem, f"{path}.{key}", errors):
            good[key] = value
    return good


def _check(value: str, problem: Callable[[str], str | None], path: str, errors: _Errors, *, what: str = "") -> bool:
    """Add ``problem(value)`` (if any) as an error at ``path``; True when there was one. ``what`` names a
    value that is a key at ``path`` (a map key), so that the message shows which."""
    reason = problem(value)
    if reason is None:
        return False
    errors.add(path, f"{what + ' ' if what else ''}{shown(value)}: {reason}")
    return True


def shown(value: Any) -> str:
    """A bad value as an error message repeats it: quoted, escaped, at most :data:`SHOWN_VALUE` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE else f"{text[: SHOWN_VALUE - 1]}… ({len(str(value))} characters)"


# -- scalar readers -----------------------------------------------------------------------------
def _mapping(raw: Any, path: str, errors: _Errors, *, required: bool = False) -> Mapping[str, Any]:
    if raw is None:
        if required:
            errors.add(path, "required")
        return {}
    if not isinstance(raw, Mapping):
        errors.add(path, f"must be an object, got {type(raw).__name__}")
        return {}
    return raw


def _list(raw: Any, path: str, errors: _Errors) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add(path, f"must be a list, got {type(raw).__name__}")
        return []
    return raw


def _string_map(raw: Any, path: str, errors: _Errors) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in _mapping(raw, path, errors).items():
        if not isinstance(value, str):
            errors.add(f"{path}.{key}", "must be a string")
        else:
            out[str(key)] = value
    return out


def _string(
    obj: Mapping[str, Any], key: str, path: str, errors: _Errors, *, required: bool = False, max_length: int = 1024
) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            errors.add(f"{path}.{key}", "required")
        return None
    if not isinstance(value, str):
        errors.add(f"{path}.{key}", f"must be a string, got {type(value).__name__}")
        return None
    if not value:
        errors.add(f"{path}.{key}", "must not be empty")
        return None
    if len(value) > max_length:
        errors.add(f"{path}.{key}", f"at most {max_length} characters, got {len(value)}")
        return None
    return value


def _enum(
    obj: Mapping[str, Any], key: str, path: str, errors: _Errors, allowed: Sequence[str], default: str | None
) -> str | None:
    value = obj.get(key)
    if value is None:
        return default
    if value not in allowed:
        errors.add(f"{path}.{key}", f"{shown(value)} is not one of {', '.join(allowed)}")
        return default
    return str(value)


def _boolean(obj: Mapping[str, Any], key: str, path: str, errors: _Errors, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        errors.add(f"{path}.{key}", f"must be true or false, got {shown(value)}")
        return default
    return value


def _integer(
    obj: Mapping[str, Any], key: str, path: str, errors: _Errors, default: int, *, low: int, high: int | None = None
) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(f"{path}.{key}", f"must be a whole number, got {shown(value)}")
        return default
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        errors.add(f"{path}.{key}", f"{value} must be {bound}")
        return default
    return value
