"""The store interface shared by every backend.

A store holds opaque blobs (bundles) under cache-key strings. It knows nothing about
the bundle format: it moves bytes. Every backend keeps one promise on top of the
obvious ones: a publish is atomic for readers, so a reader sees either no object
or the whole, final object, never a half-written one.
"""

from __future__ import annotations

import abc
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


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float
    """Seconds since the epoch at which the object was published."""


class Store(abc.ABC):
    """put/get as streams, head, list by prefix, delete."""

    url: str

    @abc.abstractmethod
    def put(self, key: str, stream: BinaryIO, size: int | None = None, *, progress: bool = False) -> ObjectInfo:
        """Store everything read from ``stream`` under ``key``, atomically for readers.

        ``size`` (when known) lets a backend plan chunks and show a progress bar;
        ``progress`` asks for one (shown only when stderr is a terminal).
        """

    @abc.abstractmethod
    def get(self, key: str, *, progress: bool = False) -> AbstractContextManager[BinaryIO]:
        """Open the object for streaming reads. Raises :class:`NotFound` when absent."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and publish time, or ``None`` when absent."""

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
