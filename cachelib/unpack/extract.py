"""Extraction into a staging directory, and the modes of the tree and of torch's run-time directories."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from cachelib.unpack.common import (
    LOCAL_PREFIX,
    LOCK_SUFFIX,
    RUNTIME_DIRS,
    SHARE_ALL,
    ArchiveTooLarge,
    Gate,
    Limits,
    OwnershipError,
    Sharing,
    UnpackError,
    UnpackStats,
    UnsafeMember,
    chown_refused,
)
from cachelib.unpack.members import check_member, member_path
from cachelib.unpack.tarstream import Member, Readable, TarReader


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
                    raise OwnershipError(chown_refused(self.sharing.owner, self.root, exc)) from None
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
