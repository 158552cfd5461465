"""``compilecache-operator``: the command line that starts the operator.

Every flag has an environment equivalent (``COMPILECACHE_<FLAG>``, dashes as underscores);
a flag given on the command line wins over the environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import kopf
from prometheus_client import start_http_server

from cachelib import __version__
from cachelib.in_image.masking import install_log_masking, mask_text
from cachelib.stores import StoreURLError
from compilecache_operator import handlers
from compilecache_operator.controller.state import Settings, State
from compilecache_operator.decisions.warmup_job import JobSettings
from compilecache_operator.edge import certs, kopfadapter, servingcert, tlsreload
from compilecache_operator.edge.metrics import Metrics
from compilecache_operator.edge.signing import SigningKeyError, load_signing
from compilecache_operator.lifecycle import Admission, Election, Intervals, Probes, Runtime, SigningSecret
from compilecache_operator.model.confinement import Confinement, store_destination
from compilecache_operator.model.formats import DEFAULT_NODE_CACHE_ROOTS, node_path_problem
from compilecache_operator.model.names import GROUP
from compilecache_operator.model.podsecurity import LEVELS, PRIVILEGED
from compilecache_operator.model.sidecars import SWITCH_VALUES
from compilecache_operator.model.spec import (
    DEFAULT_GPU_LABEL_KEY,
    DEFAULT_HELPER_RESOURCES,
    DEFAULT_PRELOAD_RESOURCES,
    DEFAULT_WARMUP_RESOURCES,
    Defaults,
    InvalidSpec,
    Resources,
)
from compilecache_operator.model.spec_parse import parse_ca_setting, parse_resources, read_store_url
from compilecache_operator.model.store_access import SecretReader
from compilecache_operator.model.store_ca import STORE_CA_FILE

WEBHOOK_MODES = ("managed", "external", "off")
OWNED_LABELS = {"app.kubernetes.io/managed-by": "compilecache-operator"}
"""Labels of the Secrets the operator creates."""
RESOURCE_SETTINGS = (
    ("warmup-resources", "the warm-up's compile container (spec.warmup.resources)", DEFAULT_WARMUP_RESOURCES),
    ("warmup-helper-resources", "the warm-up's harness and publish containers (spec.warmup.helperResources)",
     DEFAULT_HELPER_RESOURCES),
    ("preload-resources", "the injected preload (spec.preload.resources)", DEFAULT_PRELOAD_RESOURCES),
)
"""The operator's flags for the requests and limits of the containers it creates, and their built-in defaults."""
LOG_FORMATS = ("text", "json")


def _version() -> str:
    """The release's version (pyproject.toml's, checked by scripts/release.py): the images' tag."""
    return __version__


def _env(name: str) -> str | None:
    value = os.environ.get(f"COMPILECACHE_{name}")
    return value if value not in (None, "") else None


def _env_int(name: str, default: int) -> int:
    value = _env(name)
    return int(value) if value is not None else default


def _env_float(name: str, default: float) -> float:
    value = _env(name)
    return float(value) if value is not None else default


