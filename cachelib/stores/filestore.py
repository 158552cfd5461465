"""``file:///root``: each object is a file under ``root`` at the object key's path.

A publish writes a hidden temporary file next to its destination, fsyncs it and renames
it into place, so readers see the old file or the new one, never a partial one; an open
reader keeps reading the version it opened. Hidden names (leading ``.``) are never
objects: that is where the temporary files live, and ``list`` skips them.

The sha256 of an object is kept in its extended attribute ``user.compilecache.sha256``, set on
the temporary file before the rename, so the digest always belongs to the bytes beside it. On
a file system without user extended attributes the store records none (``head`` gives None).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO

from cachelib.stores._stream import read_pieces
from cachelib.stores.base import (
    NotFound,
    ObjectInfo,
    Store,
    StoreError,
    StoreUnavailable,
    check_key,
)
from cachelib.stores.urls import FileStoreURL

_COPY_SIZE = 1024 * 1024
_MKDIR_ATTEMPTS = 5
SHA256_XATTR = "user.compilecache.sha256"


class FileStore(Store):
    """Objects as files under a root directory (created on the first publish)."""

    def __init__(self, config: FileStoreURL, url: str) -> None:
        self.root = config.root
        self.url = url

    def path_of(self, key: str) -> str:
        """Where the object ``key`` lives on disk."""
        return os.path.join(self.root, *check_key(key).split("/"))

    # -- put ------------------------------------------------------------------------------
    def put(self, key: str, stream: BinaryIO, size: int | None = None) -> ObjectInfo:
        path = self.path_of(key)
        directory, name = os.path.split(path)
        temp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        fd = self._create_temp(key, directory, temp)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for piece in read_pieces(stream, _COPY_SIZE, size, f"{self.url}: put {key}", digest):
                    with self._writing(key):
                        out.write(piece)
                with self._writing(key):
                    out.flush()
                    os.fsync(out.fileno())
                recorded = _set_sha256(out.fileno(), digest.hexdigest())
            with self._writing(key):
                os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        _fsync_directory(directory)
        stat = os.stat(path)
        return ObjectInfo(key=key, size=stat.st_size, modified=stat.st_mtime, sha256=recorded)

    @contextlib.contextmanager
    def _writing(self, key: str) -> Iterator[None]:
        """Turn a failure of our own writes (not of the source stream) into a StoreError."""
        try:
            yield
        except IsADirectoryError as exc:
            raise StoreError(f"{self.url}: cannot publish {key!r}: other objects live under that key") from exc
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot publish {key!r}: {exc}") from exc

    def _create_temp(self, key: str, directory: str, temp: str) -> int:
        # A concurrent delete may remove an empty parent between makedirs and open: retry.
        for attempt in range(_MKDIR_ATTEMPTS):
            try:
                os.makedirs(directory, exist_ok=True)
                return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
            except FileNotFoundError:
                if attempt == _MKDIR_ATTEMPTS - 1:
                    raise StoreError(f"{self.url}: cannot create {directory}") from None
            except (FileExistsError, NotADirectoryError):
                raise StoreError(
                    f"{self.url}: cannot publish {key!r}: a parent of that key is itself an object"
                ) from None
            except OSError as exc:
                raise StoreError(f"{self.url}: cannot publish {key!r}: {exc}") from exc
        raise AssertionError("unreachable")

    # -- get / head -----------------------------------------------------------------------
    def get(self, key: str) -> AbstractContextManager[BinaryIO]:
        path = self.path_of(key)
        try:
            raw = open(path, "rb", buffering=0)  # noqa: SIM115 - handed to the caller, who closes it
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(f"{self.url}: no object {key!r}") from None
        except OSError as exc:
            raise StoreUnavailable(f"{self.url}: cannot read {key!r}: {exc}") from exc
        return io.BufferedReader(raw, buffer_size=_COPY_SIZE)

    def head(self, key: str) -> ObjectInfo | None:
        path = self.path_of(key)
        try:
            stat = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreUnavailable(f"{self.url}: cannot stat {key!r}: {exc}") from exc
        if not os.path.isfile(path):
            return None
        return ObjectInfo(key=key, size=stat.st_size, modified=stat.st_mtime, sha256=_get_sha256(path))

    # -- list -----------------------------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        directory = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if directory:
            check_key(directory)
            start = os.path.join(self.root, *directory.split("/"))
            return self._walk(start, directory + "/", prefix)
        return self._walk(self.root, "", prefix)

    def _walk(self, directory: str, relative: str, prefix: str) -> Iterator[ObjectInfo]:
        """Objects under ``directory`` in key order.

        Sorting each directory's entries by name, with ``/`` appended to directories, yields
        the keys in plain string order (``a-b/x`` < ``a/b`` because ``-`` < ``/``).
        """
        try:
            with os.scandir(directory) as scan:
                entries = [(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in scan]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreUnavailable(f"{self.url}: cannot list {directory}: {exc}") from exc
        for sort_name, entry in sorted(entries, key=lambda pair: pair[0]):
            if entry.name.startswith("."):
                continue
            key = relative + sort_name
            if sort_name.endswith("/"):
                if key.startswith(prefix) or prefix.startswith(key):
                    yield from self._walk(entry.path, key, prefix)
            elif key.startswith(prefix) and entry.is_file(follow_symlinks=False):
                try:
                    stat = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted since the scan
                    continue
                yield ObjectInfo(key=key, size=stat.st_size, modified=stat.st_mtime)

    # -- delete ---------------------------------------------------------------------------
    def delete(self, key: str) -> bool:
        path = self.path_of(key)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return False
        except OSError as exc:
            raise StoreError(f"{self.url}: cannot delete {key!r}: {exc}") from exc
        self._prune_empty_parents(os.path.dirname(path))
        return True

    def _prune_empty_parents(self, directory: str) -> None:
        root = os.path.abspath(self.root)
        while os.path.abspath(directory) != root and directory.startswith(self.root):
            try:
                os.rmdir(directory)
            except OSError:
                return
            directory = os.path.dirname(directory)


def _fsync_directory(directory: str) -> None:
    """Make a rename durable (best effort: some file systems refuse to fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _set_sha256(fd: int, digest: str) -> str | None:
    """Record ``digest`` on the open file; None when the file system keeps no user attributes."""
    try:
        os.setxattr(fd, SHA256_XATTR, digest.encode())
    except (OSError, AttributeError):
        return None
    return digest


def _get_sha256(path: str) -> str | None:
    try:
        value = os.getxattr(path, SHA256_XATTR).decode()
    except (OSError, AttributeError, UnicodeDecodeError):
        return None
    return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None
