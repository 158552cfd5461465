"""Safe, atomic unpacking of a cache-directory tar into a target directory.

Nothing reaches the target until the archive has been read to its end and its digest
checked. The steps:

1. **Stage.** Members are extracted into a fresh staging directory on the target's file
   system: next to the target when the target does not exist yet, otherwise a hidden
   ``.compilecache-staging-*`` directory inside it (the target may be a mount point, such
   as a pod's ``emptyDir``, which cannot be renamed and whose parent may be another file
   system). Every member is checked first; the first unsafe one stops everything:
   absolute names, ``..`` components, members below a symlink, symlinks or hardlinks that
   point outside the archive, devices, FIFOs and other special files, a member over
   ``max_member_bytes``, a total over ``max_total_bytes`` or more than ``max_members``.
   The tar is parsed here (:class:`TarReader`: ustar, GNU long names, pax), from large
   reads of the decompressed stream; member data goes from those reads to the files
   without further copies. A damaged header (bad checksum, a number that is not one, a
   malformed pax record) or an archive that ends inside a header or member is refused.
2. **Verify.** The caller's ``verify`` (the bundle part's size and sha256 check) runs
   after the tar's last byte.
3. **Install.** A missing target is created by renaming the staging directory into place:
   one atomic step. An existing target is merged file by file: each file (or symlink) is
   hard-linked into place, which never replaces an existing name, then the staged name is
   removed. A file that already exists with the same content counts as identical; one
   that exists with other content is kept and counted as a conflict (inductor's cache
   files are content-addressed, so a conflict means another variant's compile of the
   same graph, and either copy serves). Each file therefore appears whole or not at all,
   and several bundles can be merged into one cache directory.

On any failure the staging directory is removed and the target is left as it was.

**Who may write the tree** (:class:`Sharing`). The preloader and the workload usually run as
different users. ``owner`` is owner-only write (directories 0755, files the archive's mode
within 0755); ``group`` makes every directory 0o2775 (setgid: what is created later inherits the
directory's group, a pod's fsGroup on an emptyDir) and every file 0o664 (0o775 when the
archive marks it executable); ``all`` makes directories 0o777 and files 0o666 (0o777). With an
``owner`` uid/gid the tree is also handed to that user (needs CAP_CHOWN). :func:`prepare_cache_dir`
creates the directories torch writes into at run time (:data:`RUNTIME_DIRS`, ``locks/`` among
them) with the same modes. Lock files and this module's own bookkeeping are never taken from an
archive.

**Staging locks.** Each staging directory ``.compilecache-staging-<random>`` has a lock file
beside it, ``.compilecache-staging-<random>.lock``, created and ``flock``-ed before the
directory exists and held until the directory is gone. A later unpacker removes the staging
directories whose lock it can take: their owner is dead (the kernel drops a dead process's
locks), whatever PID namespace it ran in.

**Node caches.** A directory shared by several pods (a hostPath) gets, per installed bundle,
a completed-bundle marker ``.compilecache/bundles/<digest of the key>.json`` recording the
bundle's key, size and sha256, written after the bundle is completely installed (into the
staging directory before the rename when the target did not exist). Preloads of the same key
into the same target are serialised by a lock file (:func:`bundle_lock`); the one that comes
second finds the marker and fetches nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import filecmp
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

STAGING_PREFIX = ".compilecache-staging-"
LOCK_SUFFIX = ".lock"
_NEW_LOCK_PREFIX = ".compilecache-newlock-"
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
            raise OwnershipError(_chown_refused(self.owner, path, exc)) from None

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


def _chown_refused(owner: tuple[int, int], path: str | Path, exc: OSError) -> str:
    return (
        f"--owner {owner[0]}:{owner[1]}: cannot hand {path} over ({exc.strerror or exc}); changing "
        "ownership needs CAP_CHOWN (run the preload as root, or add the capability)"
    )


def check_can_own(directory: Path, owner: tuple[int, int]) -> None:
    """Prove that this process may hand files in ``directory`` to ``owner``: chown a scratch file.

    Raises :class:`OwnershipError` (no CAP_CHOWN) before anything is fetched.
    """
    fd, probe = _mkstemp(directory, ".compilecache-chown-probe-")
    os.close(fd)
    try:
        os.chown(probe, *owner)
    except PermissionError as exc:
        raise OwnershipError(_chown_refused(owner, directory, exc)) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)


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


# -- the tar stream ---------------------------------------------------------------------------------
BLOCK = 512
CHUNK_BYTES = 4 * 1024 * 1024
"""Size of the reads from the decompressed tar stream."""
MAX_EXTENDED_HEADER = 64 * 1024
"""Largest pax or GNU long-name header accepted (real ones are a few hundred bytes)."""

REGULAR, HARDLINK, SYMLINK, CHARDEV, BLOCKDEV, DIRECTORY, FIFO = b"0", b"1", b"2", b"3", b"4", b"5", b"6"
_REGULAR_TYPES = (REGULAR, b"\x00", b"7")  # "7" is a contiguous file: a regular file to everyone
_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK = b"x", b"g", b"L", b"K"
_USTAR_MAGIC = b"ustar\x0000"


@dataclass(frozen=True)
class Member:
    """One tar member as the archive describes it (names already combined with pax / GNU long names)."""

    name: str
    type: bytes
    size: int
    mode: int = 0o644
    mtime: float = 0.0
    linkname: str = ""

    def isfile(self) -> bool:
        return self.type in _REGULAR_TYPES

    def isdir(self) -> bool:
        return self.type == DIRECTORY

    def issym(self) -> bool:
        return self.type == SYMLINK

    def islnk(self) -> bool:
        return self.type == HARDLINK

    def ischr(self) -> bool:
        return self.type == CHARDEV

    def isblk(self) -> bool:
        return self.type == BLOCKDEV

    def isfifo(self) -> bool:
        return self.type == FIFO


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _number(field: bytes, what: str, offset: int) -> int:
    """An octal (or GNU base-256) header number."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[0] == 0xFF else value
    digits = field.split(b"\x00", 1)[0].strip()
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise CorruptArchive(f"archive: header at byte {offset}: field {what} is not a number: {field!r}") from None


