"""JSON-like values (dicts, lists, strings, numbers, booleans, None) as YAML block text, for ``-o yaml``:
the core library carries no YAML library. Strings are written as double-quoted scalars in ASCII (everything
else escaped), so any text round-trips; keys likewise. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_SIMPLE_KEY_MAX = 1024
"""YAML allows an implicit key of at most 1024 characters; a longer one is written as an explicit key (``? key``)."""


def _key(key: str) -> str:
    """A key as is where YAML reads it back as that string, else as a JSON string."""
    return key if _PLAIN_KEY.fullmatch(key) and key.lower() not in _RESERVED else _scalar(key)


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # YAML 1.1 reads a float only with a dot: 1e+16 is written 1.0e+16
        text = json.dumps(value)
        mantissa, e, exponent = text.partition("e")
        return text if "." in mantissa or not e else f"{mantissa}.0e{exponent}"
    if isinstance(value, int):
        return json.dumps(value)
    return _quoted(str(value))


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar in ASCII: printable ASCII as is, everything else escaped (``\\uXXXX``, and
    ``\\UXXXXXXXX`` past the Basic Multilingual Plane, which YAML has and JSON lacks)."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, Mapping):
        if not value:
            return [pad + "{}"]
        out = []
        for key in sorted(value, key=str):
            item = value[key]
            text = _key(str(key))
            if len(text) >= _SIMPLE_KEY_MAX:  # "? key" on its own line, then ":" starts the value
                out.append(f"{pad}? {text}")
                text = ""
            head = f"{pad}{text}:"
            if isinstance(item, Mapping | list | tuple) and item:
                out += [head, *_lines(item, indent + 2)]
            else:
                out.append(f"{head} {_inline(item)}")
        return out
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        if not value:
            return [pad + "[]"]
        out = []
        for item in value:
            if isinstance(item, Mapping | list | tuple) and item:
                nested = _lines(item, indent + 2)
                out.append(f"{pad}- {nested[0].lstrip()}")
                out += nested[1:]
            else:
                out.append(f"{pad}- {_inline(item)}")
        return out
    return [pad + _scalar(value)]


def _inline(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return _scalar(value)


def dump(value: Any) -> str:
    """``value`` as a YAML document (block style), ending in a newline."""
    return "\n".join(_lines(value, 0)) + "\n"
