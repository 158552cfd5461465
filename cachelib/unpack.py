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
import filecmp
import os
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

STAGING_PREFIX = ".compilecache-staging-"
DEFAULT_MAX_MEMBER_BYTES = 16 * 1024**3
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024**3
DEFAULT_MAX_MEMBERS = 1_000_000
CHUNK = 1024 * 1024


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


def check_member(member: tarfile.TarInfo, limits: Limits) -> str:
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
def extract_tar(stream: IO[bytes], root: Path, limits: Limits) -> UnpackStats:
    """Extract a tar stream into ``root`` (an empty staging directory), checking every member."""
    stats = UnpackStats()
    links: set[str] = set()
    seen: set[str] = set()
    made: set[Path] = {root}
    try:
        with tarfile.open(fileobj=stream, mode="r|", errorlevel=2, bufsize=CHUNK) as tar:
            for member in tar:
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
                    source = tar.extractfile(member)
                    assert source is not None
                    _write_file(root / path, source, member, made)
                    stats.files += 1
                elif member.isdir():
                    (root / path).mkdir(parents=True, exist_ok=True)
                elif member.issym():
                    (root / path).parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(member.linkname, root / path)
                    links.add(path)
                else:  # hardlink to an earlier regular file
                    _hardlink(root, path, member, links)
                    stats.files += 1
    except tarfile.TarError as exc:
        raise CorruptArchive(f"archive: {exc}") from None
    return stats


def _refuse_through_links(name: str, path: str, links: set[str]) -> None:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if prefix in links:
            raise UnsafeMember(f"member {name!r}: lies below the symlink {prefix!r}")


def _write_file(dest: Path, source: IO[bytes], member: tarfile.TarInfo, made: set[Path]) -> None:
    if dest.parent not in made:
        dest.parent.mkdir(parents=True, exist_ok=True)
        made.add(dest.parent)
    with open(dest, "xb") as out:
        remaining = member.size
        while remaining:
            chunk = source.read(min(CHUNK, remaining))
            if not chunk:
                raise CorruptArchive(f"member {member.name!r}: ends early")
            out.write(chunk)
            remaining -= len(chunk)
    os.chmod(dest, (member.mode & 0o755) | 0o600)
    with contextlib.suppress(OSError, OverflowError, ValueError):
        os.utime(dest, (member.mtime, member.mtime))


def _hardlink(root: Path, path: str, member: tarfile.TarInfo, links: set[str]) -> None:
    target = member_path(member.linkname)
    _refuse_through_links(member.name, target, links)
    source = root / target
    if target in links or not source.is_file() or source.is_symlink():
        raise UnsafeMember(f"member {member.name!r}: hardlink to {member.linkname!r}, which is not an earlier file")
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, root / path)
    except OSError:
        shutil.copy2(source, root / path)


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
    stream: IO[bytes], verify: Callable[[], None], target: Path, limits: Limits | None = None
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
