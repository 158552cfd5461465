"""What a store holds: bundle listings and garbage-collection plans.

Garbage collection groups bundles by cache, model, options and GPU (namespace, name,
model, options, gpu, capability): inside a group, bundles differ only by software
versions, and the newest ones are the ones pods still need. A bundle is deleted when it
is older than ``older_than`` (if given) **and** not among the ``keep`` most recently
published of its group (if given). Objects whose names are not cache keys are never
touched.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from cachelib.keyformat import CacheKey, InvalidKey
from cachelib.stores import ObjectInfo, Store

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class Entry:
    key: CacheKey
    size: int
    modified: float

    def age(self, now: float) -> float:
        return max(0.0, now - self.modified)

    @property
    def group(self) -> tuple[str, ...]:
        k = self.key
        return (k.namespace, k.name, k.model, k.options, k.gpu, k.capability)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "key": str(self.key),
            **self.key.to_dict(),
            "size": self.size,
            "modified": self.modified,
            "age_seconds": round(self.age(now), 1),
        }


def describe(store: Store, entry: Entry) -> dict[str, Any]:
    """What a person recognises a bundle by, from its header: the target (or command) it was
    compiled from and its compile options. Reads only the header; a bundle that cannot be
    read is described by the error (``ls`` goes on with the others)."""
    from cachelib.bundle import BundleError
    from cachelib.bundlereader import read_header
    from cachelib.stores import StoreError

    try:
        with store.get(str(entry.key)) as stream:
            result = read_header(stream).result
    except (BundleError, StoreError, OSError) as exc:
        return {"target": None, "compile_options": None, "error": f"{type(exc).__name__}: {exc}"}
    command = result.get("command")
    engine = result.get("engine") if isinstance(result.get("engine"), dict) else None
    if engine is not None:  # a vLLM warm-up (cachelib.in_image.vllmwarm): the model string, and vLLM as the mode
        return {"target": f"{engine.get('name')}: {engine.get('model')}",
                "compile_options": {"mode": f"{engine.get('name')} {engine.get('version')}"}}  # fmt: skip
    target = result.get("target") or (f"command: {command}" if command else None)
    return {"target": target, "compile_options": result.get("options")}


def target_label(description: dict[str, Any]) -> str:
    """The target column of ``ls -o wide``: ``tiny_mlp`` for ``cachelib.in_image.targets:tiny_mlp``."""
    target = description.get("target")
    if not target:
        return "?" if description.get("error") else "-"
    return str(target).removeprefix("cachelib.in_image.targets:")


def options_label(description: dict[str, Any]) -> str:
    """The mode column of ``ls -o wide``: the torch.compile mode, ``+backward`` when it trains."""
    options = description.get("compile_options")
    if not isinstance(options, dict):
        return "?"
    text = str(options.get("mode", "?"))
    return text + "+backward" if options.get("backward") or options.get("compiled_autograd") else text


def parse_duration(text: str) -> float:
    """``"7d"`` -> 604800.0; units s, m, h, d, w."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"duration {text!r}: expected a number and a unit s, m, h, d or w (e.g. 7d, 12h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def entries(objects: Iterable[ObjectInfo]) -> Iterator[Entry]:
    """The objects that are bundles (their names parse as cache keys)."""
    for info in objects:
        try:
            yield Entry(CacheKey.parse(info.key), info.size, info.modified)
        except InvalidKey:
            continue


def list_bundles(store: Store, prefix: str = "") -> list[Entry]:
    return list(entries(store.list(prefix)))


def plan_gc(found: Iterable[Entry], now: float, *, older_than: float | None, keep: int | None) -> list[Entry]:
    """The entries to delete (see the module docstring for the rule)."""
    if older_than is None and keep is None:
        raise ValueError("give --older-than and/or --keep: refusing to delete everything")
    if keep is not None and keep < 0:
        raise ValueError(f"--keep {keep}: must be 0 or more")
    groups: dict[tuple[str, ...], list[Entry]] = defaultdict(list)
    for entry in found:
        groups[entry.group].append(entry)
    doomed: list[Entry] = []
    for members in groups.values():
        newest_first = sorted(members, key=lambda e: (e.modified, str(e.key)), reverse=True)
        candidates = newest_first[keep:] if keep is not None else newest_first
        doomed.extend(e for e in candidates if older_than is None or e.age(now) > older_than)
    return sorted(doomed, key=lambda e: str(e.key))
