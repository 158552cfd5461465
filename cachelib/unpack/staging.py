"""Staging directories with their locks, and removing what killed unpackers left."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cachelib.unpack.common import (
    LOCK_SUFFIX,
    NEW_LOCK_PREFIX,
    STAGING_PREFIX,
    UNLOCKED_STALE_SECONDS,
    Sharing,
    UnpackError,
    create_exclusive,
)


@dataclass
class Staging:
    """A staging directory and the lock file beside it, held (``flock``) while the directory is used."""

    path: Path
    lock_path: Path
    lock_fd: int

    def release(self) -> None:
        """Remove the directory (if still there), then the lock file, then let go of the lock."""
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(self.lock_path)
        os.close(self.lock_fd)


def open_staging(parent: Path, sharing: Sharing) -> Staging:
    """A fresh staging directory in ``parent``, its lock file created and locked before it exists.

    The lock file is made under a name cleaners leave alone, locked, then renamed to
    ``<staging>.lock``; only then is the directory created. A cleaner that can lock a
    ``.lock`` file therefore knows its owner is gone.
    """
    try:
        fd, temporary = create_exclusive(parent, NEW_LOCK_PREFIX)
    except OSError as exc:
        raise UnpackError(
            f"cannot write into {parent} (uid {os.geteuid()}, gid {os.getegid()}): {exc.strerror or exc}"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        sharing.own(temporary)
        os.fchmod(fd, sharing.file_mode())  # other uids of the group may then take it when we are gone
        stem = f"{parent}/{STAGING_PREFIX}{secrets.token_hex(8)}"
        os.rename(temporary, stem + LOCK_SUFFIX)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        os.close(fd)
        raise
    staging = Staging(Path(stem), Path(stem + LOCK_SUFFIX), fd)
    try:
        os.mkdir(stem, 0o700)
    except BaseException:
        staging.release()
        raise
    return staging


def make_staging(target: Path, sharing: Sharing | None = None) -> Staging:
    """A fresh staging directory on the target's file system (see the module docstring)."""
    parent = target if target.exists() else target.parent
    parent.mkdir(parents=True, exist_ok=True)
    return open_staging(parent, sharing or Sharing())


def remove_stale_staging(directory: Path, *, now: float | None = None) -> list[str]:
    """Remove the staging directories in ``directory`` whose unpacker is gone; their names.

    A staging directory is stale when the lock file beside it can be locked (the kernel
    released its dead owner's lock, in whatever PID namespace that owner ran), or, without a
    lock file (an older unpacker), when it is older than :data:`UNLOCKED_STALE_SECONDS`.
    """
    now = time.time() if now is None else now
    removed: list[str] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    names = {entry.name for entry in entries}
    for entry in entries:
        name = entry.name
        if name.startswith(STAGING_PREFIX) and name.endswith(LOCK_SUFFIX):
            if _reap_locked(Path(directory), name[: -len(LOCK_SUFFIX)]):
                removed.append(name[: -len(LOCK_SUFFIX)])
        elif name.startswith(STAGING_PREFIX) and name + LOCK_SUFFIX not in names:
            if _older_than(entry, now, UNLOCKED_STALE_SECONDS) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(name)
        elif name.startswith(NEW_LOCK_PREFIX) and _older_than(entry, now, UNLOCKED_STALE_SECONDS):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    return removed


def _older_than(entry: os.DirEntry[str], now: float, seconds: float) -> bool:
    try:
        return now - entry.stat(follow_symlinks=False).st_mtime > seconds
    except OSError:
        return False


def _reap_locked(directory: Path, stem: str) -> bool:
    """Remove ``stem`` and ``stem.lock`` when the lock can be taken; whether it could."""
    lock = directory / (stem + LOCK_SUFFIX)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # gone meanwhile, or not ours to read
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: its unpacker is at work
        shutil.rmtree(directory / stem, ignore_errors=True)
        if (directory / stem).exists():
            return False  # not ours to remove (another uid's, and no group write)
        with contextlib.suppress(OSError):
            os.unlink(lock)
        return True
    finally:
        os.close(fd)
