"""What a CompileCache may point at, as the cluster admin allowed it (pure functions).

Whoever may create a CompileCache chooses the store its bundles go to, a Secret of the namespace
whose values are sent to that store (as the Redis password or S3 keys, by the publish container,
every preload and the operator itself), and the ServiceAccount its warm-up pod runs as. Without
limits, "create CompileCache" would mean "read any Secret of this namespace and send it anywhere".
The operator therefore accepts only:

- stores whose destination is on the allow-list (``--allowed-store-hosts``): a Redis or S3-endpoint
  host (``redis.cache.svc``, with ``:port`` to pin the port, ``*.cache.svc`` for a domain), an S3
  bucket without endpoint (``s3://bucket``), a file store root (``file:///shared/cache``); the same list holds
  PyTorch's own remote cache (``spec.remoteCache``: a Redis the warm-up and every opted-in pod read compiled
  entries from, which torch loads and runs unsigned), as ``host:port``;
- credentials Secrets on the allow-list (``--allowed-store-secrets``): ``NAME`` in any namespace or
  ``NAMESPACE/NAME``;
- warm-up ServiceAccounts on the allow-list (``--allowed-warmup-service-accounts``), same forms.

The warm-up's compile container runs the user's own code, so every Secret it can reach is one its author can
read. Each is checked too:

- Secrets the compile container reads (``--allowed-warmup-secrets``): ``spec.warmup.env[].valueFrom.secretKeyRef``
  and ``spec.warmup.volumes[].secret``;
- Secrets the kubelet pulls the image with (``--allowed-warmup-pull-secrets``): ``spec.warmup.imagePullSecrets``
  (the operator's own ``--image-pull-secrets`` are always allowed);
- the API token of the warm-up's ServiceAccount (``--allowed-warmup-service-account-tokens``): the pod mounts
  none unless ``spec.warmup.automountServiceAccountToken`` asks for it and the ServiceAccount is on this list.

The CRD offers no other way in (no ``envFrom``, no ``projected`` volume, no ``serviceAccountToken`` source: the
schema prunes them and the operator refuses them). A Secret allowed as store credentials is not thereby readable by
the warm-up: the publish container, not the user's code, holds those.

A list that is not configured (None) confines nothing; an empty one allows nothing. A CompileCache
outside the lists is ``InvalidSpec``: no Job is created and no pod is given its Secret.

Per namespace, the lists grow by *grants*: ConfigMaps labelled ``compilecache.io/allow`` in the operator's own
namespace (so only who may write there, the cluster's or that namespace's admins, can grant), each naming
``namespaces`` and the ``storeHosts``, ``storeSecrets``, ``warmupSecrets`` and ``warmupPullSecrets`` (comma- or
line-separated) their CompileCaches may use besides the operator's lists: a new team needs no change of the
operator's flags. A Secret granted is that namespace's Secret of the name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from cachelib.stores import StoreURLError
from cachelib.stores.urls import FileStoreURL, RedisStoreURL, S3StoreURL, StoreURL, parse_store_url
from compilecache_operator.model.spec import CacheSpec, FieldError, InvalidSpec, WarmupSpec
from compilecache_operator.model.warmup_inputs import secrets_read

ANY = "*"
ALLOW_LABEL = "compilecache.io/allow"
"""The label of the ConfigMaps (in the operator's namespace) that grant stores and Secrets to namespaces."""
GRANT_KEYS = ("namespaces", "storeHosts", "storeSecrets", "warmupSecrets", "warmupPullSecrets")
DEFAULT_SERVICE_ACCOUNT = "default"
"""The ServiceAccount a pod runs as when it names none."""
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SECRET = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class Grant:
    """One ConfigMap's grant: what CompileCaches of ``namespaces`` may use besides the operator's lists."""

    source: str
    namespaces: tuple[str, ...]
    store_hosts: tuple[str, ...] = ()
    store_secrets: tuple[str, ...] = ()
    warmup_secrets: tuple[str, ...] = ()
    warmup_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Confinement:
    store_hosts: tuple[str, ...] | None = None
    store_secrets: tuple[str, ...] | None = None
    warmup_service_accounts: tuple[str, ...] | None = None
    warmup_secrets: tuple[str, ...] | None = None
    """Secrets a warm-up's compile container may read (env ``secretKeyRef``, ``secret`` volumes)."""
    warmup_pull_secrets: tuple[str, ...] | None = None
    """Secrets a warm-up's image may be pulled with (``spec.warmup.imagePullSecrets``)."""
    warmup_service_account_tokens: tuple[str, ...] | None = None
    """ServiceAccounts whose API token a warm-up pod may mount (``spec.warmup.automountServiceAccountToken``)."""
    grants: tuple[Grant, ...] = ()

    def for_namespace(self, namespace: str) -> Confinement:
        """The lists for CompileCaches of ``namespace``: the operator's, plus what grants give it (a list that
        is not configured stays so: it confines nothing anyway)."""
        mine = [g for g in self.grants if namespace in g.namespaces]
        if not mine:
            return self

        def grown(base: tuple[str, ...] | None, extra: Iterable[str]) -> tuple[str, ...] | None:
            return None if base is None else tuple(dict.fromkeys([*base, *extra]))

        return replace(
            self,
            store_hosts=grown(self.store_hosts, (h for g in mine for h in g.store_hosts)),
            store_secrets=grown(self.store_secrets, (f"{namespace}/{s}" for g in mine for s in g.store_secrets)),
            warmup_secrets=grown(self.warmup_secrets, (f"{namespace}/{s}" for g in mine for s in g.warmup_secrets)),
            warmup_pull_secrets=grown(self.warmup_pull_secrets,
                                      (f"{namespace}/{s}" for g in mine for s in g.warmup_pull_secrets)),
            grants=(),
        )

    def namespaces_granted(self) -> frozenset[str]:
        return frozenset(ns for g in self.grants for ns in g.namespaces)


def _items(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i.strip() for i in re.split(r"[,\n]", text) if i.strip()))


