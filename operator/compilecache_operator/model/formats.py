"""Kubernetes' and the container registries' string formats, as pure checks that say what is wrong.

Each ``*_problem`` function returns None for a valid value, else a short reason; the same rules
are written into the CRD (patterns and CEL) where a schema can say them, and
:mod:`compilecache_operator.model.spec` applies these to every field that reaches a Job, a pod or a node
path: label and taint keys and values (Kubernetes' qualified names and label values), container
resource names (extended resources by Kubernetes' own rule), image references (the distribution
reference grammar), host names, node paths (a node cache's hostPath: an allow-list of roots, never a
system directory), and text a container's process gets (never a NUL byte).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
IMAGE_NAME_MAX = 255
"""The longest repository name (registry host included) the distribution reference grammar allows."""
IMAGE_REFERENCE_MAX = 1024

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_HOST_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")

# github.com/distribution/reference (regexp.go), ASCII only.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_PATTERN = (
    rf"^(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
"""An image reference (``registry:5000/team/app:1.2@sha256:...``); the CRD's ``spec.image`` pattern."""
_IMAGE = re.compile(IMAGE_REFERENCE_PATTERN)

NATIVE_RESOURCE_PREFIX = "kubernetes.io/"
QUOTA_REQUESTS_PREFIX = "requests."
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
"""Container resources named without a domain; ``hugepages-<size>`` too. Any other needs one (nvidia.com/gpu)."""

FORBIDDEN_NODE_PATHS = (
    "/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker", "/var/lib/cni", "/var/run", "/run",
    "/var/log", "/opt/cni", "/home",
)
"""Directories a node cache may never be in (nor be ``/`` itself), whatever the allow-list says."""
DEFAULT_NODE_CACHE_ROOTS = ("/var/cache", "/mnt", "/srv")
"""Where a CompileCache may put a node cache unless the operator is told otherwise
(``--allowed-node-cache-paths``; the chart's ``nodeCache.allowedHostPaths``)."""
_NODE_PATH = re.compile(r"(/[A-Za-z0-9_.+-]+)+/?")


def dns_subdomain_problem(value: str) -> str | None:
    """A DNS-1123 subdomain (names of Secrets, ServiceAccounts, label-key prefixes)."""
    if len(value) > DNS_SUBDOMAIN_MAX:
        return f"at most {DNS_SUBDOMAIN_MAX} characters, got {len(value)}"
    if not _DNS_SUBDOMAIN.fullmatch(value):
        return "not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', starting and ending alphanumeric)"
    return None


