"""``redis://`` and ``rediss://``, and Redis Cluster: objects as chunked values behind a manifest.

Layout under the URL's ``prefix`` (default ``compilecache``), standalone Redis::

    <prefix>:m:<key>                 hash: size, chunks, chunk_size, upload, created, sha256
    <prefix>:c:<key>:<upload>:<i>    string: chunk i of one upload
    <prefix>:index                   sorted set of every key (score 0), read with ZRANGEBYLEX

Redis Cluster (``redis-cluster://``, ``rediss-cluster://``): the same names with the object key
in a hash tag, so that an object's manifest and all its chunks hash to one slot, and no index
(one sorted set would be one slot on one node, outside every publish's slot)::

    <prefix>:m:{<key>}               the manifest
    <prefix>:c:{<key>}:<upload>:<i>  its chunks

A cluster is listed by scanning the manifests on every primary; a primary that does not
answer fails the listing (never a partial one). Object keys hold no braces, so the tag is
always the whole key.

A publish writes the chunks under a fresh upload id (with a pending expiry, so a
publisher that dies half-way leaves nothing behind for long), then one Lua script
checks that every chunk is there, swaps the manifest, adds the key to the index and
gives the previous version's chunks a grace period before they expire. A reader reads
the manifest once and then only chunks of that upload id: it finishes with the version
it started on, or, when that version's chunks are gone (grace period over, expired),
fails with :class:`ObjectChanged`. Two versions are never spliced.

The scripts touch chunk keys they derive themselves: on a cluster these share the manifest's
slot, so each script runs on one node, atomically, like on a standalone server.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from cachelib.stores._stream import OrderedFetchStream, as_binary, read_pieces
from cachelib.stores.base import (
    NotFound,
    ObjectChanged,
    ObjectInfo,
    Store,
    StoreError,
    StoreUnavailable,
    check_key,
)
from cachelib.stores.urls import RedisStoreURL

PENDING_SECONDS = 24 * 3600
"""Expiry of chunks not yet published: what a publisher that died mid-upload leaves behind."""
_LIST_PAGE = 500
_SCAN_COUNT = 1000
_T = TypeVar("_T")
_CLUSTER_ONLY = (
    ("MOVED", redis.exceptions.MovedError),
    ("ASK", redis.exceptions.AskError),
    ("CROSSSLOT", redis.exceptions.ClusterCrossSlotError),
)
"""Error replies that only a Redis Cluster node (or a proxy in front of one) gives, and the class
redis-py parses each into (newer versions; older ones leave a plain reply starting with the code)."""

# Chunks of a version that is being replaced or deleted: kept ``grace`` seconds for
# readers already in flight (never longer than they would have lived anyway), or
# deleted at once when grace is 0.
_RETIRE = """
local function retire(chunk_prefix, upload, count, grace)
  for i = 0, count - 1 do
    local ck = chunk_prefix .. upload .. ':' .. i
    if grace == 0 then
      redis.call('DEL', ck)
    else
      local left = redis.call('PTTL', ck)
      if left == -1 or left > grace * 1000 then redis.call('PEXPIRE', ck, grace * 1000) end
    end
  end
end
"""

# KEYS: manifest[, index] (no index on a cluster). ARGV: key, upload, chunks, size, chunk_size,
# created, ttl (0: none), grace, chunk key prefix (<prefix>:c:<key>:), sha256 of the object.
_PUBLISH = (
    _RETIRE
    + """
local n = tonumber(ARGV[3])
local ttl = tonumber(ARGV[7])
for i = 0, n - 1 do
  if redis.call('EXISTS', ARGV[9] .. ARGV[2] .. ':' .. i) == 0 then
    return redis.error_reply('chunk ' .. i .. ' of upload ' .. ARGV[2] .. ' is missing')
  end
end
for i = 0, n - 1 do
  local ck = ARGV[9] .. ARGV[2] .. ':' .. i
  if ttl > 0 then redis.call('EXPIRE', ck, ttl) else redis.call('PERSIST', ck) end
end
local old_upload = redis.call('HGET', KEYS[1], 'upload')
local old_count = tonumber(redis.call('HGET', KEYS[1], 'chunks') or '0')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'size', ARGV[4], 'chunks', ARGV[3], 'chunk_size', ARGV[5],
           'upload', ARGV[2], 'created', ARGV[6], 'sha256', ARGV[10])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
if KEYS[2] then redis.call('ZADD', KEYS[2], 0, ARGV[1]) end
if old_upload and old_upload ~= ARGV[2] then retire(ARGV[9], old_upload, old_count, tonumber(ARGV[8])) end
return 1
"""
)

# KEYS: manifest[, index]. ARGV: key, grace, chunk key prefix.
_DELETE = (
    _RETIRE
    + """
