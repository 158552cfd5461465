"""Node caches: completed-bundle markers and per-bundle locks."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from cachelib.unpack.common import BUNDLE_LOCK_PREFIX, LOCK_SUFFIX, MARKER_DIR, Gate, Sharing, create_exclusive


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
    fd, temporary = create_exclusive(directory, ".tmp-")
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
