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

from cachelib.unpack.common import (
    BUNDLE_LOCK_PREFIX,
    DEFAULT_MAX_MEMBER_BYTES,
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_TOTAL_BYTES,
    LOCAL_PREFIX,
    LOCK_SUFFIX,
    MARKER_DIR,
    RUNTIME_DIRS,
    SHARE_ALL,
    SHARE_GROUP,
    SHARE_MODES,
    SHARE_OWNER,
    STAGING_PREFIX,
    STATE_DIR,
    UNLOCKED_STALE_SECONDS,
    ArchiveTooLarge,
    Cancelled,
    CorruptArchive,
    Gate,
    Limits,
    MemberTooLarge,
    OwnershipError,
    Sharing,
    UnpackError,
    UnpackStats,
    UnsafeMember,
    check_can_own,
    parse_owner,
    write_problem,
)
from cachelib.unpack.extract import (
    extract_tar,
    is_local_only,
    make_runtime_dirs,
    prepare_cache_dir,
    reopen_for_all,
)
from cachelib.unpack.install import (
    install,
    unpack_tar_verified,
)
from cachelib.unpack.members import (
    check_member,
    member_path,
    symlink_destination,
)
from cachelib.unpack.nodecache import (
    bundle_lock,
    bundle_lock_path,
    completed,
    marker_path,
    read_marker,
    write_marker,
)
from cachelib.unpack.staging import (
    Staging,
    make_staging,
    open_staging,
    remove_stale_staging,
)
from cachelib.unpack.tarstream import (
    BLOCK,
    BLOCKDEV,
    CHARDEV,
    CHUNK_BYTES,
    DIRECTORY,
    FIFO,
    HARDLINK,
    MAX_EXTENDED_HEADER,
    REGULAR,
    SYMLINK,
    Member,
    Readable,
    TarReader,
    header_checksum_ok,
    parse_header,
    parse_pax,
)

__all__ = [
    "BLOCK",
    "BLOCKDEV",
    "BUNDLE_LOCK_PREFIX",
    "CHARDEV",
    "CHUNK_BYTES",
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_MEMBER_BYTES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "DIRECTORY",
    "FIFO",
    "HARDLINK",
    "LOCAL_PREFIX",
    "LOCK_SUFFIX",
    "MARKER_DIR",
    "MAX_EXTENDED_HEADER",
    "REGULAR",
    "RUNTIME_DIRS",
    "SHARE_ALL",
    "SHARE_GROUP",
    "SHARE_MODES",
    "SHARE_OWNER",
    "STAGING_PREFIX",
    "STATE_DIR",
    "SYMLINK",
    "UNLOCKED_STALE_SECONDS",
    "ArchiveTooLarge",
    "Cancelled",
    "CorruptArchive",
    "Gate",
    "Limits",
    "Member",
    "MemberTooLarge",
    "OwnershipError",
    "Readable",
    "Sharing",
    "Staging",
    "TarReader",
    "UnpackError",
    "UnpackStats",
    "UnsafeMember",
    "bundle_lock",
    "bundle_lock_path",
    "check_can_own",
    "check_member",
    "completed",
    "extract_tar",
    "header_checksum_ok",
    "install",
    "is_local_only",
    "make_runtime_dirs",
    "make_staging",
    "marker_path",
    "member_path",
    "open_staging",
    "parse_header",
    "parse_owner",
    "parse_pax",
    "prepare_cache_dir",
    "read_marker",
    "remove_stale_staging",
    "reopen_for_all",
    "symlink_destination",
    "unpack_tar_verified",
    "write_marker",
    "write_problem",
]