def grant_from_configmap(configmap: Mapping[str, object]) -> Grant:
    """A labelled ConfigMap as a :class:`Grant`; raises ValueError naming the ConfigMap and the key at fault."""
    raw_meta = configmap.get("metadata")
    meta: Mapping[str, object] = raw_meta if isinstance(raw_meta, Mapping) else {}
    name = f"ConfigMap {meta.get('namespace', '')}/{meta.get('name', '')}"
    data = configmap.get("data") or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{name}: data must map keys to text")
    unknown = sorted(set(data) - set(GRANT_KEYS))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {', '.join(unknown)} (expected {', '.join(GRANT_KEYS)})")
    namespaces = _items(str(data.get("namespaces", "")))
    if not namespaces:
        raise ValueError(f"{name}: data.namespaces names no namespace")
    for namespace in namespaces:
        if len(namespace) > 63 or not _NAME.fullmatch(namespace):
            raise ValueError(f"{name}: data.namespaces: {namespace!r} is not a namespace name")
    hosts = _items(str(data.get("storeHosts", "")))
    if ANY in hosts:
        raise ValueError(f"{name}: data.storeHosts: '*' cannot be granted per namespace (the operator's own list "
                         "may allow any store)")
    secrets = {key: _secret_names(name, data, key) for key in ("storeSecrets", "warmupSecrets", "warmupPullSecrets")}
    return Grant(source=name, namespaces=namespaces, store_hosts=hosts, store_secrets=secrets["storeSecrets"],
                 warmup_secrets=secrets["warmupSecrets"], warmup_pull_secrets=secrets["warmupPullSecrets"])


def _secret_names(source: str, data: Mapping[str, object], key: str) -> tuple[str, ...]:
    """The Secret names of one key of a grant; raises ValueError naming the ConfigMap, the key and the name."""
    secrets = _items(str(data.get(key, "")))
    for secret in secrets:
        if len(secret) > 253 or not _SECRET.fullmatch(secret):
            raise ValueError(f"{source}: data.{key}: {secret!r} is not a Secret name")
    return secrets


def grants_from(configmaps: Iterable[Mapping[str, object]]) -> tuple[tuple[Grant, ...], list[str]]:
    """The grants of the labelled ConfigMaps, sorted by source, and one message per ConfigMap refused (it grants
    nothing; the others still do)."""
    grants, refused = [], []
    for configmap in configmaps:
        try:
            grants.append(grant_from_configmap(configmap))
        except ValueError as exc:
            refused.append(str(exc))
    return tuple(sorted(grants, key=lambda g: g.source)), refused


def store_destination(url: str | StoreURL) -> str:
    """Where a store URL (a string, or one parsed) sends data: ``host:port`` (Redis, S3 endpoint),
    ``s3://bucket`` (AWS S3 by its bucket), ``file:///root``. Raises :class:`cachelib.stores.StoreURLError`
    for a bad URL."""
    parsed = parse_store_url(url) if isinstance(url, str) else url
    if isinstance(parsed, RedisStoreURL):
        return f"{parsed.host.lower()}:{parsed.port}"
    if isinstance(parsed, S3StoreURL):
        if not parsed.endpoint:
            return f"s3://{parsed.bucket}"
        endpoint = urlsplit(parsed.endpoint)
        port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
        return f"{(endpoint.hostname or '').lower()}:{port}"
    assert isinstance(parsed, FileStoreURL)
    return f"file://{parsed.root}"


def destination_allowed(destination: str, patterns: Sequence[str]) -> bool:
    """Whether ``destination`` (from :func:`store_destination`) matches one of ``patterns``."""
    for pattern in patterns:
        pattern = pattern.strip()
        if pattern == ANY:
            return True
        if pattern.startswith("file://"):
            root = pattern.rstrip("/")
            if destination == root or destination.startswith(root + "/"):
                return True
            continue
        if pattern.startswith("s3://") or destination.startswith(("s3://", "file://")):
            if destination == pattern.rstrip("/"):
                return True
            continue
        host, _, port = destination.rpartition(":")
        want_host, sep, want_port = pattern.lower().partition(":")
        if sep and want_port != port:
            continue
        if want_host.startswith("*."):
            if host.endswith(want_host[1:]):
                return True
        elif host == want_host:
            return True
    return False