def _env_bool(name: str) -> bool:
    return (_env(name) or "").lower() in ("1", "true", "yes", "on")


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compilecache-operator",
        description="The compilecache operator: CompileCache warm-up Jobs, the pod-injection webhook, metrics.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=None, metavar="NS",
                       help="watch this namespace (repeatable; env COMPILECACHE_NAMESPACE, comma-separated)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", default=_env_bool("ALL_NAMESPACES"),
                       help="watch every namespace (the default when no namespace is given)")
    p.add_argument("--metrics-port", type=int, default=_env_int("METRICS_PORT", 8080),
                   help="port of the Prometheus /metrics endpoint; 0 turns it off (default 8080)")
    p.add_argument("--metrics-address", default=_env("METRICS_ADDRESS") or "0.0.0.0",
                   help="address the metrics endpoint listens on (default 0.0.0.0)")
    p.add_argument("--health-port", type=int, default=_env_int("HEALTH_PORT", 8081),
                   help="port of the liveness (/healthz) and readiness (/readyz: the namespaces listed, the webhook "
                        "listening) endpoints; 0 turns them off (default 8081)")
    p.add_argument("--health-address", default=_env("HEALTH_ADDRESS") or "0.0.0.0",
                   help="address the liveness and readiness endpoints listen on (default 0.0.0.0)")
    p.add_argument("--webhook-config", choices=WEBHOOK_MODES, default=_env("WEBHOOK_CONFIG") or "external",
                   help="managed: the operator writes the MutatingWebhookConfiguration itself (pointing at "
                        "--webhook-host:--webhook-port); external: it is installed separately (the Helm chart); "
                        "off: no webhook server (default external)")
    p.add_argument("--webhook-port", type=int, default=_env_int("WEBHOOK_PORT", 9443),
                   help="port of the HTTPS webhook server (default 9443)")
    p.add_argument("--webhook-listen-address", default=_env("WEBHOOK_LISTEN_ADDRESS") or "0.0.0.0",
                   help="address the webhook server listens on (default 0.0.0.0)")
    p.add_argument("--webhook-host", default=_env("WEBHOOK_HOST"),
                   help="host name or IP the API server reaches the webhook at: put into the managed "
                        "configuration's URL and the self-signed certificate")
    p.add_argument("--webhook-cert-dir", type=Path, default=_env("WEBHOOK_CERT_DIR"),
                   help="directory with tls.crt, tls.key and optionally ca.crt (a kubernetes.io/tls Secret); "
                        "without it a self-signed CA and certificate are generated")
    p.add_argument("--webhook-cert-secret", default=_env("WEBHOOK_CERT_SECRET"), metavar="NAME",
                   help="keep the serving certificate in this Secret of the operator's namespace: the leader creates "
                        "it (a CA and a certificate), rotates it before it expires (the new CA trusted beside the "
                        "old during the switch) and writes the CA into the --webhook-ca-inject configurations; "
                        "every replica serves what it holds")
    p.add_argument("--webhook-ca-inject", default=_env("WEBHOOK_CA_INJECT") or "", metavar="NAMES",
                   help="comma-separated names of the Mutating- and ValidatingWebhookConfigurations whose caBundle "
                        "the leader keeps (with --webhook-cert-secret)")
    p.add_argument("--webhook-cert-validity-days", type=float, default=_env_float("WEBHOOK_CERT_VALIDITY_DAYS", 365.0),
                   help="life of each certificate made with --webhook-cert-secret (default 365)")
    p.add_argument("--webhook-cert-renew-before-days", type=float,
                   default=_env_float("WEBHOOK_CERT_RENEW_BEFORE_DAYS", 30.0),
                   help="start a rotation when less than this is left of the certificate's life (default 30)")
    p.add_argument("--webhook-cert-overlap-seconds", type=float,
                   default=_env_float("WEBHOOK_CERT_OVERLAP_SECONDS", 120.0),
                   help="how long each step of a rotation waits for the previous one to reach every replica "
                        "and the API server (default 120)")
    p.add_argument("--webhook-cert-check-seconds", type=float, default=_env_float("WEBHOOK_CERT_CHECK_SECONDS", 10.0),
                   help="how often the certificate (files of --webhook-cert-dir, or the Secret) is looked at "
                        "for a renewal, which is loaded without a restart (default 10)")
    p.add_argument("--webhook-config-name", default=_env("WEBHOOK_CONFIG_NAME"),
                   help="name of the managed MutatingWebhookConfiguration (default compilecache.io, or "
                        "<namespace>.compilecache.io when watching one namespace)")
    preloader = _env("PRELOADER_IMAGE") or f"ghcr.io/compilecache/preloader:{_version()}"
    p.add_argument("--preloader-image", default=preloader,
                   help="image of the preload init container and of the warm-up's harness and publish steps")
    p.add_argument("--image-pull-secrets", default=_env("IMAGE_PULL_SECRETS") or "",
                   help="comma-separated pull Secrets added to warm-up pods (for the preloader image)")
    p.add_argument("--gpu-label-key", default=_env("GPU_LABEL_KEY") or DEFAULT_GPU_LABEL_KEY,
                   help=f"Node label with the GPU product when a spec does not say (default {DEFAULT_GPU_LABEL_KEY})")
    p.add_argument("--node-cache-path", default=_env("NODE_CACHE_PATH"),
                   help="default hostPath directory for pod caches when a spec does not set preload.nodeCache "
                        "(default: an emptyDir per pod)")
    p.add_argument("--allowed-node-cache-paths", default=_env("ALLOWED_NODE_CACHE_PATHS"),
                   help="comma-separated directories (and what is below them) a CompileCache's "
                        "spec.preload.nodeCache.hostPath may name; system directories (/, /etc, /var/lib/kubelet, "
                        f"...) never (default: {','.join(DEFAULT_NODE_CACHE_ROOTS)})")
    p.add_argument("--pod-security-default", choices=LEVELS, default=_env("POD_SECURITY_DEFAULT") or PRIVILEGED,
                   help="the Pod Security level the API server enforces in a namespace without the "
                        "pod-security.kubernetes.io/enforce label (its admission configuration's default): where a "
                        "level refuses a node cache (baseline, restricted), pods preload into their own emptyDir "
                        f"(default {PRIVILEGED})")
    p.add_argument("--native-sidecars", default=_env("NATIVE_SIDECARS") or "auto", metavar="{auto,on,off}",
                   help="run the preload of caches with spec.preload.mode Sidecar as a native sidecar: auto when the "
                        "API server is 1.29 or newer; on for a 1.28 cluster with the SidecarContainers gate, or one "
                        "whose version misleads; off never (default auto)")
    for flag, what, default in RESOURCE_SETTINGS:
        p.add_argument(f"--{flag}", default=_env(flag.upper().replace("-", "_")), metavar="JSON",
                       help=f"requests and limits of {what} when a CompileCache sets none, as JSON "
                            f"(default {json.dumps(default.to_dict(), sort_keys=True)})")
    p.add_argument("--default-storage-url", default=_env("DEFAULT_STORAGE_URL"),
                   help="store URL for CompileCaches without spec.storage")
    p.add_argument("--default-storage-ca", default=_env("DEFAULT_STORAGE_CA"), metavar="JSON",
                   help="the default store's private CA, as spec.storage.ca says it: {\"secretName\" or "
                        "\"configMapName\": NAME, \"key\": KEY} of an object in each CompileCache's namespace (e.g. "
                        "one trust-manager distributes); mounted into the warm-ups and preloads of CompileCaches on "
                        "the default store. --default-storage-url must be rediss://…?ca=" + STORE_CA_FILE)
    p.add_argument("--default-storage-secret", default=_env("DEFAULT_STORAGE_SECRET"),
                   help="credentials Secret (in each CompileCache's namespace) used with --default-storage-url")
    p.add_argument("--operator-namespace",
                   default=_env("OPERATOR_NAMESPACE") or os.environ.get("POD_NAMESPACE"),
                   help="the operator's own namespace: its pods are never injected")
    p.add_argument("--secret-reader-role", default=_env("SECRET_READER_ROLE"), metavar="CLUSTERROLE",
                   help="the ClusterRole that lets the operator get Secrets, bound per namespace by a RoleBinding: "
                        "named in the SecretForbidden condition of a CompileCache whose storage Secret it may not "
                        "read, with the kubectl command that binds it (the chart's <fullname>-secret-reader)")
    p.add_argument("--service-account", default=_env("SERVICE_ACCOUNT"), metavar="NAMESPACE/NAME",
                   help="the operator's own ServiceAccount, for that command")
    p.add_argument("--resync-seconds", type=float, default=_env_float("RESYNC_SECONDS", 60.0),
                   help="how often each CompileCache is reconciled without a change (default 60)")
    p.add_argument("--retry-seconds", type=float, default=_env_float("RETRY_SECONDS", 30.0),
                   help="delay before looking again after a problem that may pass, e.g. a missing Secret (default 30)")
    p.add_argument("--signing-key-file", type=Path, default=_env("SIGNING_KEY_FILE"),
                   help="PEM Ed25519 private key that signs published bundles; every preload then accepts only "
                        "bundles signed by it or by a --trusted-public-keys key (default: bundles are unsigned)")
    p.add_argument("--signing-key-secret", default=_env("SIGNING_KEY_SECRET"), metavar="NAME",
                   help="keep the signing key in this Secret of the operator's namespace: the leader creates it once "
                        "and never replaces it; annotating it compilecache.io/rotate-signing-key=<anything> rotates "
                        "it, the previous key staying trusted (instead of --signing-key-file)")
    p.add_argument("--trusted-public-keys", default=_env("TRUSTED_PUBLIC_KEYS") or "",
                   help="comma-separated Ed25519 public keys (base64) preloads also accept: the previous "
                        "signing key during a rotation")
    p.add_argument("--allowed-store-hosts", default=_env("ALLOWED_STORE_HOSTS"),
                   help="comma-separated stores a CompileCache may use: host[:port], *.domain, s3://bucket, "
                        "file:///root, or * (default: not confined; the default store is always allowed)")
    p.add_argument("--allowed-store-secrets", default=_env("ALLOWED_STORE_SECRETS"),
                   help="comma-separated credentials Secrets a CompileCache may use: NAME (any namespace) or "
                        "NAMESPACE/NAME (default: not confined; --default-storage-secret is always allowed)")
    p.add_argument("--allowed-warmup-service-accounts", default=_env("ALLOWED_WARMUP_SERVICE_ACCOUNTS"),
                   help="comma-separated ServiceAccounts warm-ups may run as: NAME or NAMESPACE/NAME "
                        "(default: not confined)")
    p.add_argument("--allowed-warmup-secrets", default=_env("ALLOWED_WARMUP_SECRETS"),
                   help="comma-separated Secrets a warm-up's compile container may read (spec.warmup.env[].valueFrom."
                        "secretKeyRef, spec.warmup.volumes[].secret): NAME (any namespace) or NAMESPACE/NAME "
                        "(default: not confined)")
    p.add_argument("--allowed-warmup-pull-secrets", default=_env("ALLOWED_WARMUP_PULL_SECRETS"),
                   help="comma-separated Secrets a warm-up's image may be pulled with (spec.warmup.imagePullSecrets): "
                        "NAME or NAMESPACE/NAME (default: not confined; --image-pull-secrets are always allowed)")
    p.add_argument("--allowed-warmup-service-account-tokens", default=_env("ALLOWED_WARMUP_SERVICE_ACCOUNT_TOKENS"),
                   help="comma-separated ServiceAccounts whose API token a warm-up pod may mount when its spec asks "
                        "(spec.warmup.automountServiceAccountToken): NAME or NAMESPACE/NAME; a warm-up pod mounts no "
                        "token unless asked (default: not confined)")
    p.add_argument("--check-caches-at-admission", action="store_true", default=_env_bool("CHECK_CACHES_AT_ADMISSION"),
                   help="serve the CompileCache validating webhook: a create or spec change that would be InvalidSpec "
                        "(a bad field, or outside the allow-lists and every grant) is refused by the API server "
                        "with the message naming the field (needs the webhook server; default off)")
    p.add_argument("--leader-election-namespace", default=_env("LEADER_ELECTION_NAMESPACE"), metavar="NS",
                   help="run as one of several replicas: only the holder of a Lease in NS reconciles, deletes and "
                        "counts; every replica serves the webhook (default: alone, always acting)")
    p.add_argument("--leader-election-name", default=_env("LEADER_ELECTION_NAME") or "compilecache-operator",
                   help="name of that Lease (default compilecache-operator)")
    p.add_argument("--shutdown-delay", type=float, default=_env_float("SHUTDOWN_DELAY", 5.0),
                   help="seconds between SIGTERM (/readyz turns 503) and stopping, so that no admission reaches a "
                        "stopped webhook; keep it below the pod's terminationGracePeriodSeconds (default 5)")
    p.add_argument("--concurrency", type=int, default=_env_int("CONCURRENCY", 16),
                   help="how many CompileCaches are reconciled at once, e.g. when the operator starts (default 16)")
    p.add_argument("--log-format", choices=LOG_FORMATS, default=_env("LOG_FORMAT") or "text",
                   help="text or json (one JSON object per line)")
    p.add_argument("--verbose", "-v", action="store_true", default=_env_bool("VERBOSE"), help="debug logging")
    return p


@dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...]
    args: argparse.Namespace


Rule = Callable[[argparse.Namespace], str | None]
"""One rule the flags keep together: the error naming the flag, or None when they keep it."""


def _positive_concurrency(args: argparse.Namespace) -> str | None:
    return f"--concurrency: {args.concurrency} is not a positive number" if args.concurrency < 1 else None


def _port_numbers(args: argparse.Namespace) -> str | None:
    for name in ("metrics_port", "health_port", "webhook_port"):
        port = getattr(args, name)
        if not 0 <= port <= 65535:
            return f"--{name.replace('_', '-')}: {port} is not a port number"
    return None


def _native_sidecars_switch(args: argparse.Namespace) -> str | None:
    if args.native_sidecars in SWITCH_VALUES:
        return None
    return f"--native-sidecars: {args.native_sidecars!r} is not one of {', '.join(SWITCH_VALUES)}"


def _node_cache_paths(args: argparse.Namespace) -> str | None:
    for flag, paths in (("--allowed-node-cache-paths", _csv(args.allowed_node_cache_paths)),
                        ("--node-cache-path", [args.node_cache_path] if args.node_cache_path else [])):
        for path in paths:
            problem = node_path_problem(path, (path,))  # the format, and never a system directory
            if problem:
                return f"{flag}: {path!r} {problem}"
    return None


