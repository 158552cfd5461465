"""The cache key's format: its fields, its one string form, its prefixes (which compiled artifacts may be reused where).

Inductor artifacts hit only with the same torch and triton versions, the same GPU and the
same compile options, so every one of those is part of the key. A key has one string
form, usable unchanged as a file path, a Redis key and an S3 object key::

    cc1/<namespace>/<name>/<model>/<options>/<gpu>/<capability>/torch-<v>/triton-<v>/cuda-<v>/py-<v>

``cc1`` is the key format version. Fields are ordered from the widest to the narrowest,
so that one prefix lists a whole cache (``cc1/<ns>/<name>/``) or every variant of one
model and option set. Each segment is restricted to ``[A-Za-z0-9._+-]`` and must not be
empty, so that ``/`` can separate segments and the string form round-trips exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from cachelib.in_image.compilekey import (
    CAPABILITY_PATTERN,
    KEY_FORMAT,
    NONE,
    VERSIONED_FIELDS,
    InvalidKey,
    capability_slug,
    digest,
    gpu_slug,
    key_string,
)

__all__ = ["KEY_FORMAT", "NONE", "CacheKey", "InvalidKey", "cache_prefix", "capability_slug", "digest", "gpu_slug"]

_SEGMENT = re.compile(r"^[A-Za-z0-9._+-]+\Z")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_SUBDOMAIN_PART = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
"""One dot-separated part of a DNS subdomain: Kubernetes bounds the whole name (253), not each part."""
_DIGEST = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True, order=True)
class CacheKey:
    """Every field that decides whether a compiled artifact can be reused."""

    namespace: str
    name: str
    model: str
    """Digest of the model identity (the harness target or command, see :func:`digest`)."""
    options: str
    """Digest of the compile options (mode, dynamic, fullgraph, backend, inductor config...)."""
    gpu: str
    """GPU product slug (:func:`gpu_slug`), ``cpu`` without a GPU."""
    capability: str
    """Compute capability slug (:func:`capability_slug`), ``cpu`` without a GPU."""
    torch: str
    triton: str
    cuda: str
    py: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or not _SEGMENT.match(value):
                raise InvalidKey(f"{f.name}: {value!r} is not a valid key segment ([A-Za-z0-9._+-]+)")
        check_cache_ref(self.namespace, self.name)
        for label, value in (("model", self.model), ("options", self.options)):
            if not _DIGEST.match(value):
                raise InvalidKey(f"{label}: {value!r} is not a 16-hex-digit digest")
        if self.gpu != gpu_slug(self.gpu):
            raise InvalidKey(f"gpu: {self.gpu!r} is not normalised (expected {gpu_slug(self.gpu)!r})")
        if not CAPABILITY_PATTERN.match(self.capability):
            raise InvalidKey(f"capability: {self.capability!r} is not 'smNN' or 'cpu'")

    # -- string form -------------------------------------------------------------------
    def __str__(self) -> str:
        return key_string(self.to_dict())

    @classmethod
    def parse(cls, text: str) -> CacheKey:
        """The inverse of ``str(key)``; raises :class:`InvalidKey` naming what is wrong."""
        parts = text.split("/")
        if not parts or parts[0] != KEY_FORMAT:
            raise InvalidKey(f"key {text!r}: expected the format prefix {KEY_FORMAT!r}")
        if len(parts) != 11:
            raise InvalidKey(f"key {text!r}: expected 11 '/'-separated segments, got {len(parts)}")
        versions: dict[str, str] = {}
        for label, part in zip(VERSIONED_FIELDS, parts[7:], strict=True):
            prefix = f"{label}-"
            if not part.startswith(prefix) or len(part) == len(prefix):
                raise InvalidKey(f"key {text!r}: segment {part!r} should read '{prefix}<version>'")
            versions[label] = part[len(prefix) :]
        return cls(*parts[1:7], **versions)

    # -- groupings ---------------------------------------------------------------------
    @property
    def cache_prefix(self) -> str:
        """The prefix shared by every key of this cache."""
        return cache_prefix(self.namespace, self.name)

    @property
    def variant(self) -> str:
        """A short readable label of the runtime part: ``<gpu>/<capability>/torch-.../py-...``."""
        return "/".join(str(self).split("/")[5:])

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheKey:
        try:
            return cls(**{f.name: str(data[f.name]) for f in fields(cls)})
        except KeyError as missing:
            raise InvalidKey(f"key field {missing.args[0]!r} is missing") from None


def check_cache_ref(namespace: str, name: str) -> None:
    """A cache's namespace (a DNS label) and name (a DNS subdomain), as Kubernetes names them;
    :class:`InvalidKey` naming what is wrong."""
    if not _DNS_LABEL.match(namespace):
        raise InvalidKey(f"namespace: {namespace!r} is not a Kubernetes namespace name (a DNS label: at most 63 "
                         "lower-case letters, digits and '-', alphanumeric at both ends)")
    if not _is_dns_subdomain(name):
        raise InvalidKey(f"name: {name!r} is not a Kubernetes object name (a DNS subdomain: at most 253 lower-case "
                         "letters, digits, '-' and '.')")


def cache_prefix(namespace: str, name: str) -> str:
    return f"{KEY_FORMAT}/{namespace}/{name}/"


def _is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and all(_SUBDOMAIN_PART.match(label) for label in value.split("."))


VERSION_FIELDS = ("torch", "triton", "cuda", "py")
"""The version fields of a key a preload may ask for."""


def version_matches(have: str, wanted: str | None) -> bool:
    """``wanted`` None matches anything; ``2.13.0`` matches ``2.13.0`` and ``2.13.0+cu128``."""
    if wanted is None or have == wanted:
        return True
    return "+" not in wanted and have.split("+", 1)[0] == wanted


def select_keys(
    keys: Iterable[CacheKey], *, gpu: str | None = None, versions: Mapping[str, str | None] | None = None
) -> list[CacheKey]:
    """The keys of the given GPU (slug, or any when None) whose versions match, in key order."""
    wanted = {k: v for k, v in (versions or {}).items() if v is not None}
    unknown = set(wanted) - set(VERSION_FIELDS)
    if unknown:
        raise ValueError(f"unknown version field(s): {', '.join(sorted(unknown))}")
    slug = gpu_slug(gpu) if gpu else None
    return sorted(
        k
        for k in keys
        if (slug is None or k.gpu == slug) and all(version_matches(getattr(k, f), v) for f, v in wanted.items())
    )


def parse_cache_ref(text: str) -> tuple[str, str]:
    """``NS/NAME`` -> (namespace, name); :class:`InvalidKey` when malformed."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise InvalidKey(f"--cache {text!r}: expected NAMESPACE/NAME")
    return namespace, name
