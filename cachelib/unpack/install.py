"""Installation: a staged tree renamed or merged into the target, after its digest was checked."""

from __future__ import annotations

import contextlib
import errno
import filecmp
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cachelib.unpack.common import LOCAL_PREFIX, Gate, Limits, Sharing, UnpackError, UnpackStats
from cachelib.unpack.extract import extract_tar
from cachelib.unpack.nodecache import write_marker
from cachelib.unpack.staging import make_staging, remove_stale_staging
from cachelib.unpack.tarstream import Readable


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