if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[1]) end
local upload = redis.call('HGET', KEYS[1], 'upload')
if not upload then return 0 end
local count = tonumber(redis.call('HGET', KEYS[1], 'chunks') or '0')
redis.call('DEL', KEYS[1])
retire(ARGV[3], upload, count, tonumber(ARGV[2]))
return 1
"""
)

# KEYS: manifest, index. ARGV: key. Drops an index entry whose manifest has expired.
_PRUNE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.call('ZREM', KEYS[2], ARGV[1]) end
return 0
"""


class _Refused(Exception):
    """Carries an authentication failure through ``Retry.call_with_retry`` (which does not retry it)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _RetryOutages(Retry):
    """Retries dropped connections and timeouts, but never a refused password.

    An authentication failure is a ``ConnectionError`` to redis-py, which would retry it. It is
    handed through the retry loop wrapped in an exception the loop does not know, then
    unwrapped. Whatever else redis-py passes (its signature changed across 5.x to 7.x) is passed
    on unchanged, so this works with every redis-py the project allows.
    """

    def call_with_retry(self, do: Callable[[], _T], fail: Callable[..., Any], *args: Any, **kwargs: Any) -> _T:
        def attempt() -> _T:
            try:
                return do()
            except redis.AuthenticationError as exc:
                raise _Refused(exc) from exc

        try:
            return super().call_with_retry(attempt, fail, *args, **kwargs)
        except _Refused as refused:
            raise refused.error from None


@dataclass(frozen=True)
class KeyLayout:
    """The Redis key names of a store's objects (see the module's docstring)."""

    prefix: str
    cluster: bool = False

    def _name(self, key: str) -> str:
        return f"{{{key}}}" if self.cluster else key

    def manifest_key(self, key: str) -> str:
        return f"{self.prefix}:m:{self._name(key)}"

    def chunk_prefix(self, key: str) -> str:
        return f"{self.prefix}:c:{self._name(key)}:"

    def chunk_key(self, key: str, upload: str, index: int) -> str:
        return f"{self.chunk_prefix(key)}{upload}:{index}"

    @property
    def index(self) -> str | None:
        """The sorted set of every key; none on a cluster."""
        return None if self.cluster else f"{self.prefix}:index"

    def script_keys(self, key: str) -> list[str]:
        """KEYS of the publish and delete scripts: the manifest, and the index where there is one."""
        return [self.manifest_key(key)] + ([self.index] if self.index else [])

    def manifest_match(self, prefix: str) -> str:
        """A SCAN pattern for the cluster manifests of keys starting with ``prefix``.

        Neither the store prefix nor object keys hold glob characters (``*?[]\\``).
        """
        return f"{self.prefix}:m:{{{prefix}*}}"

    def key_of_manifest(self, name: str) -> str:
        """The object key of a cluster manifest name (the inverse of :meth:`manifest_key`)."""
        return name[len(self.prefix) + 4 : -1]


def connect(config: RedisStoreURL) -> redis.Redis | RedisCluster:
    """A client for the URL's server; a cluster client reads the cluster's topology (I/O) here."""
    common: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "username": config.username,
        "password": config.password,
        "ssl": config.tls,
        "ssl_ca_certs": config.ca,
        "socket_timeout": config.timeout,
        "socket_connect_timeout": config.timeout,
        "retry": _RetryOutages(ExponentialBackoff(cap=1.0, base=0.1), config.retries),
    }
    if not config.cluster:
        return redis.Redis(db=config.db, health_check_interval=30, **common)
    if int(redis.__version__.split(".")[0]) < 6:  # later versions take the count from ``retry``
        common["cluster_error_retry_attempts"] = config.retries
    del common["host"], common["port"]
    addresses = ((config.host, config.port), *config.nodes)
    seeds = [ClusterNode(host, port) for host, port in addresses]  # type: ignore[no-untyped-call]
    return RedisCluster(startup_nodes=seeds, require_full_coverage=True, **common)


class RedisStore(Store):
    """Chunked objects in one Redis database, or one Redis Cluster, under a key prefix.

    Opening does not connect: the client is made on first use (a cluster client reads the
    cluster's topology then), so every failure surfaces from an operation, as a store error.
    """

    def __init__(self, config: RedisStoreURL, url: str) -> None:
        self.config = config
        self.url = url
        self.layout = KeyLayout(config.prefix, config.cluster)
        self._lock = threading.Lock()
        self._connected: redis.Redis | RedisCluster | None = None
        self._scripts: dict[str, Script] = {}
        self._publish = functools.partial(self._run_script, _PUBLISH)
        self._delete = functools.partial(self._run_script, _DELETE)
        self._prune = functools.partial(self._run_script, _PRUNE)

    @property
    def _client(self) -> redis.Redis | RedisCluster:
        with self._lock:
            if self._connected is None:
                client = connect(self.config)
                self._scripts = {text: client.register_script(text) for text in (_PUBLISH, _DELETE, _PRUNE)}
                self._connected = client
            return self._connected

    def _run_script(self, script: str, *, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA on the node of the keys' slot (loading the script there when it does not know it)."""
        client = self._client  # connects first: that registers the scripts
        return self._scripts[script](keys=keys, args=args, client=client)

    # -- names ----------------------------------------------------------------------------
    def manifest_key(self, key: str) -> str:
        return self.layout.manifest_key(key)

    def chunk_prefix(self, key: str) -> str:
        return self.layout.chunk_prefix(key)

    def chunk_key(self, key: str, upload: str, index: int) -> str:
        return self.layout.chunk_key(key, upload, index)

    # -- put ------------------------------------------------------------------------------
    def put(self, key: str, stream: BinaryIO, size: int | None = None) -> ObjectInfo:
        check_key(key)
        upload = secrets.token_hex(8)
        chunk = self.config.chunk
        total = 0
        count = 0
        digest = hashlib.sha256()
        with self._errors(key):
            pieces = read_pieces(stream, chunk, size, f"{self.url}: put {key}", digest)

            def write(index: int, piece: bytes) -> int:
                self._client.set(self.chunk_key(key, upload, index), piece, ex=PENDING_SECONDS)
                return len(piece)

            try:
                for written in _bounded_parallel(write, pieces, self.config.workers):
                    total += written
                    count += 1
                created = time.time()
                self._publish(
                    keys=self.layout.script_keys(key),
                    args=[
                        key,
                        upload,
                        count,
                        total,
                        chunk,
                        repr(created),
                        self.config.ttl or 0,
                        self.config.grace,
                        self.chunk_prefix(key),
                        digest.hexdigest(),
                    ],
                )
            except BaseException:
                self._discard_upload(key, upload, count + self.config.workers + 1)
                raise
        return ObjectInfo(key=key, size=total, modified=created, sha256=digest.hexdigest())

    def _discard_upload(self, key: str, upload: str, upper: int) -> None:
        """Best-effort removal of the chunks of an upload that was not published."""
        # Otherwise they expire after PENDING_SECONDS.
        with contextlib.suppress(redis.RedisError, RedisClusterException):
            self._client.delete(*[self.chunk_key(key, upload, i) for i in range(max(1, upper))])

    # -- get / head -----------------------------------------------------------------------
    def _manifest(self, key: str) -> dict[str, str] | None:
        with self._errors(key):
            raw = cast(dict[bytes, bytes], self._client.hgetall(self.manifest_key(check_key(key))))
        if not raw:
            return None
        return {k.decode(): v.decode() for k, v in raw.items()}

    def get(self, key: str) -> AbstractContextManager[BinaryIO]:
        manifest = self._manifest(key)
        if manifest is None:
            raise NotFound(f"{self.url}: no object {key!r}")
        size, count, chunk = int(manifest["size"]), int(manifest["chunks"]), int(manifest["chunk_size"])
        upload = manifest["upload"]

        def fetch(index: int) -> bytes:
            with self._errors(key):
                data = cast(bytes | None, self._client.get(self.chunk_key(key, upload, index)))
            if data is None:
                raise ObjectChanged(f"{self.url}: {key!r} was replaced or deleted while being read")
            expected = chunk if index < count - 1 else size - chunk * (count - 1)
            if len(data) != expected:
                raise StoreError(f"{self.url}: {key!r}: chunk {index} has {len(data)} bytes, expected {expected}")
            return data

        workers = self.config.workers
        return as_binary(
            OrderedFetchStream(fetch, count, workers=workers, window=2 * workers, name="redis-get", size=size)
        )

    def head(self, key: str) -> ObjectInfo | None:
        manifest = self._manifest(key)
        if manifest is None:
            return None
        return ObjectInfo(
            key=key,
            size=int(manifest["size"]),
            modified=float(manifest["created"]),
            sha256=manifest.get("sha256") or None,
        )

    # -- list -----------------------------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        index = self.layout.index
        if index is None:  # a cluster keeps no index
            yield from self._list_cluster(prefix)
            return
        # Keys are ASCII, so "\x7f" sorts after every character a key may hold.
        low = f"[{prefix}".encode()
        high = f"[{prefix}\x7f".encode() if prefix else b"+"
        while True:
            with self._errors(prefix):
                members = cast(list[bytes], self._client.zrangebylex(index, low, high, start=0, num=_LIST_PAGE))
                if not members:
                    return
                pipe = self._client.pipeline(transaction=False)
                for member in members:
                    pipe.hmget(self.manifest_key(member.decode()), "size", "created")
                rows: list[list[bytes | None]] = pipe.execute()
            for member, (size, created) in zip(members, rows, strict=True):
                key = member.decode()
                if size is None or created is None:
                    with self._errors(key):
                        self._prune(keys=[self.manifest_key(key), index], args=[key])
                    continue
                yield ObjectInfo(key=key, size=int(size), modified=float(created))
            if len(members) < _LIST_PAGE:
                return
            low = b"(" + members[-1]

    def _list_cluster(self, prefix: str) -> Iterator[ObjectInfo]:
        """Scan every primary for manifests, then read them in pages, in key order."""
        with self._errors(prefix):
            keys = sorted(self._scan_manifests(cast(RedisCluster, self._client), prefix))
        for start in range(0, len(keys), _LIST_PAGE):
            page = keys[start : start + _LIST_PAGE]
            with self._errors(prefix):
                pipe = self._client.pipeline(transaction=False)
                for key in page:
                    pipe.hmget(self.manifest_key(key), "size", "created")
                rows: list[list[bytes | None]] = pipe.execute()
            for key, (size, created) in zip(page, rows, strict=True):
                if size is not None and created is not None:  # else expired since the scan
                    yield ObjectInfo(key=key, size=int(size), modified=float(created))

    def _scan_manifests(self, client: RedisCluster, prefix: str) -> set[str]:
        match = self.layout.manifest_match(prefix)
        found: set[str] = set()
        for node in client.get_primaries():  # type: ignore[no-untyped-call]
            for name in client.get_redis_connection(node).scan_iter(match=match, count=_SCAN_COUNT):
                found.add(self.layout.key_of_manifest(cast(bytes, name).decode()))
        return found

    # -- delete ---------------------------------------------------------------------------
    def delete(self, key: str) -> bool:
        with self._errors(key):
            deleted = self._delete(
                keys=self.layout.script_keys(check_key(key)),
                args=[key, self.config.grace, self.chunk_prefix(key)],
            )
        return bool(deleted)

    def close(self) -> None:
        with self._lock:
            if self._connected is not None:
                self._connected.close()
                self._connected = None

    # -- errors ---------------------------------------------------------------------------
    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:  # includes authentication failures
            raise StoreUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc
        except redis.exceptions.ClusterDownError as exc:
            raise StoreUnavailable(f"{self.url}: the cluster is down: {exc}") from exc
        except redis.ResponseError as exc:
            if str(exc).startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
                raise StoreUnavailable(f"{self.url}: {exc}") from exc
            if str(exc).startswith("CLUSTERDOWN"):  # unparsed by older redis-py
                raise StoreUnavailable(f"{self.url}: the cluster is down: {exc}") from exc
            code = _cluster_reply(exc)
            if code and not self.config.cluster:
                raise StoreError(
                    f"{self.url}: the server is a Redis Cluster node (it answered {code}): "
                    "use a redis-cluster:// or rediss-cluster:// URL"
                ) from exc
            raise StoreError(f"{self.url}: {key!r}: {exc}") from exc
        except RedisClusterException as exc:
            raise _cluster_error(self.url, exc) from exc
        except redis.RedisError as exc:
            raise StoreError(f"{self.url}: {key!r}: {type(exc).__name__}: {exc}") from exc


def _cluster_reply(exc: redis.ResponseError) -> str | None:
    """The code of an error reply that only a cluster gives, or ``None``."""
    for code, kind in _CLUSTER_ONLY:
        if isinstance(exc, kind) or str(exc).startswith(f"{code} "):
            return code
    return None


def _cluster_error(url: str, exc: RedisClusterException) -> StoreError:
    """A cluster client's own failure: a server that is no cluster, or no node that answers."""
    text = str(exc)
    if "not enabled" in text:
        return StoreError(
            f"{url}: the server is not a Redis Cluster (cluster mode is not enabled on it): "
            "use a redis:// or rediss:// URL for a standalone server"
        )
    if "cannot be connected" in text or "covered" in text:
        return StoreUnavailable(f"{url}: {text}")
    return StoreError(f"{url}: {text}")


def _bounded_parallel(work: Callable[[int, bytes], _T], pieces: Iterator[bytes], workers: int) -> Iterator[_T]:
    """Run ``work(i, piece)`` for each piece on a pool, at most ``workers`` pieces in flight.

    Results come back in order; the first failure stops the intake and is raised.
    """
    pending: deque[Future[_T]] = deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="redis-put") as pool:
        try:
            for index, piece in enumerate(pieces):
                if len(pending) >= workers:
                    yield pending.popleft().result()
                pending.append(pool.submit(work, index, piece))
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
