"""Store URLs: parsing and validation (pure: no I/O, no environment, no client libraries).

Accepted forms::

    file:///absolute/path
    redis://[[user]:password@]host[:port][/db][?prefix=&ttl=&chunk=&workers=&grace=&timeout=&retries=]
    rediss://...same...[&ca=/path/to/ca.pem]
    redis-cluster://[[user]:password@]host[:port][?...same as redis://...][&nodes=host:port,...]
                                                   (Redis Cluster; database 0; nodes: more seeds)
    rediss-cluster://...same...[&ca=/path/to/ca.pem]
    s3://bucket[/prefix][?endpoint=&region=&part=&range=&workers=&timeout=&retries=&addressing=]

Sizes take an optional binary suffix: ``64K``, ``4M``, ``1G`` (KiB, MiB, GiB); ``4MiB`` and a
plain byte count work too. Every error names the URL, its credentials masked
(:func:`cachelib.in_image.masking.mask_url`: user info, secret query values, fragment), and what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from cachelib.in_image.masking import is_secret_name, mask_text
from cachelib.in_image.masking import mask_url as mask_url
from cachelib.stores.base import StoreURLError
from cachelib.units import GiB, KiB, MiB, parse_size, size_text

ACCEPTED_SCHEMES = ("file", "redis", "rediss", "redis-cluster", "rediss-cluster", "s3")
REDIS_SCHEMES = ("redis", "rediss", "redis-cluster", "rediss-cluster")
"""Standalone Redis, then Redis Cluster (any node of the cluster as the seed); ``ss``: TLS."""


REDIS_DEFAULT_PORT = 6379
REDIS_DEFAULT_PREFIX = "compilecache"
# Chunk size for Redis values. Redis caps a string at 512 MiB, so values are split anyway;
# the size trades per-command overhead (small chunks) against the client's cost of parsing
# one big reply and the memory held per chunk in flight. Measured on a 2-core machine with a
# loopback redis-server (`python bench/preload.py --redis-chunk-sweep ...`, figures in
# docs/benchmarks.md, "Redis chunk size"): with redis-py's own reply parser (the default
# install) get throughput peaks at 1 MiB, is 12-26 % lower at 4 MiB and 47-69 % lower at
# 8 MiB (each reply is copied through a growing buffer); with hiredis 1 to 4 MiB lead by
# turns; put is flat from 1 to 4 MiB. 1 MiB it is: it also bounds a reader's chunks in
# flight to (2 x workers) x 1 MiB = 8 MiB.
REDIS_DEFAULT_CHUNK = 1 * MiB
REDIS_MIN_CHUNK = 1 * KiB
REDIS_MAX_CHUNK = 512 * MiB
REDIS_DEFAULT_WORKERS = 4
REDIS_DEFAULT_GRACE = 300
REDIS_DEFAULT_TIMEOUT = 10.0
REDIS_DEFAULT_RETRIES = 2

S3_MIN_PART = 5 * MiB
S3_MAX_PART = 5 * GiB
S3_MAX_PARTS = 10_000
S3_DEFAULT_RANGE = 8 * MiB
S3_MIN_RANGE = 1 * KiB
S3_DEFAULT_WORKERS = 4
S3_DEFAULT_TIMEOUT = 30.0
S3_DEFAULT_RETRIES = 3
S3_ADDRESSING = ("auto", "path", "virtual")

_OPTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")
_PREFIX = re.compile(r"^[A-Za-z0-9._:+-]+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_PREFIX_SEGMENT = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class FileStoreURL:
    """``file:///root``: objects are files under ``root``."""

    root: str


@dataclass(frozen=True)
class RedisStoreURL:
    """``redis://`` or ``rediss://`` (TLS); ``redis-cluster://`` or ``rediss-cluster://`` for Redis Cluster."""

    host: str
    port: int = REDIS_DEFAULT_PORT
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    prefix: str = REDIS_DEFAULT_PREFIX
    ttl: int | None = None
    """Seconds after publishing at which the object expires; ``None`` keeps it."""
    chunk: int = REDIS_DEFAULT_CHUNK
    workers: int = REDIS_DEFAULT_WORKERS
    """Parallel chunk fetches per reader."""
    grace: int = REDIS_DEFAULT_GRACE
    """Seconds the chunks of a replaced or deleted version stay readable for readers in flight."""
    timeout: float = REDIS_DEFAULT_TIMEOUT
    retries: int = REDIS_DEFAULT_RETRIES
    ca: str | None = None
    """CA bundle for ``rediss://``; the system's trust store when absent."""
    cluster: bool = False
    """Redis Cluster: ``host:port`` is one node, the client discovers the others."""
    nodes: tuple[tuple[str, int], ...] = ()
    """More cluster nodes to start from (``?nodes=host:port,...``) when ``host:port`` does not answer."""