def _default_store_url(args: argparse.Namespace) -> str | None:
    """Refused at once, as each CompileCache's own store URL is checked."""
    if not args.default_storage_url:
        return None
    try:
        read_store_url(args.default_storage_url, "--default-storage-secret")
    except StoreURLError as exc:
        return f"--default-storage-url: {exc}"
    return None


def _service_account_name(args: argparse.Namespace) -> str | None:
    if args.service_account and not re.fullmatch(r"[a-z0-9][-a-z0-9.]*/[a-z0-9][-a-z0-9.]*", args.service_account):
        return f"--service-account: {args.service_account!r} is not NAMESPACE/NAME"
    return None


def _refused_when(condition: Callable[[argparse.Namespace], bool], message: str) -> Rule:
    return lambda args: message if condition(args) else None


RULES: tuple[Rule, ...] = (
    _positive_concurrency,
    _port_numbers,
    _native_sidecars_switch,
    _node_cache_paths,
    _default_store_url,
    _service_account_name,
    _refused_when(lambda a: bool(a.webhook_cert_secret or a.signing_key_secret) and not a.operator_namespace,
                  "--webhook-cert-secret and --signing-key-secret need --operator-namespace (their namespace)"),
    _refused_when(lambda a: bool(a.check_caches_at_admission) and a.webhook_config == "off",
                  "--check-caches-at-admission needs the webhook server (not --webhook-config off)"),
    _refused_when(lambda a: bool(a.webhook_cert_secret and a.webhook_cert_dir),
                  "--webhook-cert-secret and --webhook-cert-dir: choose one source of the serving certificate"),
    _refused_when(lambda a: bool(a.signing_key_secret and a.signing_key_file),
                  "--signing-key-secret and --signing-key-file: choose one source of the signing key"),
    _refused_when(lambda a: bool(a.webhook_cert_renew_before_days >= a.webhook_cert_validity_days),
                  "--webhook-cert-renew-before-days must be less than --webhook-cert-validity-days"),
)  # fmt: skip
"""Every rule of the flags, checked in this order; the first broken one is the error."""