def name_allowed(namespace: str, name: str, allowed: Sequence[str]) -> bool:
    """``name`` of ``namespace`` against entries ``NAME``, ``NAMESPACE/NAME`` or ``*``."""
    return any(entry in (ANY, name, f"{namespace}/{name}") for entry in (e.strip() for e in allowed))


def problems(
    confinement: Confinement,
    namespace: str,
    *,
    store_url: str | StoreURL,
    secret_name: str | None,
    service_account: str | None,
    remote_cache: tuple[str, int] | None = None,
) -> list[FieldError]:
    """The field path and what is wrong of each choice of the CompileCache outside the allow-lists
    (``remote_cache``: the host and port of ``spec.remoteCache``)."""
    confinement = confinement.for_namespace(namespace)
    found: list[FieldError] = []
    if confinement.store_hosts is not None:
        hosts = ", ".join(confinement.store_hosts) or "none"
        try:
            destination = store_destination(store_url)
        except StoreURLError as exc:
            return [FieldError("spec.storage.url", str(exc))]
        if not destination_allowed(destination, confinement.store_hosts):
            what = f"store {destination} is not on the operator's allow-list ({hosts})"
            found.append(FieldError("spec.storage.url", what))
        if remote_cache is not None:
            remote = f"{remote_cache[0].lower()}:{remote_cache[1]}"
            if not destination_allowed(remote, confinement.store_hosts):
                found.append(FieldError("spec.remoteCache.host", f"remote cache {remote} is not on the operator's "
                                                                 f"allow-list ({hosts})"))
    if secret_name and (allowed := _outside(confinement.store_secrets, namespace, secret_name)) is not None:
        found.append(FieldError(
            "spec.storage.secretRef.name",
            f"Secret {secret_name!r} is not allowed as store credentials (the cluster admin allows: {allowed})",
        ))
    if service_account and (
        allowed := _outside(confinement.warmup_service_accounts, namespace, service_account)
    ) is not None:
        found.append(FieldError(
            "spec.warmup.serviceAccountName",
            f"ServiceAccount {service_account!r} is not allowed for warm-ups (the cluster admin allows: {allowed})",
        ))
    return found


def _outside(allowed: Sequence[str] | None, namespace: str, name: str) -> str | None:
    """The allow-list as a refusal shows it when ``name`` of ``namespace`` is outside it; None when it is allowed
    (or the list is not configured)."""
    if allowed is None or name_allowed(namespace, name, allowed):
        return None
    return ", ".join(allowed) or "none"


def warmup_problems(confinement: Confinement, namespace: str, warmup: WarmupSpec) -> list[FieldError]:
    """The field path and what is wrong of each Secret the warm-up pod would reach outside the allow-lists: a
    Secret its compile container reads, one its image is pulled with, its ServiceAccount's API token."""
    confinement = confinement.for_namespace(namespace)
    found: list[FieldError] = []
    for path, secret in secrets_read(warmup.env, warmup.volumes, "spec.warmup"):
        if (allowed := _outside(confinement.warmup_secrets, namespace, secret)) is not None:
            found.append(FieldError(path, f"Secret {secret!r} is not allowed for warm-ups to read (the cluster "
                                          f"admin allows: {allowed})"))
    for i, secret in enumerate(warmup.image_pull_secrets):
        if (allowed := _outside(confinement.warmup_pull_secrets, namespace, secret)) is not None:
            found.append(FieldError(f"spec.warmup.imagePullSecrets[{i}].name",
                                    f"Secret {secret!r} is not allowed as an image pull Secret of warm-ups (the "
                                    f"cluster admin allows: {allowed})"))
    account = warmup.service_account_name or DEFAULT_SERVICE_ACCOUNT
    if warmup.automount_service_account_token and (
        allowed := _outside(confinement.warmup_service_account_tokens, namespace, account)
    ) is not None:
        found.append(FieldError("spec.warmup.automountServiceAccountToken",
                                f"the API token of ServiceAccount {account!r} is not allowed in warm-ups (the "
                                f"cluster admin allows the tokens of: {allowed})"))
    return found


def check_confinement(confinement: Confinement, namespace: str, spec: CacheSpec) -> None:
    """Raise :class:`InvalidSpec` naming every field of ``spec`` outside the allow-lists."""
    found = problems(
        confinement,
        namespace,
        store_url=spec.storage.store or spec.storage.url,
        secret_name=spec.storage.secret_name,
        service_account=spec.warmup.service_account_name,
        remote_cache=(spec.remote_cache.host, spec.remote_cache.port) if spec.remote_cache is not None else None,
    )
    found += warmup_problems(confinement, namespace, spec.warmup)
    if found:
        raise InvalidSpec(found)