@dataclass(frozen=True)
class S3StoreURL:
    """``s3://bucket/prefix``; ``endpoint`` for S3-compatible servers."""

    bucket: str
    prefix: str = ""
    """Key prefix without a trailing slash; ``""`` for the bucket root."""
    endpoint: str | None = None
    region: str | None = None
    part: int | None = None
    """Multipart part size; ``None`` sizes parts for each object."""
    range: int = S3_DEFAULT_RANGE
    """Size of each ranged GET."""
    workers: int = S3_DEFAULT_WORKERS
    timeout: float = S3_DEFAULT_TIMEOUT
    retries: int = S3_DEFAULT_RETRIES
    addressing: str = "auto"


StoreURL = FileStoreURL | RedisStoreURL | S3StoreURL


def parse_store_url(url: str) -> StoreURL:
    """Parse and validate a store URL; raises :class:`StoreURLError` naming the problem."""
    if not isinstance(url, str) or not url.strip():
        raise StoreURLError(f"store URL {mask_url(str(url))!r} is empty; accepted schemes: {_schemes()}")
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise StoreURLError(f"store URL {mask_url(url)!r} cannot be parsed: {exc}") from None
    scheme = parts.scheme.lower()
    if "@" in url.strip()[len(parts.scheme) + 3 + len(parts.netloc):]:
        raise StoreURLError(
            f"store URL {mask_url(url)!r}: an '@' after the host: a user name or password holding '/', '?' "
            "or '#' must be percent-encoded (and a password belongs in the Secret, not in the URL)"
        )
    if scheme == "file":
        return _parse_file(url, parts)
    if scheme in REDIS_SCHEMES:
        return _parse_redis(url, parts)
    if scheme == "s3":
        return _parse_s3(url, parts)
    got = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
    raise StoreURLError(f"store URL {mask_url(url)!r} has {got}; accepted schemes: {_schemes()}")


# -- file ---------------------------------------------------------------------------------
def _parse_file(raw: str, parts: SplitResult) -> FileStoreURL:
    url = mask_url(raw)
    if parts.netloc not in ("", "localhost"):
        raise StoreURLError(
            f"store URL {url!r}: file URLs need an absolute path (file:///path), got host {mask_text(parts.netloc)!r}"
        )
    if parts.query or parts.fragment:
        raise StoreURLError(f"store URL {url!r}: file URLs take no options")
    root = unquote(parts.path)
    if not root.startswith("/"):
        raise StoreURLError(f"store URL {url!r}: file URLs need an absolute path (file:///path)")
    if root != "/":
        root = root.rstrip("/")
    return FileStoreURL(root=root)


# -- redis --------------------------------------------------------------------------------
def _parse_redis(url: str, parts: SplitResult) -> RedisStoreURL:
    shown = mask_url(url)
    scheme = parts.scheme.lower()
    tls = scheme.startswith("rediss")
    cluster = scheme.endswith("-cluster")
    try:
        port = _port(parts, "the port") or REDIS_DEFAULT_PORT
    except ValueError as exc:
        raise StoreURLError(f"store URL {shown!r}: {exc}") from None
    host = parts.hostname
    if not host:
        raise StoreURLError(f"store URL {shown!r}: no host (expected {parts.scheme}://host:port/db)")
    db_text = parts.path.strip("/")
    if db_text and not db_text.isdigit():
        raise StoreURLError(f"store URL {shown!r}: the path must be a database number, got {db_text!r}")
    if cluster and db_text.strip("0"):
        raise StoreURLError(f"store URL {shown!r}: Redis Cluster has only database 0, got /{db_text}")
    if parts.fragment:
        raise StoreURLError(f"store URL {shown!r}: unexpected fragment (#...)")
    accepted = ("prefix", "ttl", "chunk", "workers", "grace", "timeout", "retries") + (("ca",) if tls else ())
    accepted += ("nodes",) if cluster else ()
    opts = _query(shown, parts.query, accepted)
    try:
        prefix = opts.get("prefix", REDIS_DEFAULT_PREFIX)
        if not _PREFIX.match(prefix):
            raise ValueError(f"prefix={prefix!r} must be non-empty [A-Za-z0-9._:+-]")
        chunk = _bounded_size(opts, "chunk", REDIS_DEFAULT_CHUNK, REDIS_MIN_CHUNK, REDIS_MAX_CHUNK)
        return RedisStoreURL(
            host=host,
            port=port,
            db=int(db_text or 0),
            tls=tls,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            prefix=prefix,
            ttl=_int(opts, "ttl", 0, low=1) or None,
            chunk=chunk,
            workers=_int(opts, "workers", REDIS_DEFAULT_WORKERS, low=1, high=64),
            grace=_int(opts, "grace", REDIS_DEFAULT_GRACE, low=0),
            timeout=_seconds(opts, "timeout", REDIS_DEFAULT_TIMEOUT),
            retries=_int(opts, "retries", REDIS_DEFAULT_RETRIES, low=0, high=10),
            ca=opts.get("ca"),
            cluster=cluster,
            nodes=_nodes(opts.get("nodes", "")),
        )
    except ValueError as exc:
        raise StoreURLError(f"store URL {shown!r}: {exc}") from None