def header_checksum_ok(block: bytes | memoryview) -> bool:
    """The ustar checksum: the header's bytes summed with the checksum field read as spaces."""
    digits = bytes(block[148:156]).split(b"\x00", 1)[0].strip()
    if not digits or digits.strip(b"01234567"):
        return False
    recorded = int(digits, 8)
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:BLOCK])
    if recorded == unsigned:
        return True
    signed = unsigned - 256 * (sum(1 for b in block[:148] if b > 127) + sum(1 for b in block[156:BLOCK] if b > 127))
    return recorded == signed


def parse_header(block: bytes, offset: int) -> Member:
    """One 512-byte ustar / GNU / pax header block (the extended headers are handled by the reader)."""
    if not header_checksum_ok(block):
        raise CorruptArchive(f"archive: header at byte {offset} has a bad checksum (not a tar, or damaged)")
    kind = block[156:157]
    name = _text(block[0:100])
    if block[257:265] == _USTAR_MAGIC and block[345] != 0:
        name = _text(block[345:500]) + "/" + name
    if kind == b"\x00" and name.endswith("/"):
        kind = DIRECTORY
    size = _number(block[124:136], "size", offset)
    if size < 0:
        raise CorruptArchive(f"archive: header at byte {offset}: negative size {size}")
    return Member(
        name=name,
        type=kind,
        size=size,
        mode=_number(block[100:108], "mode", offset),
        mtime=float(_number(block[136:148], "mtime", offset)),
        linkname=_text(block[157:257]),
    )


_PAX_RECORD = re.compile(rb"(\d{1,9}) ([^=\n]+)=")


