"""The parse of a CompileCache spec: :func:`parse_spec` reads the raw ``spec`` mapping (and the object's
name) one section at a time into the dataclasses of :mod:`compilecache_operator.model.spec`, or raises
:class:`~compilecache_operator.model.spec.InvalidSpec` listing every problem with its field path
(``spec.storage.url: ...``). The CRD's schema and CEL rules refuse most bad objects in the API
server already; the checks are repeated here because an object can predate a rule (or a cluster
may run without the CRD's rules), and this module adds what the schema cannot express: a store
URL that a backend accepts, GPU types that stay distinct once normalised, resource quantities in
bytes, defaults that come from the operator's flags.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from cachelib.in_image.compilekey import (
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
from cachelib.stores import CREDENTIALS
from cachelib.stores.base import MAX_SEGMENT_LENGTH, StoreURLError
from cachelib.stores.urls import StoreURL, parse_store_url
from compilecache_operator.model import spec_vllm, store_ca, warmup_inputs
from compilecache_operator.model.formats import (
    extended_resource_problem,
    host_problem,
    image_problem,
    label_value_problem,
    node_path_problem,
    qualified_name_problem,
    resource_name_problem,
    runtime_text_problem,
)
from compilecache_operator.model.spec import (
    DEFAULT_GPU_RESOURCE,
    DEFAULT_PRELOAD_DEADLINE_SECONDS,
    DEFAULT_PRELOAD_SIZE_LIMIT,
    DEFAULT_PRELOAD_SIZE_LIMIT_BYTES,
    DEFAULT_WARMUP_ID,
    DELETION_POLICIES,
    INIT_CONTAINER,
    MAX_ACTIVE_DEADLINE_SECONDS,
    MAX_ID,
    MAX_INDUCTOR_CONFIG,
    MAX_NAME_LENGTH,
    MAX_NODE_SELECTOR,
    MAX_PRELOAD_DEADLINE_SECONDS,
    MAX_TOLERATION_SECONDS,
    ON_PREDICTED_COLD,
    PRECOMPILE,
    PRECOMPILE_AUTO,
    PRECOMPILE_OFF,
    PRELOAD_MODES,
    PULL_POLICIES,
    SIDECAR,
    TOLERATION_EFFECTS,
    TOLERATION_OPERATORS,
    WARN,
    CacheSpec,
    Defaults,
    GpuDiscovery,
    InvalidSpec,
    ModelSpec,
    PreloadSpec,
    RemoteCacheSpec,
    Resources,
    SecretKey,
    StorageSpec,
    WarmupSpec,
)
from compilecache_operator.model.spec_fields import (
    QUANTITY,
    FieldErrors,
    check,
    quantity_bytes,
    quantity_value,
    read_boolean,
    read_enum,
    read_integer,
    read_list,
    read_mapping,
    read_string,
    read_string_map,
    shown,
)

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def parse_spec(
    raw: Mapping[str, Any] | None, defaults: Defaults | None = None, *, name: str | None = None
) -> CacheSpec:
    """Parse a CompileCache ``spec``; raises :class:`InvalidSpec` naming every bad field.

    ``name`` is the object's ``metadata.name``, checked too when given: it becomes a segment of
    every cache key, so a name the stores cannot hold is refused before any warm-up runs.
    """
    defaults = defaults or Defaults()
    errors = FieldErrors()
    if name is not None:
        _check_name(name, errors)
    spec = read_mapping(raw, "spec", errors, required=True)
    image = read_string(spec, "image", "spec", errors, required=True, max_length=1024) or ""
    if image:
        check(image, image_problem, "spec.image", errors)
    pull_policy = read_enum(spec, "imagePullPolicy", "spec", errors, PULL_POLICIES, None)
    model_raw = read_mapping(spec.get("model"), "spec.model", errors, required=True)
    model = _parse_model(model_raw, errors) if spec.get("model") is not None else None
    gpu_types = _parse_gpu_types(spec.get("gpuTypes"), errors)
    discovery = _parse_discovery(read_mapping(spec.get("gpuDiscovery"), "spec.gpuDiscovery", errors), defaults, errors)
    storage = _parse_storage(spec.get("storage"), defaults, errors)
    raw_storage: Mapping[str, Any] = spec["storage"] if isinstance(spec.get("storage"), Mapping) else {}
    if storage is not None and raw_storage.get("ca") is not None:
        ca = store_ca.parse_store_ca(raw_storage["ca"], storage.store, "spec.storage.ca", errors)
        storage = replace(storage, ca=ca)
    elif storage is not None and raw_storage.get("url") is None and defaults.storage_ca is not None:
        storage = replace(storage, ca=defaults.storage_ca)  # the default store's CA, as the operator was told
    warmup = _parse_warmup(read_mapping(spec.get("warmup"), "spec.warmup", errors), defaults, errors)
    retention = read_mapping(spec.get("retention"), "spec.retention", errors)
    keep = read_integer(retention, "keepGenerations", "spec.retention", errors, 2, low=1, high=100)
    deletion = read_enum(spec, "deletionPolicy", "spec", errors, DELETION_POLICIES, "Keep") or "Keep"
    remote = _parse_remote_cache(spec.get("remoteCache"), errors)
    preload = _parse_preload(read_mapping(spec.get("preload"), "spec.preload", errors), defaults, errors)
    _check_runtime_text(spec, errors)
    if model is not None and model.vllm is not None:
        _check_vllm_cache(warmup, preload, errors)
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
def _check_runtime_text(spec: Mapping[str, Any], errors: FieldErrors) -> None:
    """A NUL byte anywhere in the spec, a value's or a map key's, at its path (unless a check of that field
    already refused it): the values end up in a container's arguments, environment or file names, which no
    runtime can start with one. The value is not repeated (it may be a credential written inline)."""
    refused = [e.path for e in errors.items]
    for path, problem in _runtime_text_problems(spec, "spec"):
        if not any(p == path or p.startswith((f"{path}.", f"{path}[")) for p in refused):
            errors.add(path, problem)


def _runtime_text_problems(raw: Any, path: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if isinstance(raw, str):
        problem = runtime_text_problem(raw)
        if problem:
            found.append((path, problem))
    elif isinstance(raw, Mapping):
        for key, value in raw.items():
            key_problem = runtime_text_problem(str(key))
            if key_problem:
                found.append((path, f"a key {key_problem}"))
            else:
                found += _runtime_text_problems(value, f"{path}.{key}")
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            found += _runtime_text_problems(item, f"{path}[{i}]")
    return found


def _check_name(name: str, errors: FieldErrors) -> None:
    if len(name) > MAX_NAME_LENGTH:
        errors.add(
            "metadata.name",
            f"at most {MAX_NAME_LENGTH} characters, got {len(name)}: the name is one segment of every cache key, "
            f"and a store key segment holds at most {MAX_SEGMENT_LENGTH} characters",
        )


def _parse_model(model: Mapping[str, Any], errors: FieldErrors) -> ModelSpec | None:
    path = "spec.model"
    target = read_string(model, "target", path, errors, max_length=256)
    command = read_string(model, "command", path, errors, max_length=4096)
    vllm = spec_vllm.parse_vllm(model["vllm"], f"{path}.vllm", errors) if model.get("vllm") is not None else None
    if target is not None and not is_target(target):
        errors.add(
            f"{path}.target",
            f"{target!r} is not module:function (mypkg.models:build) or a built-in target name "
            f"({', '.join(BUILTIN_TARGETS)})",
        )
    chosen = [name for name in ("target", "command", "vllm") if model.get(name) is not None]
    if not chosen:
        errors.add(path, "set one of target, command or vllm")
    elif len(chosen) > 1:
        errors.add(path, f"set only one of target, command or vllm, not {' and '.join(chosen)}")
    backward = read_boolean(model, "backward", path, errors, False)
    compile_options = _parse_compile(read_mapping(model.get("compile"), f"{path}.compile", errors), backward, errors)
    precompile = read_enum(model, "precompile", path, errors, PRECOMPILE, PRECOMPILE_OFF) or PRECOMPILE_OFF
    compile_options = replace(compile_options, precompile="auto" if precompile == PRECOMPILE_AUTO else "off")
    if model.get("vllm") is not None and (compile_options != CompileOptions() or backward):
        errors.add(path, "compile, backward and precompile do not apply to vLLM, which compiles with its own options "
                         "(pass them as engine arguments: spec.model.vllm.args, --compilation-config)")  # fmt: skip
    return ModelSpec(target=target, command=command, compile=compile_options, backward=backward, vllm=vllm)


def _check_vllm_cache(warmup: WarmupSpec, preload: PreloadSpec, errors: FieldErrors) -> None:
    """What a vLLM cache cannot have: ``VLLM_*`` variables in the warm-up's env (they belong to the model), and a
    preload beside vLLM, which reads its cache as its engine starts and waits for nothing."""
    spec_vllm.warmup_env_problems(warmup.env, "spec.warmup.env", errors)
    if preload.mode == SIDECAR:
        errors.add("spec.preload.mode", f"{SIDECAR} cannot serve vLLM, which reads its compiled model as its engine "
                                        f"starts and waits for no preload; use {INIT_CONTAINER}")  # fmt: skip


def _parse_compile(opts: Mapping[str, Any], backward: bool, errors: FieldErrors) -> CompileOptions:
    cpath = "spec.model.compile"
    backend = read_string(opts, "backend", cpath, errors, max_length=128) or DEFAULT_BACKEND
    if not is_backend(backend):
        errors.add(f"{cpath}.backend", f"{backend!r} is not a backend name")
    dynamic_raw = opts.get("dynamic", "auto")
    if isinstance(dynamic_raw, bool):  # a YAML true/false that skipped the schema
        dynamic_raw = dynamic_text(dynamic_raw)
    dynamic = read_enum({"dynamic": dynamic_raw}, "dynamic", cpath, errors, DYNAMIC, "auto") or "auto"
    return CompileOptions(
        mode=read_enum(opts, "mode", cpath, errors, MODES, "default") or "default",
        dynamic=parse_dynamic(dynamic),
        fullgraph=read_boolean(opts, "fullgraph", cpath, errors, False),
        backend=backend,
        compiled_autograd=read_boolean(opts, "compiledAutograd", cpath, errors, False),
        backward=backward,
        inductor_config=_parse_inductor_config(opts.get("inductorConfig"), f"{cpath}.inductorConfig", errors),
    )


def _parse_inductor_config(raw: Any, path: str, errors: FieldErrors) -> tuple[tuple[str, Any], ...]:
    """``torch._inductor.config`` settings, each value read as the harness reads ``--inductor-config NAME=VALUE``."""
    items = read_string_map(raw, path, errors)
    if len(items) > MAX_INDUCTOR_CONFIG:
        errors.add(path, f"at most {MAX_INDUCTOR_CONFIG} settings, got {len(items)}")
    for name in items:
        if not is_config_name(name):
            errors.add(f"{path}.{name}", "not an inductor config option name (max_autotune, triton.cudagraphs)")
    return tuple((name, config_value(value)) for name, value in items.items() if is_config_name(name))


def _parse_gpu_types(raw: Any, errors: FieldErrors) -> tuple[str, ...]:
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


def _parse_discovery(raw: Mapping[str, Any], defaults: Defaults, errors: FieldErrors) -> GpuDiscovery:
    path = "spec.gpuDiscovery"
    label_key = read_string(raw, "labelKey", path, errors, max_length=317) or defaults.gpu_label_key
    check(label_key, qualified_name_problem, f"{path}.labelKey", errors)
    return GpuDiscovery(auto=read_boolean(raw, "auto", path, errors, False), label_key=label_key)


def _parse_storage(raw: Any, defaults: Defaults, errors: FieldErrors) -> StorageSpec | None:
    path = "spec.storage"
    storage = read_mapping(raw, path, errors)
    url = read_string(storage, "url", path, errors, max_length=2048)
    secret_raw = storage.get("secretRef")
    if url is None:
        url = defaults.storage_url
        if url is None:
            errors.add(f"{path}.url", "required (the operator has no default store)")
            return None
        if secret_raw is None and defaults.storage_secret:
            secret_raw = {"name": defaults.storage_secret}
    try:
        parsed = read_store_url(url, "spec.storage.secretRef")
    except StoreURLError as exc:
        errors.add(f"{path}.url", str(exc))
        return None
    scheme = urlsplit(url).scheme.lower()
    if secret_raw is None:
        return StorageSpec(url=url, store=parsed)
    secret = read_mapping(secret_raw, f"{path}.secretRef", errors)
    name = read_string(secret, "name", f"{path}.secretRef", errors, required=True, max_length=253)
    if name is not None and not _DNS_SUBDOMAIN.fullmatch(name):
        errors.add(f"{path}.secretRef.name", f"{name!r} is not a Secret name")
    credentials = CREDENTIALS.get(scheme, ())
    if not credentials:
        errors.add(f"{path}.secretRef", f"{scheme}:// stores take no credentials")
        return None
    keys_raw = read_mapping(secret.get("keys"), f"{path}.secretRef.keys", errors)
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


def _secret_key(keys: Mapping[str, Any], name: str, path: str, errors: FieldErrors) -> str | None:
    key = read_string(keys, name, path, errors, max_length=253)
    if key is not None and not _SECRET_KEY.fullmatch(key):
        errors.add(f"{path}.{name}", f"{key!r} is not a Secret key ([-._a-zA-Z0-9]+)")
        return None
    return key


def _parse_resources(raw: Any, path: str, errors: FieldErrors) -> Resources:
    section = read_mapping(raw, path, errors)
    out: dict[str, dict[str, str]] = {}
    for part in ("limits", "requests"):
        values = read_mapping(section.get(part), f"{path}.{part}", errors)
        parsed: dict[str, str] = {}
        for name, value in values.items():
            if check(str(name), resource_name_problem, f"{path}.{part}", errors, what="resource name"):
                continue
            text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
            if not isinstance(text, str) or not QUANTITY.fullmatch(text):
                errors.add(f"{path}.{part}.{name}", f"{shown(value)} is not a resource quantity")
                continue
            parsed[str(name)] = text
        out[part] = parsed
    _check_requests(out["requests"], out["limits"], path, errors)
    return Resources(limits=out["limits"], requests=out["requests"])


def parse_resources(raw: Any, path: str) -> Resources:
    """``{requests, limits}`` as in a container (an operator setting named ``path``); raises :class:`InvalidSpec`."""
    errors = FieldErrors()
    resources = _parse_resources(raw, path, errors)
    if errors.items:
        raise InvalidSpec(errors.items)
    return resources


def read_store_url(url: str, secret_setting: str) -> StoreURL:
    """The parsed store URL of a CompileCache or of the operator's default store; raises
    :class:`StoreURLError` (its message masked) when it names no store or carries user info, whose
    credentials belong in the Secret that ``secret_setting`` names."""
    parsed = parse_store_url(url)
    if getattr(parsed, "password", None) or getattr(parsed, "username", None) or "@" in url:
        raise StoreURLError(f"must not carry user info (a user name, token or password): put credentials in the "
                            f"Secret named by {secret_setting}")
    return parsed


def parse_ca_setting(raw: Any, url: str, path: str) -> Mapping[str, Any] | None:
    """A store CA as ``spec.storage.ca`` says it, for the store ``url`` (an operator setting named ``path``);
    raises :class:`InvalidSpec`."""
    errors = FieldErrors()
    try:
        store: StoreURL | None = parse_store_url(url)
    except ValueError:
        store = None  # parse_store_ca says what the URL must be
    source = store_ca.parse_store_ca(raw, store, path, errors)
    if errors.items:
        raise InvalidSpec(errors.items)
    return source


def _check_requests(requests: Mapping[str, str], limits: Mapping[str, str], path: str, errors: FieldErrors) -> None:
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


def _parse_warmup(raw: Mapping[str, Any], defaults: Defaults, errors: FieldErrors) -> WarmupSpec:
    path = "spec.warmup"
    resources = _parse_resources(raw.get("resources"), f"{path}.resources", errors).or_else(defaults.warmup_resources)
    helpers = _parse_resources(raw.get("helperResources"), f"{path}.helperResources", errors)
    selector = _parse_node_selector(raw.get("nodeSelector"), f"{path}.nodeSelector", errors)
    tolerations = _parse_tolerations(raw.get("tolerations"), f"{path}.tolerations", errors)
    gpu_resource = read_string(raw, "gpuResourceName", path, errors, max_length=317) or DEFAULT_GPU_RESOURCE
    if not check(gpu_resource, qualified_name_problem, f"{path}.gpuResourceName", errors):
        check(gpu_resource, extended_resource_problem, f"{path}.gpuResourceName", errors)
    account = read_string(raw, "serviceAccountName", path, errors, max_length=253)
    if account is not None and not _DNS_SUBDOMAIN.fullmatch(account):
        errors.add(f"{path}.serviceAccountName", f"{account!r} is not a ServiceAccount name")
    pull_secrets: list[str] = []
    for i, item in enumerate(read_list(raw.get("imagePullSecrets"), f"{path}.imagePullSecrets", errors)):
        secret_name = read_string(read_mapping(item, f"{path}.imagePullSecrets[{i}]", errors), "name",
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
        backoff_limit=read_integer(raw, "backoffLimit", path, errors, 2, low=0, high=10),
        active_deadline_seconds=read_integer(raw, "activeDeadlineSeconds", path, errors, 3600, low=1,
                                         high=MAX_ACTIVE_DEADLINE_SECONDS),
        gpu_resource_name=gpu_resource,
        gpus_per_job=read_integer(raw, "gpusPerJob", path, errors, 1, low=0, high=16),
        service_account_name=account,
        automount_service_account_token=read_boolean(raw, "automountServiceAccountToken", path, errors, False),
        image_pull_secrets=tuple(pull_secrets),
        env=warmup_inputs.parse_env(raw.get("env"), f"{path}.env", errors),
        volumes=volumes,
        volume_mounts=warmup_inputs.parse_volume_mounts(
            raw.get("volumeMounts"), f"{path}.volumeMounts", volumes, errors
        ),
        **_parse_warmup_ids(raw.get("securityContext"), f"{path}.securityContext", errors),
        read_only_root_filesystem=read_boolean(raw, "readOnlyRootFilesystem", path, errors, True),
    )


def _parse_warmup_ids(raw: Any, path: str, errors: FieldErrors) -> dict[str, int]:
    """uid, gid and fsGroup of the warm-up pod; 0 (root) is refused: the Job must pass "restricted"."""
    context = read_mapping(raw, path, errors)
    return {
        field_name: read_integer(context, key, path, errors, DEFAULT_WARMUP_ID, low=1, high=MAX_ID)
        for key, field_name in (("runAsUser", "run_as_user"), ("runAsGroup", "run_as_group"), ("fsGroup", "fs_group"))
    }


def _parse_tolerations(raw: Any, path: str, errors: FieldErrors) -> tuple[Mapping[str, Any], ...]:
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(read_list(raw, path, errors)):
        ipath = f"{path}[{i}]"
        entry = read_mapping(item, ipath, errors)
        toleration: dict[str, Any] = {}
        for name, longest, problem in (("key", 317, qualified_name_problem), ("value", 63, label_value_problem)):
            value = read_string(entry, name, ipath, errors, max_length=longest)
            if value is not None and not check(value, problem, f"{ipath}.{name}", errors):
                toleration[name] = value
        operator = read_enum(entry, "operator", ipath, errors, TOLERATION_OPERATORS, None)
        effect = read_enum(entry, "effect", ipath, errors, TOLERATION_EFFECTS, None)
        if operator:
            toleration["operator"] = operator
        if effect:
            toleration["effect"] = effect
        if "tolerationSeconds" in entry:
            toleration["tolerationSeconds"] = read_integer(entry, "tolerationSeconds", ipath, errors, 0, low=0,
                                                       high=MAX_TOLERATION_SECONDS)
        if operator == "Exists" and "value" in toleration:
            errors.add(f"{ipath}.value", "must be unset when operator is Exists")
        if "key" not in entry and operator != "Exists":
            errors.add(f"{ipath}.key", "required unless operator is Exists")
        if "tolerationSeconds" in entry and entry.get("effect") != "NoExecute":
            errors.add(f"{ipath}.tolerationSeconds", "only allowed with effect NoExecute")
        out.append(toleration)
    return tuple(out)


def _parse_remote_cache(raw: Any, errors: FieldErrors) -> RemoteCacheSpec | None:
    if raw is None:
        return None
    path = "spec.remoteCache"
    remote = read_mapping(raw, path, errors)
    host = read_string(remote, "host", path, errors, required=True, max_length=253)
    if host is not None:
        check(host, host_problem, f"{path}.host", errors)
    return RemoteCacheSpec(
        host=host or "",
        port=read_integer(remote, "port", path, errors, 6379, low=1, high=65535),
        fx_graph=read_boolean(remote, "fxGraph", path, errors, True),
        autograd=read_boolean(remote, "autograd", path, errors, True),
        autotune=read_boolean(remote, "autotune", path, errors, True),
    )


def _parse_preload(raw: Mapping[str, Any], defaults: Defaults, errors: FieldErrors) -> PreloadSpec:
    path = "spec.preload"
    node_cache = read_mapping(raw.get("nodeCache"), f"{path}.nodeCache", errors)
    host_path = read_string(node_cache, "hostPath", f"{path}.nodeCache", errors, required="nodeCache" in raw)
    if host_path is not None:
        check(host_path, lambda p: node_path_problem(p, defaults.node_cache_roots), f"{path}.nodeCache.hostPath",
               errors)
    max_bytes = read_integer(raw, "maxBytes", path, errors, -1, low=0) if "maxBytes" in raw else None
    deadline = read_integer(raw, "deadlineSeconds", path, errors, DEFAULT_PRELOAD_DEADLINE_SECONDS,
                        low=1, high=MAX_PRELOAD_DEADLINE_SECONDS)
    size_limit = read_string(raw, "sizeLimit", path, errors, max_length=64) or DEFAULT_PRELOAD_SIZE_LIMIT
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
    mode = read_enum(raw, "mode", path, errors, PRELOAD_MODES, INIT_CONTAINER) or INIT_CONTAINER
    strict = read_boolean(raw, "strict", path, errors, False)
    if mode == SIDECAR and strict:
        errors.add(
            f"{path}.strict",
            f"must be false with {path}.mode {SIDECAR}: a sidecar runs beside the workload and cannot hold the "
            f"pod's start (set {path}.mode {INIT_CONTAINER} for a strict preload)",
        )
    on_predicted_cold = read_enum(raw, "onPredictedCold", path, errors, ON_PREDICTED_COLD, WARN) or WARN
    return PreloadSpec(
        on_predicted_cold=on_predicted_cold,
        mode=mode,
        strict=strict,
        max_bytes=max_bytes,
        node_cache_path=host_path or defaults.node_cache_path,
        resources=resources,
        deadline_seconds=deadline,
        size_limit=size_limit,
        size_limit_bytes=size_limit_bytes,
    )


def _parse_node_selector(raw: Any, path: str, errors: FieldErrors) -> dict[str, str]:
    """Label keys and values, as a Pod's nodeSelector takes them."""
    selector = read_string_map(raw, path, errors)
    if len(selector) > MAX_NODE_SELECTOR:
        errors.add(path, f"at most {MAX_NODE_SELECTOR} labels, got {len(selector)}")
        return {}
    good: dict[str, str] = {}
    for key, value in selector.items():
        bad_key = check(key, qualified_name_problem, path, errors, what="label key")
        if not bad_key and not check(value, label_value_problem, f"{path}.{key}", errors):
            good[key] = value
    return good

