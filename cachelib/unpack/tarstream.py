"""The tar stream: headers, pax records and member data parsed from large reads, without tarfile."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from cachelib.unpack.common import CorruptArchive, UnsafeMember

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
