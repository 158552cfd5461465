"""Member checks (pure): the path a member lands at, where its link points, whether it is allowed."""

from __future__ import annotations

import posixpath

from cachelib.unpack.common import Limits, MemberTooLarge, UnsafeMember
from cachelib.unpack.tarstream import Member


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
