"""A store whose every call fails with an unexpected error, as a store library's own bug would."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO

from cachelib.stores import ObjectInfo, Store


class BrokenStore(Store):
    """A store whose every call raises what no caller expects (as redis-py 5.0 did with a newer
    Retry signature: TypeError from inside the client)."""

    url = "broken://"

    def _boom(self) -> None:
        raise TypeError("call_with_retry() takes 3 positional arguments but 5 were given")

    def put(self, key: str, stream: BinaryIO, size: int | None = None) -> ObjectInfo:
        self._boom()
        raise AssertionError

    def get(self, key: str) -> AbstractContextManager[BinaryIO]:
        self._boom()
        raise AssertionError

    def head(self, key: str) -> ObjectInfo | None:
        self._boom()
        return None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._boom()
        return iter(())

    def delete(self, key: str) -> bool:
        self._boom()
        return False