def _port(parts: SplitResult, what: str) -> int | None:
    """The port of a URL's authority, as ``parts.port`` reads it (None when it names none); raises ValueError
    naming ``what`` unless it is 1 to 65535: nothing listens on port 0, so such a store is never reached."""
    host_and_port = parts.netloc.rpartition("@")[2]
    text = host_and_port.rpartition("]")[2].partition(":")[2]  # after an IPv6 address's brackets
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{what} {text[:16]!r} is not a port number from 1 to 65535")
    return port


def _nodes(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (``[v6]:port`` for IPv6) -> ((host, port), ...)."""
    nodes = []
    for item in text.split(",") if text else ():
        try:
            parts = urlsplit(f"//{item.strip()}")
            host, port = parts.hostname, _port(parts, f"nodes: {item!r}: the port")
        except ValueError as exc:
            if "port number" in str(exc):
                raise
            host, port = None, None
        if not host or not port or parts.path or parts.username or parts.password:
            raise ValueError(f"nodes: {item!r} is not host:port")
        nodes.append((host, port))
    return tuple(nodes)


# -- s3 -----------------------------------------------------------------------------------
def _parse_s3(raw: str, parts: SplitResult) -> S3StoreURL:
    url = mask_url(raw)
    bucket = parts.netloc
    if not bucket:
        raise StoreURLError(f"store URL {url!r}: no bucket (expected s3://bucket/prefix)")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise StoreURLError(
            f"store URL {url!r}: bucket {mask_text(bucket)!r} is not a valid S3 bucket name "
            "(3-63 characters of a-z, 0-9, '.', '-')"
        )
    prefix = unquote(parts.path).strip("/")
    for segment in prefix.split("/") if prefix else ():
        if not _S3_PREFIX_SEGMENT.match(segment):
            raise StoreURLError(
                f"store URL {url!r}: prefix segment {segment!r} must be non-empty [A-Za-z0-9._+-] not starting with '.'"
            )
    if parts.fragment:
        raise StoreURLError(f"store URL {url!r}: unexpected fragment (#...)")
    opts = _query(
        url, parts.query, ("endpoint", "region", "part", "range", "workers", "timeout", "retries", "addressing")
    )
    try:
        endpoint = opts.get("endpoint")
        if endpoint is not None:
            endpoint_parts = urlsplit(endpoint)
            if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.hostname:
                raise ValueError(f"endpoint={endpoint!r} must be an http:// or https:// URL with a host")
            _port(endpoint_parts, "the endpoint's port")
        addressing = opts.get("addressing", "auto")
        if addressing not in S3_ADDRESSING:
            raise ValueError(f"addressing={addressing!r} must be one of {', '.join(S3_ADDRESSING)}")
        part = _bounded_size(opts, "part", 0, S3_MIN_PART, S3_MAX_PART) if "part" in opts else None
        return S3StoreURL(
            bucket=bucket,
            prefix=prefix,
            endpoint=endpoint,
            region=opts.get("region") or None,
            part=part,
            range=_bounded_size(opts, "range", S3_DEFAULT_RANGE, S3_MIN_RANGE, S3_MAX_PART),
            workers=_int(opts, "workers", S3_DEFAULT_WORKERS, low=1, high=64),
            timeout=_seconds(opts, "timeout", S3_DEFAULT_TIMEOUT),
            retries=_int(opts, "retries", S3_DEFAULT_RETRIES, low=0, high=10),
            addressing=addressing,
        )
    except ValueError as exc:
        raise StoreURLError(f"store URL {url!r}: {exc}") from None


# -- option helpers -----------------------------------------------------------------------
def _query(shown: str, query: str, accepted: tuple[str, ...]) -> dict[str, str]:
    opts: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in accepted:
            named = repr(name) if _OPTION_NAME.match(name) and not is_secret_name(name) else "(not shown)"
            raise StoreURLError(f"store URL {shown!r}: unknown option {named}; accepted: {', '.join(accepted)}")
        if name in opts:
            raise StoreURLError(f"store URL {shown!r}: option {name!r} given twice")
        opts[name] = value
    return opts


def _int(opts: dict[str, str], name: str, default: int, *, low: int, high: int | None = None) -> int:
    if name not in opts:
        return default
    text = opts[name]
    if not text.isdigit():
        raise ValueError(f"{name}={text!r} is not a whole number")
    value = int(text)
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name}={value} must be {bound}")
    return value


def _seconds(opts: dict[str, str], name: str, default: float) -> float:
    if name not in opts:
        return default
    try:
        value = float(opts[name])
    except ValueError:
        raise ValueError(f"{name}={opts[name]!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise ValueError(f"{name}={opts[name]} must be more than 0 and at most 3600 seconds")
    return value


def _bounded_size(opts: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    if name not in opts:
        return default
    value = parse_size(opts[name], what=name, largest="G")
    if not low <= value <= high:
        raise ValueError(f"{name}={opts[name]} must be from {size_text(low)} to {size_text(high)}")
    return value


def _schemes() -> str:
    return ", ".join(f"{s}://" for s in ACCEPTED_SCHEMES)
