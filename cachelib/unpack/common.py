"""What every step of unpacking shares: names, errors, who may write the tree, limits, the cancel gate."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STAGING_PREFIX = ".compilecache-staging-"
LOCK_SUFFIX = ".lock"
NEW_LOCK_PREFIX = ".compilecache-newlock-"
"""A staging lock file before it gets its name (cleaners ignore it until it is old)."""
LOCAL_PREFIX = ".compilecache"
"""Top-level names starting with this are this module's bookkeeping: never taken from an archive."""
STATE_DIR = ".compilecache"
MARKER_DIR = f"{STATE_DIR}/bundles"
BUNDLE_LOCK_PREFIX = ".compilecache-bundle-"
UNLOCKED_STALE_SECONDS = 600.0
"""A staging directory without a lock file (left by an older unpacker) is removed once this old."""
RUNTIME_DIRS = ("locks", "fxgraph", "aotautograd", "dynamo", "triton", "cache")
"""Directories torch 2.x creates under ``TORCHINDUCTOR_CACHE_DIR`` at run time and writes into:
``locks/`` (every ``FileLock`` of ``torch._inductor.codecache.get_lock_dir()``), ``fxgraph/``
(FxGraphCache), ``aotautograd/`` (AOTAutogradCache), ``dynamo/`` (PGO state and DynamoCache),
``triton/`` (the default ``TRITON_CACHE_DIR``, ``triton/<device>``) and ``cache/`` (the local
autotuning cache). Code files go into two-character directories made on demand under the root."""
SHARE_OWNER, SHARE_GROUP, SHARE_ALL = "owner", "group", "all"
SHARE_MODES = (SHARE_OWNER, SHARE_GROUP, SHARE_ALL)
DEFAULT_MAX_MEMBER_BYTES = 16 * 1024**3
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024**3
DEFAULT_MAX_MEMBERS = 1_000_000


class UnpackError(Exception):
    """The archive cannot be unpacked; the message names the member."""


class UnsafeMember(UnpackError):
    """A member that would write outside the target or is not a plain file, directory or inner link."""


class MemberTooLarge(UnpackError):
    """A member larger than the per-member limit."""


class ArchiveTooLarge(UnpackError):
    """The members add up to more than the total limit (or are too many)."""


class CorruptArchive(UnpackError):
    """The tar stream itself is malformed."""


class Cancelled(UnpackError):
    """The unpack was called off (the preload's deadline passed); nothing was installed."""


class OwnershipError(UnpackError):
    """The tree cannot be handed to the requested uid/gid (no CAP_CHOWN)."""