def parse_pax(data: bytes, offset: int) -> dict[str, str]:
    """The records of a pax extended header: ``"%d %s=%s\\n"``, the length counting the whole record."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        match = _PAX_RECORD.match(data, pos)
        end = pos + int(match.group(1)) if match else 0
        if match is None or end <= match.end() or end > len(data) or data[end - 1] != ord("\n"):
            raise CorruptArchive(f"archive: pax header at byte {offset} is malformed at its byte {pos}")
        key = match.group(2).decode("utf-8", "surrogateescape")
        records[key] = data[match.end() : end - 1].decode("utf-8", "surrogateescape")
        pos = end
    return records


def _apply_pax(member: Member, records: dict[str, str], offset: int) -> Member:
    if any(key.startswith("GNU.sparse.") for key in records):
        raise UnsafeMember(f"member {member.name!r}: sparse files are not supported")
    changes: dict[str, object] = {}
    if "path" in records:
        changes["name"] = records["path"]
    if "linkpath" in records:
        changes["linkname"] = records["linkpath"]
    try:
        if "size" in records:
            changes["size"] = int(records["size"])
        if "mtime" in records:
            changes["mtime"] = float(records["mtime"])
    except ValueError:
        raise CorruptArchive(f"archive: pax header at byte {offset}: bad size or mtime") from None
    if int(changes.get("size", 0)) < 0:  # type: ignore[call-overload]
        raise CorruptArchive(f"archive: pax header at byte {offset}: negative size")
    return dataclasses.replace(member, **changes)  # type: ignore[arg-type]


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


class TarReader:
    """Reads a tar stream member by member, without seeking.

    The stream is read in chunks of ``chunk_bytes``; :meth:`next` returns the next member
    (``None`` at the end of the archive) and :meth:`data` yields the current member's bytes
    as views of those chunks, without copying them. Data not consumed is skipped by the
    following :meth:`next`.
    """

    def __init__(self, stream: Readable, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._stream = stream
        self._chunk_bytes = chunk_bytes
        self._chunk = memoryview(b"")
        self._pos = 0
        self.offset = 0
        """Archive offset of the first unconsumed byte."""
        self._unread = 0  # data (with padding) of the current member not yet consumed
        self._eof = False
        self._globals: dict[str, str] = {}

    # -- chunks --------------------------------------------------------------------------------
    def _available(self) -> int:
        """Bytes left in the current chunk, reading the next one when it is used up (0 at the end)."""
        if self._pos == len(self._chunk) and not self._eof:
            data = self._stream.read(self._chunk_bytes)
            self._eof = not data
            self._chunk, self._pos = memoryview(data), 0
        return len(self._chunk) - self._pos

    def _pieces(self, size: int, what: str) -> Iterator[memoryview]:
        """The next ``size`` bytes as views of the chunks; :class:`CorruptArchive` naming ``what`` at an early end."""
        while size:
            available = self._available()
            if not available:
                raise CorruptArchive(f"{what} (at byte {self.offset})")
            step = min(size, available)
            piece = self._chunk[self._pos : self._pos + step]
            self._pos += step
            self.offset += step
            size -= step
            yield piece

    def _take(self, size: int, what: str) -> bytes:
        return b"".join(self._pieces(size, f"archive ends inside {what}"))

    def _skip(self, size: int, what: str) -> None:
        for _ in self._pieces(size, f"archive ends inside {what}"):
            pass

    # -- members -------------------------------------------------------------------------------
    def next(self) -> Member | None:
        """The next member, with pax and GNU long names applied; ``None`` at the end-of-archive block."""
        self._skip(self._unread, "the previous member's data")
        self._unread = 0
        pending = _Pending()
        while True:
            at = self.offset
            if not self._available():
                if at == 0:
                    raise CorruptArchive("archive is empty")
                if not pending.any():
                    return None  # ends without the end-of-archive blocks: as tar itself accepts
            block = self._take(BLOCK, "a header")
            if block.count(0) == BLOCK:
                return None
            member = parse_header(block, at)
            if member.type not in _EXTENDED_TYPES:
                member = self._completed(member, pending, at)
                has_data = not (member.isdir() or member.issym() or member.islnk())
                self._unread = _padded(member.size) if has_data else 0
                return member
            self._read_extended(member, at, pending)

    def _read_extended(self, header: Member, at: int, pending: _Pending) -> None:
        """Record a pax or GNU extended header for the member that follows (or, global pax, for all)."""
        data = self._extended(header, at)
        if header.type == _PAX_LOCAL:
            pending.local.update(parse_pax(data, at))
        elif header.type == _PAX_GLOBAL:
            self._globals.update(parse_pax(data, at))
        elif header.type == _GNU_LONGNAME:
            pending.long_name = _text(data)
        else:
            pending.long_link = _text(data)

    def _completed(self, member: Member, pending: _Pending, at: int) -> Member:
        """``member`` with the extended headers before it applied, a directory's trailing ``/`` dropped."""
        if pending.long_name is not None:
            member = dataclasses.replace(member, name=pending.long_name)
        if pending.long_link is not None:
            member = dataclasses.replace(member, linkname=pending.long_link)
        if self._globals or pending.local:
            member = _apply_pax(member, {**self._globals, **pending.local}, at)
        if member.isdir() and member.name.endswith("/"):
            member = dataclasses.replace(member, name=member.name.rstrip("/"))
        return member

    def _extended(self, header: Member, at: int) -> bytes:
        if header.size > MAX_EXTENDED_HEADER:
            raise CorruptArchive(
                f"archive: extended header at byte {at} is {header.size} bytes, over {MAX_EXTENDED_HEADER}"
            )
        data = self._take(header.size, f"the extended header at byte {at}")
        self._skip(_padded(header.size) - header.size, f"the extended header at byte {at}")
        return data

    def data(self, member: Member) -> Iterator[memoryview]:
        """The current member's ``size`` bytes, as views of the stream's chunks (valid while referenced)."""
        self._unread -= member.size
        yield from self._pieces(member.size, f"member {member.name!r}: the archive ends inside its data")


