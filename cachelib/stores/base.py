"""The store interface shared by every backend.

A store holds opaque blobs (bundles) under cache-key strings. It knows nothing about
the bundle format: it moves bytes. Every backend keeps one promise on top of the
obvious ones: a publish is atomic for readers, so a reader sees either no object
or the whole, final object, never a half-written one.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import BinaryIO


class StoreError(Exception):
    """Base of every store failure; the message names the store URL and the key."""


class StoreUnavailable(StoreError):
    """The backend cannot be reached (connection refused, DNS, timeout, auth).

    Callers on the preload path turn this into a counted miss, never a failed pod
    (unless strict mode is asked for).
    """


class NotFound(StoreError):
    """No object under that key."""


class StoreURLError(StoreError, ValueError):
    """A store URL that no backend accepts, or one with a bad option."""


class SizeMismatch(StoreError, ValueError):
    """The stream given to ``put`` did not hold the announced number of bytes; nothing was published."""


class InvalidObjectKey(StoreError, ValueError):
    """An object key that no store accepts (see :func:`check_key`)."""


class ObjectChanged(StoreError):
    """The object was replaced or deleted while it was being read.

    Raised instead of ever handing a reader bytes from two versions; the caller may retry.
    """


_KEY_SEGMENT = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]*$")
MAX_KEY_LENGTH = 1024
MAX_SEGMENT_LENGTH = 200


def check_key(key: str) -> str:
    """Return ``key`` when every store can hold it, else raise :class:`InvalidObjectKey`.

    A key is ``/``-separated segments of ``[A-Za-z0-9._+-]`` that do not start with a dot
    (so no ``.``/``..`` and no hidden names), at most 200 characters each and 1024 in all
    (file systems cap a name at 255 bytes; the file store needs room for a temporary
    suffix). Such a key maps unchanged onto a relative file path, a Redis key and an S3
    object key. Cache-key strings (``str(CacheKey)``) always qualify.
    """
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidObjectKey(f"object key {key!r}: must be 1 to {MAX_KEY_LENGTH} characters")
    for segment in key.split("/"):
        if not _KEY_SEGMENT.match(segment) or len(segment) > MAX_SEGMENT_LENGTH:
            raise InvalidObjectKey(
                f"object key {key!r}: segment {segment!r} must be 1 to {MAX_SEGMENT_LENGTH} characters "
                "of [A-Za-z0-9._+-], not starting with '.'"
            )
    return key


@dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object."""

    key: str
    size: int
    modified: float
    """Seconds since the epoch at which the object was published."""
    sha256: str | None = None
    """Digest of the object's bytes, recorded by the store when it was published; None when the
    store has none (an object published by an older version, or one it could not record)."""


class Store(abc.ABC):
    """put/get as streams, head, list by prefix, delete."""

    url: str
    """The store's URL as it may be shown and logged: any password is masked."""

    @abc.abstractmethod
    def put(self, key: str, stream: BinaryIO, size: int | None = None) -> ObjectInfo:
        """Store everything read from ``stream`` under ``key``, atomically for readers.

        ``size`` (when known) lets a backend plan chunks; when the stream then ends early or
        runs long, nothing is published and :class:`StoreError` names both sizes. (A caller
        that shows progress wraps ``stream``, see :mod:`cachelib.progress`.)
        The sha256 of the bytes is recorded with the object where the backend can (see
        :attr:`ObjectInfo.sha256`) and returned in the :class:`ObjectInfo`.
        """

    @abc.abstractmethod
    def get(self, key: str) -> AbstractContextManager[BinaryIO]:
        """Open the object for streaming reads; use the result in a ``with`` block.

        Raises :class:`NotFound` when absent (at the call, not at the first read). A reader
        that races a re-publish or delete either reads the whole old version or gets
        :class:`ObjectChanged`; it never gets bytes of two versions.
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's size, publish time and recorded sha256, or ``None`` when absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove the object; ``True`` when something was deleted."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default has nothing to release."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