def qualified_name_problem(value: str) -> str | None:
    """A Kubernetes qualified name (label, annotation and taint keys, resource names):
    ``[prefix/]name``, the name at most 63 characters of ``[-A-Za-z0-9_.]`` starting and ending
    alphanumeric, the prefix a DNS subdomain."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or dns_subdomain_problem(prefix)):
        return f"the prefix {prefix!r} is not a DNS-1123 subdomain of at most {DNS_SUBDOMAIN_MAX} characters"
    if len(name) > DNS_LABEL_MAX:
        return f"the name part has at most {DNS_LABEL_MAX} characters, got {len(name)}"
    if not _NAME_PART.fullmatch(name):
        return ("not a qualified name ([prefix/]name: '-', '_', '.' and ASCII letters and digits, "
                "alphanumeric at both ends)")
    return None


def label_value_problem(value: str) -> str | None:
    """A label value (also a taint's and a nodeSelector's value): empty, or at most 63 characters of
    ``[-A-Za-z0-9_.]`` starting and ending alphanumeric."""
    if len(value) > LABEL_VALUE_MAX:
        return f"at most {LABEL_VALUE_MAX} characters, got {len(value)}"
    if value and not _NAME_PART.fullmatch(value):
        return "not a label value ('-', '_', '.' and ASCII letters and digits, alphanumeric at both ends)"
    return None


def extended_resource_problem(value: str) -> str | None:
    """An extended resource name, by Kubernetes' ``IsExtendedResourceName`` (k8s.io/kubernetes
    pkg/apis/core/helper): a name with a domain (``nvidia.com/gpu``), the domain not ``kubernetes.io``
    (nor any name holding ``kubernetes.io/``: those are native), not starting ``requests.``, and
    ``requests.<name>`` still a qualified name (the domain at most 244 characters). Anything else is
    native: ``cpu``, ``memory``, ``pods``, ``hugepages-2Mi``, ``kubernetes.io/hostname``."""
    if "/" not in value:
        return ("not an extended resource: it has no domain, so it is one of Kubernetes' own (cpu, memory, "
                "ephemeral-storage, hugepages-<size>, pods, ...); a device is named with its vendor's domain "
                "(nvidia.com/gpu, amd.com/gpu)")
    if NATIVE_RESOURCE_PREFIX in value:
        return f"not an extended resource: names holding {NATIVE_RESOURCE_PREFIX!r} are Kubernetes' own"
    if value.startswith(QUOTA_REQUESTS_PREFIX):
        return f"not an extended resource: names starting {QUOTA_REQUESTS_PREFIX!r} are resource quota names"
    problem = qualified_name_problem(QUOTA_REQUESTS_PREFIX + value)
    if problem:
        return f"not an extended resource ({QUOTA_REQUESTS_PREFIX}<name> must be a qualified name): {problem}"
    return None


def resource_name_problem(value: str) -> str | None:
    """A container resource name a node can offer: ``cpu``, ``memory``, ``ephemeral-storage``,
    ``hugepages-<size>``, or an extended resource (``nvidia.com/gpu``; see :func:`extended_resource_problem`).
    The API server also takes ``kubernetes.io/<anything>`` in a container, but no node offers such a
    resource, so a pod asking for one is never scheduled."""
    problem = qualified_name_problem(value)
    if problem:
        return problem
    if "/" not in value:
        if value not in STANDARD_CONTAINER_RESOURCES and not value.startswith("hugepages-"):
            standard = ", ".join(STANDARD_CONTAINER_RESOURCES)
            return f"not a container resource: {standard}, hugepages-<size>, or one with a domain (nvidia.com/gpu)"
        return None
    return extended_resource_problem(value)


def runtime_text_problem(value: str) -> str | None:
    """Text that reaches a process's arguments, environment or a file name in a container: no NUL byte
    (``execve`` and every container runtime refuse one; the container could never start)."""
    if "\x00" in value:
        return (f"holds a NUL byte (at character {value.index(chr(0))}): no process argument, environment value "
                "or file name can hold one, so the container could never start")
    return None


def image_problem(value: str) -> str | None:
    """An image reference by the distribution grammar: ``[host[:port]/]path[:tag][@digest]``,
    lower-case repository path, no spaces, no shell."""
    if len(value) > IMAGE_REFERENCE_MAX:
        return f"at most {IMAGE_REFERENCE_MAX} characters, got {len(value)}"
    match = _IMAGE.fullmatch(value)
    if match is None:
        return ("not an image reference ([registry[:port]/]repository[:tag][@digest]: lower-case repository, "
                "tag of [A-Za-z0-9_.-], no spaces or other characters)")
    if len(match.group("name")) > IMAGE_NAME_MAX:
        return f"the repository name has at most {IMAGE_NAME_MAX} characters, got {len(match.group('name'))}"
    return None


def host_problem(value: str) -> str | None:
    """A host name (DNS, letters of either case) or an IPv4 or IPv6 address, as a client connects to it."""
    if len(value) > DNS_SUBDOMAIN_MAX:
        return f"at most {DNS_SUBDOMAIN_MAX} characters, got {len(value)}"
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            return "not a host name or IP address (an IPv6 address is written without brackets or port)"
        return None
    if not _HOST_NAME.fullmatch(value) or any(len(label) > DNS_LABEL_MAX for label in value.split(".")):
        return "not a host name or IP address (letters, digits, '-' and '.'; labels of at most 63 characters)"
    return None


def node_path_problem(value: str, roots: Sequence[str]) -> str | None:
    """A directory on every node a preload writes into: absolute, plain (``[A-Za-z0-9_.+-]``
    segments, no ``.`` or ``..``), never a system directory (:data:`FORBIDDEN_NODE_PATHS`), and at
    or under one of ``roots``."""
    if not _NODE_PATH.fullmatch(value):
        return "not an absolute path of plain segments ([A-Za-z0-9_.+-], separated by single '/')"
    segments = value.rstrip("/").split("/")[1:]
    if any(s in (".", "..") for s in segments):
        return "must not hold '.' or '..' segments"
    path = "/" + "/".join(segments)
    if any(under(path, forbidden) for forbidden in FORBIDDEN_NODE_PATHS):
        return "is a system directory of the node (or inside one): never a cache"
    if not any(under(path, root) for root in roots):
        allowed = ", ".join(roots) if roots else "none"
        return f"is outside the directories the operator allows node caches in ({allowed})"
    return None


def under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it (both absolute, without trailing '/')."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


__all__ = [
    "DEFAULT_NODE_CACHE_ROOTS", "FORBIDDEN_NODE_PATHS", "IMAGE_REFERENCE_PATTERN", "dns_subdomain_problem",
    "extended_resource_problem", "host_problem", "image_problem", "label_value_problem", "node_path_problem",
    "qualified_name_problem", "resource_name_problem", "runtime_text_problem", "under",
]