@dataclasses.dataclass
class _Pending:
    """Extended headers read for the member that follows them."""

    local: dict[str, str] = dataclasses.field(default_factory=dict)
    long_name: str | None = None
    long_link: str | None = None

    def any(self) -> bool:
        return bool(self.local) or self.long_name is not None or self.long_link is not None


_EXTENDED_TYPES = (_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK)


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


# -- member checks (pure) ----------------------------------------------------------------------
def member_path(name: str) -> str:
    """The normalised relative path of a member name, or :class:`UnsafeMember` naming it."""
    if "\x00" in name:
        raise UnsafeMember(f"member {name!r}: NUL in the name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeMember(f"member {name!r}: absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeMember(f"member {name!r}: '..' escapes the target")
    return "/".join(parts)


def symlink_destination(path: str, linkname: str) -> str:
    """Where a symlink at ``path`` points, relative to the archive root; refuses links outside."""
    if linkname.startswith("/"):
        raise UnsafeMember(f"member {path!r}: symlink to the absolute path {linkname!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), linkname))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeMember(f"member {path!r}: symlink to {linkname!r} points outside the target")
    return resolved


def check_member(member: Member, limits: Limits) -> str:
    """Validate one member's type, name, link and size; its relative path."""
    path = member_path(member.name)
    if member.issym():
        symlink_destination(path, member.linkname)
    elif member.islnk():
        try:
            target = member_path(member.linkname)
        except UnsafeMember:
            raise UnsafeMember(
                f"member {member.name!r}: hardlink to {member.linkname!r} points outside the target"
            ) from None
        if not target:
            raise UnsafeMember(f"member {member.name!r}: hardlink to the archive root")
    elif member.ischr() or member.isblk():
        raise UnsafeMember(f"member {member.name!r}: device file")
    elif member.isfifo():
        raise UnsafeMember(f"member {member.name!r}: FIFO")
    elif not (member.isfile() or member.isdir()):
        raise UnsafeMember(f"member {member.name!r}: unsupported member type {member.type!r}")
    if member.isfile() and member.size > limits.max_member_bytes:
        raise MemberTooLarge(
            f"member {member.name!r}: {member.size} bytes, over the limit of {limits.max_member_bytes}"
        )
    return path


# -- extraction -----------------------------------------------------------------------------------
def is_local_only(path: str) -> bool:
    """Paths never taken from an archive: lock files (``locks/``, ``*.lock``: they mean something
    only on the machine that made them, and one owned by the unpacker could block the workload)
    and this module's bookkeeping (top-level ``.compilecache*``)."""
    top = path.split("/", 1)[0]
    return top == "locks" or top.startswith(LOCAL_PREFIX) or path.endswith(LOCK_SUFFIX)


def extract_tar(
    stream: Readable, root: Path, limits: Limits, sharing: Sharing | None = None, gate: Gate | None = None
) -> UnpackStats:
    """Extract a tar stream into ``root`` (an empty staging directory), checking every member."""
    stats = UnpackStats()
    links: set[str] = set()
    files: set[str] = set()
    seen: set[str] = set()
    reader = TarReader(stream)
    out = _Files(root, sharing or Sharing(), gate)
    try:
        while (member := reader.next()) is not None:
            if gate is not None:
                gate.check()
            stats.members += 1
            if stats.members > limits.max_members:
                raise ArchiveTooLarge(f"archive: more than {limits.max_members} members")
            path = check_member(member, limits)
            if not path:
                continue  # the root directory entry itself
            if is_local_only(path):
                stats.skipped += 1
                continue
            _refuse_through_links(member.name, path, links)
            if path in seen and not member.isdir():
                raise UnsafeMember(f"member {member.name!r}: appears twice in the archive")
            seen.add(path)
            if member.isfile():
                stats.bytes += member.size
                if stats.bytes > limits.max_total_bytes:
                    raise ArchiveTooLarge(
                        f"archive: over the limit of {limits.max_total_bytes} bytes at member {member.name!r}"
                    )
                out.open_file(path, out.sharing.file_mode(member.mode))
                for piece in reader.data(member):
                    out.write(piece)
                out.close_file(member.mtime)
                files.add(path)
                stats.files += 1
            elif member.isdir():
                out.mkdir(path)
            elif member.issym():
                out.symlink(path, member.linkname)
                links.add(path)
            else:  # hardlink to an earlier regular file
                out.hardlink(path, _hardlink_target(member, links, files))
                files.add(path)
                stats.files += 1
    finally:
        out.close()
    return stats


def _refuse_through_links(name: str, path: str, links: set[str]) -> None:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if prefix in links:
            raise UnsafeMember(f"member {name!r}: lies below the symlink {prefix!r}")


def _hardlink_target(member: Member, links: set[str], files: set[str]) -> str:
    target = member_path(member.linkname)
    _refuse_through_links(member.name, target, links)
    if target not in files:
        raise UnsafeMember(f"member {member.name!r}: hardlink to {member.linkname!r}, which is not an earlier file")
    return target


def _current_umask() -> int:
    """This process's umask, read without changing it (Linux shows it in /proc); all bits when unknown."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o777


class _Files:
    """The file system side of extraction: creates what the checked members describe under ``root``,
    with the modes (and owner) of ``sharing``."""

    def __init__(self, root: Path, sharing: Sharing, gate: Gate | None = None) -> None:
        self.root = str(root)
        self.sharing = sharing
        self._gate = gate
        self._made: set[str] = {self.root}
        self._umask = _current_umask()
        self._fd: int | None = None
        self._mode = 0

    def _dirs(self, rel: str) -> str:
        """Create the directories of ``rel`` below the root, one by one (never the root itself:
        a staging directory removed under a called-off unpack is not brought back)."""
        full = f"{self.root}/{rel}" if rel else self.root
        if full in self._made:
            return full
        current = self.root
        for part in rel.split("/"):
            current = f"{current}/{part}"
            if current in self._made:
                continue
            try:
                os.mkdir(current, 0o700)
            except FileExistsError:
                if not os.path.isdir(current) or os.path.islink(current):
                    raise UnpackError(f"member {rel!r}: {current} exists and is not a directory") from None
            else:
                self.sharing.made_dir(current)
            self._made.add(current)
        return full

    def _parent(self, path: str) -> str:
        parent, _, _ = path.rpartition("/")
        self._dirs(parent)
        return f"{self.root}/{path}"

    def open_file(self, path: str, mode: int) -> None:
        self._fd = os.open(self._parent(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        self._mode = mode

    def write(self, piece: memoryview) -> None:
        assert self._fd is not None
        if self._gate is not None:
            self._gate.check()
        while piece:
            piece = piece[os.write(self._fd, piece) :]

    def close_file(self, mtime: float) -> None:
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            if self.sharing.owner is not None:
                try:
                    os.fchown(fd, *self.sharing.owner)
                except PermissionError as exc:
                    raise OwnershipError(_chown_refused(self.sharing.owner, self.root, exc)) from None
                os.fchmod(fd, self._mode)  # chown clears setgid; the mode is set again after it
            elif self._mode & self._umask:  # the umask took bits away: set the mode the archive asks for
                os.fchmod(fd, self._mode)
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        self._dirs(path)

    def symlink(self, path: str, linkname: str) -> None:
        full = self._parent(path)
        os.symlink(linkname, full)
        self.sharing.own(full, follow=False)

    def close(self) -> None:
        """Close a file left open by an error in the middle of it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def hardlink(self, path: str, target: str) -> None:
        source, dest = f"{self.root}/{target}", self._parent(path)
        try:
            os.link(source, dest)
        except OSError:
            shutil.copy2(source, dest)
            self.sharing.own(dest)


def make_runtime_dirs(root: Path, sharing: Sharing) -> None:
    """Create :data:`RUNTIME_DIRS` under ``root`` (a staging directory or the cache directory)
    with the sharing's modes; those already there are adopted (see :meth:`Sharing.adopt_dir`)."""
    for name in RUNTIME_DIRS:
        path = root / name
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if path.is_dir() and not path.is_symlink():
                sharing.adopt_dir(path)
            continue
        sharing.made_dir(path)


def prepare_cache_dir(target: Path, sharing: Sharing, *, reused: bool = False) -> None:
    """Make sure the cache directory exists and the workload can write what torch writes at run
    time, whatever the preload's result (a miss leaves an empty but usable cache directory).
    ``reused``: the directory held a cache before this preload (a node cache), so with ``share all``
    what earlier workloads left there is opened again (:func:`reopen_for_all`); a fresh tree needs
    no such walk."""
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    sharing.make_dir(target)
    make_runtime_dirs(target, sharing)
    if reused and sharing.share == SHARE_ALL:
        reopen_for_all(target, sharing)


def reopen_for_all(root: Path, sharing: Sharing) -> None:
    """Open again to every uid what earlier workloads left in a cache shared by apps of many uids (a
    node cache): directories made at their umask (0755) and lock files (0644) that another uid could
    not write. Only what this process may change (its own, or anything with CAP_FOWNER, as a node
    cache's preload has); someone else's stays as it is. Links are never followed."""
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(directory, d))]
        for name in dirnames:
            sharing.adopt_dir(os.path.join(directory, name))
        for name in filenames:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and info.st_mode & 0o666 != 0o666:
                    os.chmod(path, (info.st_mode & 0o777) | 0o666)


