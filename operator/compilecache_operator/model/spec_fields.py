"""The readers a spec parse is built from: one list that collects every field error, typed readers of
one field each (a wrong type, range or value adds an error at the field's path and gives the default),
and Kubernetes quantities."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from compilecache_operator.model.spec import FieldError

SHOWN_VALUE = 64
"""The most characters of a bad value an error message repeats."""

# Kubernetes quantity suffixes: binary (Ki..Ei), decimal (k..E) and the sub-unit ones (m, u, n).
QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([-+]?[0-9]+)|([KMGTPE]i|[kMGTPE]|[mun]))?$")
_SUFFIX_FACTORS: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    **{s: Fraction(1000**i) for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}


class FieldErrors:
    """Collects field errors so that one pass reports all of them."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(FieldError(path, message))


def quantity_bytes(text: str) -> int | None:
    """A Kubernetes quantity (``16Gi``, ``500M``, ``1e9``) as whole bytes, rounded up; None if it is not one."""
    value = quantity_value(text)
    return None if value is None else math.ceil(value)


def quantity_value(text: str) -> Fraction | None:
    """A Kubernetes quantity (``16Gi``, ``500m``, ``1e9``) as an exact number; None if it is not one."""
    match = QUANTITY.fullmatch(text)
    if not match:
        return None
    number, exponent, suffix = match.groups()
    if exponent and abs(int(exponent)) > 30:  # far past any amount, and cheap to refuse
        return None
    return Fraction(number) * (Fraction(10) ** int(exponent) if exponent else _SUFFIX_FACTORS[suffix or ""])


def check(value: str, problem: Callable[[str], str | None], path: str, errors: FieldErrors, *, what: str = "") -> bool:
    """Add ``problem(value)`` (if any) as an error at ``path``; True when there was one. ``what`` names a
    value that is a key at ``path`` (a map key), so that the message shows which."""
    reason = problem(value)
    if reason is None:
        return False
    errors.add(path, f"{what + ' ' if what else ''}{shown(value)}: {reason}")
    return True


def shown(value: Any) -> str:
    """A bad value as an error message repeats it: quoted, escaped, at most :data:`SHOWN_VALUE` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE else f"{text[: SHOWN_VALUE - 1]}… ({len(str(value))} characters)"


# -- scalar readers -----------------------------------------------------------------------------
def read_mapping(raw: Any, path: str, errors: FieldErrors, *, required: bool = False) -> Mapping[str, Any]:
    if raw is None:
        if required:
            errors.add(path, "required")
        return {}
    if not isinstance(raw, Mapping):
        errors.add(path, f"must be an object, got {type(raw).__name__}")
        return {}
    return raw


def read_list(raw: Any, path: str, errors: FieldErrors) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add(path, f"must be a list, got {type(raw).__name__}")
        return []
    return raw


def read_string_map(raw: Any, path: str, errors: FieldErrors) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in read_mapping(raw, path, errors).items():
        if not isinstance(value, str):
            errors.add(f"{path}.{key}", "must be a string")
        else:
            out[str(key)] = value
    return out


def read_string(
    obj: Mapping[str, Any], key: str, path: str, errors: FieldErrors, *, required: bool = False, max_length: int = 1024
) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            errors.add(f"{path}.{key}", "required")
        return None
    if not isinstance(value, str):
        errors.add(f"{path}.{key}", f"must be a string, got {type(value).__name__}")
        return None
    if not value:
        errors.add(f"{path}.{key}", "must not be empty")
        return None
    if len(value) > max_length:
        errors.add(f"{path}.{key}", f"at most {max_length} characters, got {len(value)}")
        return None
    return value


def read_enum(
    obj: Mapping[str, Any], key: str, path: str, errors: FieldErrors, allowed: Sequence[str], default: str | None
) -> str | None:
    value = obj.get(key)
    if value is None:
        return default
    if value not in allowed:
        errors.add(f"{path}.{key}", f"{shown(value)} is not one of {', '.join(allowed)}")
        return default
    return str(value)


def read_boolean(obj: Mapping[str, Any], key: str, path: str, errors: FieldErrors, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        errors.add(f"{path}.{key}", f"must be true or false, got {shown(value)}")
        return default
    return value


def read_integer(
    obj: Mapping[str, Any], key: str, path: str, errors: FieldErrors, default: int, *, low: int, high: int | None = None
) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        errors.add(f"{path}.{key}", f"must be a whole number, got {shown(value)}")
        return default
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        errors.add(f"{path}.{key}", f"{value} must be {bound}")
        return default
    return value
