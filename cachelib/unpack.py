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
"""

from __future__ import annotations

import contextlib
import dataclasses
import filecmp
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STAGING_PREFIX = ".compilecache-staging-"
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
        local: dict[str, str] = {}
        long_name = long_link = None
        while True:
            at = self.offset
            if not self._available():
                if at == 0:
                    raise CorruptArchive("archive is empty")
                if not (local or long_name is not None or long_link is not None):
                    return None  # ends without the end-of-archive blocks: as tar itself accepts
            block = self._take(BLOCK, "a header")
            if block.count(0) == BLOCK:
                return None
            member = parse_header(block, at)
            if member.type in (_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK):
                data = self._extended(member, at)
                if member.type == _PAX_LOCAL:
                    local.update(parse_pax(data, at))
                elif member.type == _PAX_GLOBAL:
                    self._globals.update(parse_pax(data, at))
                elif member.type == _GNU_LONGNAME:
                    long_name = _text(data)
                else:
                    long_link = _text(data)
                continue
            if long_name is not None:
                member = dataclasses.replace(member, name=long_name)
            if long_link is not None:
                member = dataclasses.replace(member, linkname=long_link)
            if self._globals or local:
                member = _apply_pax(member, {**self._globals, **local}, at)
            if member.isdir() and member.name.endswith("/"):
                member = dataclasses.replace(member, name=member.name.rstrip("/"))
            has_data = not (member.isdir() or member.issym() or member.islnk())
            self._unread = _padded(member.size) if has_data else 0
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
def extract_tar(stream: Readable, root: Path, limits: Limits) -> UnpackStats:
    """Extract a tar stream into ``root`` (an empty staging directory), checking every member."""
    stats = UnpackStats()
    links: set[str] = set()
    files: set[str] = set()
    seen: set[str] = set()
    reader = TarReader(stream)
    out = _Files(root)
    try:
        while (member := reader.next()) is not None:
            stats.members += 1
            if stats.members > limits.max_members:
                raise ArchiveTooLarge(f"archive: more than {limits.max_members} members")
            path = check_member(member, limits)
            if not path:
                continue  # the root directory entry itself
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
                out.open_file(path, (member.mode & 0o755) | 0o600)
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
    """The file system side of extraction: creates what the checked members describe under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._made: set[str] = {self.root}
        self._umask = _current_umask()
        self._fd: int | None = None
        self._mode = 0

    def _parent(self, path: str) -> str:
        parent, _, _ = path.rpartition("/")
        full = f"{self.root}/{parent}" if parent else self.root
        if full not in self._made:
            os.makedirs(full, exist_ok=True)
            self._made.add(full)
        return f"{self.root}/{path}"

    def open_file(self, path: str, mode: int) -> None:
        self._fd = os.open(self._parent(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        self._mode = mode

    def write(self, piece: memoryview) -> None:
        assert self._fd is not None
        while piece:
            piece = piece[os.write(self._fd, piece) :]

    def close_file(self, mtime: float) -> None:
        fd, self._fd = self._fd, None
        assert fd is not None
        try:
            if self._mode & self._umask:  # the umask took bits away: set the mode the archive asks for
                os.fchmod(fd, self._mode)
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        full = f"{self.root}/{path}"
        os.makedirs(full, exist_ok=True)
        self._made.add(full)

    def symlink(self, path: str, linkname: str) -> None:
        os.symlink(linkname, self._parent(path))

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


# -- staging and installation ------------------------------------------------------------------
def remove_stale_staging(target: Path) -> None:
    """Remove staging directories left in ``target`` by unpackers that are no longer running."""
    if not target.is_dir():
        return
    for entry in target.iterdir():
        if entry.name.startswith(STAGING_PREFIX) and not _owner_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True)


def _owner_alive(name: str) -> bool:
    pid_text = name[len(STAGING_PREFIX) :].split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_staging(target: Path) -> Path:
    """A fresh staging directory on the target's file system (see the module docstring)."""
    parent = target if target.exists() else target.parent
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent))


def install(staging: Path, target: Path, stats: UnpackStats) -> None:
    """Move the staged tree into ``target``: one rename when absent, else a file-by-file merge."""
    if not target.exists():
        staging.chmod(0o755)
        try:
            os.rename(staging, target)
        except FileExistsError:
            pass  # created meanwhile by someone else: merge below
        except OSError as exc:
            if not target.exists():
                raise UnpackError(f"cannot move the unpacked cache into {target}: {exc.strerror or exc}") from exc
        else:
            stats.installed += stats.files
            return
    if not target.is_dir():
        raise UnpackError(f"target {target} exists and is not a directory")
    for directory, dirnames, filenames in os.walk(staging):
        rel = Path(directory).relative_to(staging)
        for name in sorted(dirnames):
            src, dest = Path(directory) / name, target / rel / name
            if src.is_symlink():
                filenames.append(name)
                continue
            if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
                raise UnpackError(f"cannot merge directory {rel / name}: {dest} exists and is not a directory")
            dest.mkdir(exist_ok=True)
        dirnames[:] = [d for d in dirnames if not (Path(directory) / d).is_symlink()]
        for name in sorted(filenames):
            _install_file(Path(directory) / name, target / rel / name, stats)


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
    stream: Readable, verify: Callable[[], None], target: Path, limits: Limits | None = None
) -> UnpackStats:
    """Extract ``stream`` to a staging directory, call ``verify``, then install into ``target``.

    ``verify`` raises when the archive's bytes do not match their recorded digest; nothing
    is installed then. Returns what was extracted and how the merge went.
    """
    target = Path(target).absolute()
    remove_stale_staging(target)
    staging = make_staging(target)
    try:
        stats = extract_tar(stream, staging, limits or Limits())
        verify()
        install(staging, target, stats)
        return stats
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