# -- staging, and removing what killed unpackers left -------------------------------------------------
def _mkstemp(directory: Path, prefix: str) -> tuple[int, str]:
    while True:
        name = f"{directory}/{prefix}{secrets.token_hex(8)}"
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600), name
        except FileExistsError:
            continue


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
        fd, temporary = _mkstemp(parent, _NEW_LOCK_PREFIX)
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
        elif name.startswith(_NEW_LOCK_PREFIX) and _older_than(entry, now, UNLOCKED_STALE_SECONDS):
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


# -- node caches: completed-bundle markers and per-bundle locks ---------------------------------
def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def marker_path(target: Path, key: str) -> Path:
    """Where the completed-bundle marker of ``key`` lives in the cache directory ``target``."""
    return Path(target) / MARKER_DIR / f"{_key_digest(key)}.json"


def read_marker(target: Path, key: str) -> dict[str, Any] | None:
    """The completed-bundle marker of ``key`` in ``target``; None when absent or not one of ours."""
    try:
        value = json.loads(marker_path(target, key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or value.get("key") != key:
        return None
    return value


def completed(target: Path, key: str, sha256: str | None, size: int | None) -> dict[str, Any] | None:
    """The marker when ``target`` already holds the complete bundle ``key`` of that sha256 and size."""
    if not sha256:
        return None
    marker = read_marker(target, key)
    if marker is None or marker.get("sha256") != sha256 or (size is not None and marker.get("size") != size):
        return None
    return marker


def _ensure_dirs(root: Path, rel: str, sharing: Sharing) -> Path:
    current = root
    for part in rel.split("/"):
        current = current / part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            continue
        sharing.made_dir(current)
    return current


def write_marker(root: Path, key: str, fields: Mapping[str, Any], sharing: Sharing) -> Path:
    """Write the marker of ``key`` under ``root`` atomically (temporary name, then renamed)."""
    directory = _ensure_dirs(root, MARKER_DIR, sharing)
    path = marker_path(root, key)
    fd, temporary = _mkstemp(directory, ".tmp-")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps({"key": key, **fields}, sort_keys=True) + "\n")
        sharing.made_file(temporary)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def bundle_lock_path(target: Path, key: str) -> Path:
    """The lock file that serialises preloads of ``key`` into ``target``: beside the target (named
    after it and the key), where a target that does not exist yet is staged; inside the target
    when its parent is not writable (a target that is itself a mount point). The choice does not
    depend on whether the target exists, so every preload of the key picks the same file."""
    target = Path(target).absolute()
    digest = hashlib.sha256(f"{target.name}\0{key}".encode()).hexdigest()[:32]
    parent = target.parent
    beside = not parent.exists() or os.access(parent, os.W_OK | os.X_OK)
    return (parent if beside else target) / f"{BUNDLE_LOCK_PREFIX}{digest}{LOCK_SUFFIX}"


@contextlib.contextmanager
def bundle_lock(
    target: Path,
    key: str,
    sharing: Sharing,
    *,
    gate: Gate | None = None,
    poll: float = 0.05,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Hold the per-bundle lock of ``key`` in ``target`` (waiting for another holder, checking
    ``gate`` while waiting). Lock files stay: removing a lock file others may hold is racy."""
    path = bundle_lock_path(target, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            with contextlib.suppress(OSError):
                sharing.own(path)
                os.fchmod(fd, sharing.file_mode())
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if not waited and on_wait is not None:
                on_wait()
            waited = True
            if gate is not None:
                gate.check()
            time.sleep(poll)
        yield
    finally:
        os.close(fd)


# -- installation --------------------------------------------------------------------------------
def install(
    staging: Path,
    target: Path,
    stats: UnpackStats,
    sharing: Sharing | None = None,
    marker: Mapping[str, Any] | None = None,
) -> None:
    """Move the staged tree into ``target``: one rename when absent, else a file-by-file merge.

    ``marker`` (the key and the fields of a completed-bundle marker) is written when the
    tree is complete: into the staging directory before the rename, after the merge otherwise.
    """
    sharing = sharing or Sharing()
    if not target.exists() and _rename_into_place(staging, target, stats, sharing, marker):
        return
    if not target.is_dir():
        raise UnpackError(f"target {target} exists and is not a directory")
    sharing.adopt_dir(target)
    _merge(staging, target, stats, sharing)
    if marker is not None:
        _write_marker_for(target, marker, stats, sharing)


def _rename_into_place(
    staging: Path, target: Path, stats: UnpackStats, sharing: Sharing, marker: Mapping[str, Any] | None
) -> bool:
    """Rename the staged tree (marker included) to the absent ``target``; False when another
    preload created ``target`` meanwhile (then the trees are merged)."""
    if marker is not None:
        _write_marker_for(staging, marker, stats, sharing)
    sharing.made_dir(staging)
    try:
        os.rename(staging, target)
    except FileExistsError:
        return False  # created meanwhile by someone else
    except OSError as exc:
        if (exc.errno == errno.ENOTEMPTY and target.is_dir()) or target.exists():
            return False  # created (and filled) meanwhile
        raise UnpackError(f"cannot move the unpacked cache into {target}: {exc.strerror or exc}") from exc
    stats.installed += stats.files
    return True


def _merge(staging: Path, target: Path, stats: UnpackStats, sharing: Sharing) -> None:
    """Move the staged tree into the existing ``target`` file by file (the staged marker stays)."""
    for directory, dirnames, filenames in os.walk(staging):
        rel = Path(directory).relative_to(staging)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if not d.startswith(LOCAL_PREFIX)]  # the staged marker
            filenames[:] = [f for f in filenames if not f.startswith(LOCAL_PREFIX)]
        for name in sorted(dirnames):
            src, dest = Path(directory) / name, target / rel / name
            if src.is_symlink():
                filenames.append(name)
                continue
            if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
                raise UnpackError(f"cannot merge directory {rel / name}: {dest} exists and is not a directory")
            sharing.make_dir(dest)
        dirnames[:] = [d for d in dirnames if not (Path(directory) / d).is_symlink()]
        for name in sorted(filenames):
            _install_file(Path(directory) / name, target / rel / name, stats)


def _write_marker_for(root: Path, marker: Mapping[str, Any], stats: UnpackStats, sharing: Sharing) -> None:
    fields = {k: v for k, v in marker.items() if k != "key"}
    fields.update(files=stats.files, unpacked_bytes=stats.bytes, completed=time.time())
    write_marker(root, str(marker["key"]), fields, sharing)


def _install_file(src: Path, dest: Path, stats: UnpackStats) -> None:
    try:
        os.link(src, dest, follow_symlinks=False)
    except FileExistsError:
        if _same_content(src, dest):
            stats.identical += 1
        else:
            stats.conflicts += 1
        return
    except OSError:
        if os.path.lexists(dest):
            stats.identical += int(_same_content(src, dest))
            stats.conflicts += int(not _same_content(src, dest))
            return
        os.replace(src, dest)  # a file system without hard links: rename (dest absent)
        stats.installed += 1
        return
    os.unlink(src)
    stats.installed += 1


def _same_content(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and os.readlink(a) == os.readlink(b)
    return b.is_file() and filecmp.cmp(a, b, shallow=False)


def unpack_tar_verified(
    stream: Readable,
    verify: Callable[[], None],
    target: Path,
    limits: Limits | None = None,
    *,
    sharing: Sharing | None = None,
    marker: Mapping[str, Any] | None = None,
    gate: Gate | None = None,
    on_installed: Callable[[UnpackStats], None] | None = None,
) -> UnpackStats:
    """Extract ``stream`` to a staging directory, call ``verify``, then install into ``target``.

    ``verify`` raises when the archive's bytes do not match their recorded digest; nothing
    is installed then. ``sharing`` sets the modes (and owner) of everything created (the
    directories torch writes at run time are :func:`prepare_cache_dir`'s); ``marker`` (a ``key`` and fields such as
    ``sha256`` and ``size``) is recorded as the completed-bundle marker once installed;
    ``gate`` lets another thread call the unpack off before it installs, and ``on_installed``
    runs right after the install, while the gate still holds (so that what it records and the
    install belong together). Returns what was extracted and how the merge went.
    """
    target = Path(target).absolute()
    sharing = sharing or Sharing()
    for directory in {target, target.parent}:
        remove_stale_staging(directory)
    staging = make_staging(target, sharing)
    if gate is not None:
        gate.staged(staging.path)
    try:
        sharing.own(staging.path)
        stats = extract_tar(stream, staging.path, limits or Limits(), sharing, gate)
        verify()
        with gate.installing() if gate is not None else contextlib.nullcontext():
            install(staging.path, target, stats, sharing, marker)
            if on_installed is not None:
                on_installed(stats)
        return stats
    finally:
        staging.release()
        if gate is not None:
            gate.unstaged(staging.path)