@dataclass(frozen=True)
class Sharing:
    """Who may write the unpacked tree: the modes and (optionally) the owner it gets."""

    share: str = SHARE_OWNER
    owner: tuple[int, int] | None = None
    """(uid, gid) to hand every created path to; None keeps the unpacker's own."""

    def __post_init__(self) -> None:
        if self.share not in SHARE_MODES:
            raise ValueError(f"share {self.share!r}: expected one of {', '.join(SHARE_MODES)}")

    @property
    def dir_mode(self) -> int:
        return {SHARE_OWNER: 0o755, SHARE_GROUP: 0o2775, SHARE_ALL: 0o777}[self.share]

    def file_mode(self, archived: int = 0o644) -> int:
        """The mode of a file the archive gives ``archived``: never setuid, setgid or sticky."""
        if self.share == SHARE_OWNER:
            return (archived & 0o755) | 0o600
        executable = 0o111 if archived & 0o111 else 0
        return (0o664 if self.share == SHARE_GROUP else 0o666) | executable

    def own(self, path: str | Path, *, follow: bool = True) -> None:
        """Hand ``path`` to :attr:`owner` (a no-op without one); :class:`OwnershipError` when refused."""
        if self.owner is None:
            return
        try:
            os.chown(path, *self.owner, follow_symlinks=follow)
        except PermissionError as exc:
            raise OwnershipError(chown_refused(self.owner, path, exc)) from None

    def made_dir(self, path: str | Path) -> None:
        """Give a directory this unpacker created its owner and mode (owner first: chown may clear setgid)."""
        self.own(path)
        os.chmod(path, self.dir_mode)

    def adopt_dir(self, path: str | Path) -> None:
        """Best effort for a directory that was already there: the same owner and mode when this
        process may change them (its own, or any as root); someone else's stays as it is."""
        try:
            st = os.stat(path)
        except OSError:
            return
        if st.st_uid != os.geteuid() and os.geteuid() != 0:
            return
        with contextlib.suppress(OwnershipError, PermissionError):
            if self.owner is not None and (st.st_uid, st.st_gid) != self.owner:
                self.own(path)
            if (st.st_mode & 0o7777) != self.dir_mode:
                os.chmod(path, self.dir_mode)

    def make_dir(self, path: str | Path) -> bool:
        """Create ``path`` with this owner and mode, or adopt it when it is already a directory;
        True when it was made here."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            self.adopt_dir(path)
            return False
        self.made_dir(path)
        return True

    def made_file(self, path: str | Path) -> None:
        """Give a small file this unpacker wrote (a marker, a lock file) its owner and mode."""
        self.own(path)
        os.chmod(path, self.file_mode())


def chown_refused(owner: tuple[int, int], path: str | Path, exc: OSError) -> str:
    return (
        f"--owner {owner[0]}:{owner[1]}: cannot hand {path} over ({exc.strerror or exc}); changing "
        "ownership needs CAP_CHOWN (run the preload as root, or add the capability)"
    )


def check_can_own(directory: Path, owner: tuple[int, int]) -> None:
    """Prove that this process may hand files in ``directory`` to ``owner``: chown a scratch file.

    Raises :class:`OwnershipError` (no CAP_CHOWN) before anything is fetched.
    """
    fd, probe = create_exclusive(directory, ".compilecache-chown-probe-")
    os.close(fd)
    try:
        os.chown(probe, *owner)
    except PermissionError as exc:
        raise OwnershipError(chown_refused(owner, directory, exc)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)


def write_problem(path: Path) -> str | None:
    """Why this user cannot write ``path`` (a directory that may not exist yet), or None: the path, or
    the nearest of its parents that exists, must be a directory it may write and enter."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        what = f"{path}" if existing == path else f"{path} (its parent {existing} is not writable)"
        return f"no permission: uid {os.geteuid()} may not write {what}"
    return None


def parse_owner(text: str) -> tuple[int, int]:
    """``UID:GID`` (non-negative integers) -> (uid, gid); ValueError naming the text."""
    uid, sep, gid = text.partition(":")
    if not sep or not uid.isdigit() or not gid.isdigit():
        raise ValueError(f"owner {text!r}: expected UID:GID, two non-negative integers such as 1000:1000")
    return int(uid), int(gid)


class Gate:
    """Lets an unpack be called off from another thread, but never in the middle of installing.

    The unpacker calls :meth:`check` between members and pieces and installs inside
    :meth:`installing`; :meth:`close` (the deadline) waits for an install under way to end,
    then makes every later :meth:`check` raise :class:`Cancelled` and returns the staging
    directories still in use, for the caller to remove.
    """

    def __init__(self, reason: str = "called off") -> None:
        self.reason = reason
        self._lock = threading.Lock()
        self._closed = False
        self._staging: set[Path] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self) -> None:
        if self._closed:
            raise Cancelled(self.reason)

    @contextlib.contextmanager
    def installing(self) -> Iterator[None]:
        with self._lock:
            self.check()
            yield

    def staged(self, path: Path) -> None:
        with self._lock:
            self._staging.add(path)

    def unstaged(self, path: Path) -> None:
        with self._lock:
            self._staging.discard(path)

    def close(self, reason: str | None = None) -> list[Path]:
        with self._lock:
            if reason:
                self.reason = reason
            self._closed = True
            return sorted(self._staging)


@dataclass(frozen=True)
class Limits:
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS


@dataclass
class UnpackStats:
    members: int = 0
    files: int = 0
    bytes: int = 0
    installed: int = 0
    identical: int = 0
    conflicts: int = 0
    skipped: int = 0
    """Members left out: lock files and bookkeeping (see :func:`is_local_only`)."""


def create_exclusive(directory: Path, prefix: str) -> tuple[int, str]:
    while True:
        name = f"{directory}/{prefix}{secrets.token_hex(8)}"
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600), name
        except FileExistsError:
            continue
