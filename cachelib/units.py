"""Byte sizes as people write and read them: ``512M``, ``10GiB`` in; ``1.5 KiB`` out (binary units).

Standard library only; the CLI, the store URL options, ``compilecache ls`` and the progress bar
all read and print sizes through these functions.
"""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_FACTORS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE = re.compile(r"^([0-9]+)\s*(?:([KMGT])i?B?|B)?$", re.IGNORECASE)
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def parse_size(text: str, *, what: str = "size", largest: str = "T") -> int:
    """``1024``, ``64K``, ``4MiB``, ``2GB``, ``1t`` -> bytes (binary units, case-insensitive, up to
    the ``largest`` unit); raises :class:`ValueError` naming ``what``."""
    units = list(_FACTORS)[1 : list(_FACTORS).index(largest) + 1]
    match = _SIZE.match(text.strip())
    unit = (match.group(2) or "").upper() if match else ""
    if not match or (unit and unit not in units):
        raise ValueError(f"{what}={text!r} is not a size (bytes, or a number with {', '.join(units[:-1])} or "
                         f"{units[-1]})")
    return int(match.group(1)) * _FACTORS[unit]


def size_text(n: int) -> str:
    """The shortest exact form :func:`parse_size` reads back: ``1048576`` -> ``1M``, ``1000`` -> ``1000``."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _FACTORS[unit] == 0:
            return f"{n // _FACTORS[unit]}{unit}"
    return str(n)


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, one decimal above bytes."""
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