def _read_json_flags(args: argparse.Namespace) -> None:
    """The JSON flags in place of their text (``--*-resources``, ``--default-storage-ca``); raises ValueError
    naming the flag."""
    for flag, _, default in RESOURCE_SETTINGS:
        attr = flag.replace("-", "_")
        setattr(args, attr, resources_setting(getattr(args, attr), f"--{flag}", default))
    args.default_storage_ca = default_storage_ca(args.default_storage_ca, args.default_storage_url)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = build_parser()
    args = parser.parse_args(argv)
    namespaces = tuple(args.namespace or ([] if args.all_namespaces else _csv(_env("NAMESPACE"))))
    broken = next((problem for problem in (rule(args) for rule in RULES) if problem), None)
    if broken:
        parser.error(broken)
    try:
        _read_json_flags(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.webhook_config == "external" and args.webhook_cert_dir is None and not args.webhook_cert_secret:
        logging.getLogger(__name__).warning(
            "--webhook-config external without --webhook-cert-dir: the self-signed certificate is not known "
            "to the API server"
        )
    return Options(namespaces=namespaces, args=args)


def resources_setting(text: str | None, flag: str, default: Resources) -> Resources:
    """A ``--*-resources`` flag's JSON (``{"requests": {...}, "limits": {...}}``), ``default`` when not given;
    raises ValueError naming the flag and what is wrong."""
    if text is None:
        return default
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        expected = '{"requests": {...}, "limits": {...}}'
        raise ValueError(f"{flag}: not JSON ({exc.msg}): expected {expected}") from exc
    try:
        return parse_resources(raw, flag)
    except InvalidSpec as exc:
        raise ValueError(str(exc)) from exc


def default_storage_ca(text: str | None, url: str | None) -> Mapping[str, Any] | None:
    """``--default-storage-ca`` checked as spec.storage.ca is, against ``--default-storage-url``; raises ValueError."""
    if text is None:
        return None
    if not url:
        raise ValueError("--default-storage-ca: needs --default-storage-url (the store the CA is for)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--default-storage-ca: not JSON ({exc.msg})") from exc
    try:
        return parse_ca_setting(raw, url, "--default-storage-ca")
    except InvalidSpec as exc:
        raise ValueError(str(exc)) from exc


def settings_from(options: Options) -> Settings:
    a = options.args
    return Settings(
        defaults=Defaults(
            gpu_label_key=a.gpu_label_key,
            storage_url=a.default_storage_url,
            storage_secret=a.default_storage_secret,
            storage_ca=a.default_storage_ca,
            node_cache_path=a.node_cache_path,
            node_cache_roots=node_cache_roots(a.allowed_node_cache_paths),
            warmup_resources=a.warmup_resources,
            helper_resources=a.warmup_helper_resources,
            preload_resources=a.preload_resources,
        ),
        jobs=JobSettings(preloader_image=a.preloader_image, image_pull_secrets=tuple(_csv(a.image_pull_secrets))),
        retry_seconds=a.retry_seconds,
        namespaces=options.namespaces,
        operator_namespace=a.operator_namespace,
        native_sidecars=a.native_sidecars,
        confinement=confinement_from(a),
        signing=load_signing(a.signing_key_file, _csv(a.trusted_public_keys)) if a.signing_key_file else None,
        concurrency=a.concurrency,
        secret_reader=SecretReader(a.secret_reader_role, a.service_account),
        pod_security_default=a.pod_security_default,
    )


def node_cache_roots(value: str | None) -> tuple[str, ...]:
    """``--allowed-node-cache-paths`` (checked by :func:`parse_args`: absolute, none of them a system directory)."""
    if value is None:
        return DEFAULT_NODE_CACHE_ROOTS
    return tuple(r.rstrip("/") or "/" for r in _csv(value))


def confinement_from(a: argparse.Namespace) -> Confinement:
    """The allow-lists; a list given always takes the default store and Secret, and the operator's own image pull
    Secrets, in."""

    def allowed(value: str | None, default: str | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        return tuple(dict.fromkeys([*_csv(value), *_csv(default)]))

    default_host = store_destination(a.default_storage_url) if a.default_storage_url else None
    return Confinement(
        store_hosts=allowed(a.allowed_store_hosts, default_host),
        store_secrets=allowed(a.allowed_store_secrets, a.default_storage_secret),
        warmup_service_accounts=allowed(a.allowed_warmup_service_accounts, None),
        warmup_secrets=allowed(a.allowed_warmup_secrets, None),
        warmup_pull_secrets=allowed(a.allowed_warmup_pull_secrets, a.image_pull_secrets),
        warmup_service_account_tokens=allowed(a.allowed_warmup_service_account_tokens, None),
    )


def admission_from(options: Options, scratch: Path, metrics: Metrics) -> Admission:
    a = options.args
    if a.webhook_config == "off":
        return Admission()
    names = [a.webhook_host or "", a.webhook_listen_address, "localhost", "127.0.0.1"]
    files = certs.from_directory(Path(a.webhook_cert_dir)) if a.webhook_cert_dir is not None \
        else certs.self_signed(names, scratch)  # until the Secret's certificate is read, with --webhook-cert-secret
    reloader = tlsreload.Reloader(files, metrics.set_webhook_cert_expiry)
    server = kopfadapter.AdmissionServer(addr=a.webhook_listen_address, port=a.webhook_port, host=a.webhook_host,
                                         context=reloader.context, cadata=(files.ca or files.cert).read_bytes())
    managed = None
    if a.webhook_config == "managed":
        default_name = f"{options.namespaces[0]}.{GROUP}" if len(options.namespaces) == 1 else GROUP
        managed = a.webhook_config_name or default_name
    serving = None
    if a.webhook_cert_secret:
        serving = servingcert.Target(
            namespace=a.operator_namespace, secret=a.webhook_cert_secret, hostnames=tuple(h for h in names if h),
            configs=tuple(_csv(a.webhook_ca_inject)), labels=OWNED_LABELS,
        )
    policy = servingcert.Policy(
        validity=timedelta(days=a.webhook_cert_validity_days),
        renew_before=timedelta(days=a.webhook_cert_renew_before_days),
        overlap=timedelta(seconds=a.webhook_cert_overlap_seconds),
    )
    return Admission(server=server, managed=managed, check_caches=a.check_caches_at_admission, reloader=reloader,
                     serving=serving, policy=policy, check_seconds=a.webhook_cert_check_seconds,
                     cert_ready=serving is None, watch_files=a.webhook_cert_dir is not None)


def run(options: Options) -> None:
    a = options.args
    kopf.configure(verbose=a.verbose, log_format=kopf.LogFormat.JSON if a.log_format == "json" else kopf.LogFormat.FULL)
    install_log_masking()  # no credential in any log line (nor in the events Kopf makes of them)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # no log line per admission request
    if not a.verbose:  # no log line per handled event ("Handler ... succeeded"): thousands on a restart
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    metrics = Metrics()
    if a.metrics_port:
        start_http_server(a.metrics_port, addr=a.metrics_address, registry=metrics.registry)
    with tempfile.TemporaryDirectory(prefix="compilecache-webhook-") as scratch:
        runtime = runtime_from(options, State(settings=settings_from(options), metrics=metrics),
                               admission_from(options, Path(scratch), metrics))
        if runtime.admission.server is not None:
            handlers.register_webhook(check_caches=runtime.admission.check_caches)
        kopf.run(
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            standalone=True,
            memo=runtime,
            stop_flag=runtime.stop_flag,
        )


def runtime_from(options: Options, state: State, admission: Admission) -> Runtime:
    """What the operator runs with: the State, the webhook's server, and where the options say the probes
    listen, the signing key and the Lease are; Kopf hands it to every handler as the memo."""
    a = options.args
    return Runtime(
        state=state,
        intervals=Intervals(resync_seconds=a.resync_seconds),
        admission=admission,
        probes=Probes(address=a.health_address, port=a.health_port),
        signing_secret=SigningSecret(a.operator_namespace, a.signing_key_secret, tuple(_csv(a.trusted_public_keys)),
                                     OWNED_LABELS) if a.signing_key_secret else None,
        election=Election(a.leader_election_namespace, a.leader_election_name)
        if a.leader_election_namespace else None,
        stop_flag=threading.Event(),
        shutdown_delay=a.shutdown_delay,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        run(options)
    except (certs.CertError, SigningKeyError, StoreURLError) as exc:
        print(f"compilecache-operator: {mask_text(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
