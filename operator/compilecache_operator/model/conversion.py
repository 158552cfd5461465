"""The CRD's conversion webhook (pure): a ``ConversionReview`` in, the objects in the version asked for out.

Every served version of ``compilecache.io`` converts through the storage version, the hub
(:data:`~compilecache_operator.model.names.VERSION`): an object comes to the hub by undoing its version's renames,
and goes from the hub to the version asked for by doing that version's. A version is the hub's schema but
for :class:`Version` ``renames`` (dotted field paths, the hub's name first): what the API's deprecation policy
allows a new version to change (docs/api-versions.md). A field a rename names is moved whole, with what is below
it; a field it does not name is copied as it is, so a round trip is lossless.

The operator's webhook server answers ``POST /convert`` with :func:`review` (``spec.conversion.webhook`` of the
CRD points there, with the caBundle of the pod webhook's configuration). Today the CRD serves one version and
needs no conversion: this is the path a second version takes, exercised by
``tests/e2e/test_crd_conversion.py`` with a version the test installs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from compilecache_operator.model.names import GROUP, VERSION

CONVERSION_ID = "convert"
"""The path the webhook server answers conversions at: ``/convert``."""


@dataclass(frozen=True)
class Version:
    """A served version: the hub's schema with these fields renamed, each ``(hub path, this version's path)``."""

    renames: tuple[tuple[str, str], ...] = ()


VERSIONS: dict[str, Version] = {VERSION: Version()}
"""Every version the webhook converts between, by name; the hub's own has no renames."""


class ConversionError(ValueError):
    """An object that cannot be converted; the message names the object and why."""


def _split(path: str) -> list[str]:
    return [p for p in path.split(".") if p]


def _move(obj: MutableMapping[str, Any], source: str, target: str) -> None:
    """Move the field at dotted ``source`` to dotted ``target`` (made as needed); nothing when it is absent. A parent
    the move leaves empty goes too (it was made by the opposite move)."""
    *parents, leaf = _split(source)
    chain: list[MutableMapping[str, Any]] = [obj]
    for key in parents:
        below = chain[-1].get(key)
        if not isinstance(below, MutableMapping):
            return
        chain.append(below)
    holder = chain[-1]
    if leaf not in holder:
        return
    value = holder.pop(leaf)
    for depth in range(len(parents), 0, -1):
        if chain[depth]:
            break
        del chain[depth - 1][parents[depth - 1]]
    *parents, leaf = _split(target)
    holder = obj
    for key in parents:
        if not isinstance(holder.get(key), MutableMapping):
            holder[key] = {}
        holder = holder[key]
    holder[leaf] = value


def convert(obj: Mapping[str, Any], desired: str, versions: Mapping[str, Version] | None = None) -> dict[str, Any]:
    """``obj`` (a CompileCache of any served version) in ``desired`` (``compilecache.io/<version>``)."""
    versions = VERSIONS if versions is None else versions
    name = f"{(obj.get('metadata') or {}).get('namespace', '')}/{(obj.get('metadata') or {}).get('name', '')}"
    source_api = str(obj.get("apiVersion", ""))
    source, target = _version_of(source_api, versions, name), _version_of(desired, versions, name)
    out = copy.deepcopy(dict(obj))
    for hub_path, own_path in reversed(versions[source].renames):
        _move(out, own_path, hub_path)
    for hub_path, own_path in versions[target].renames:
        _move(out, hub_path, own_path)
    out["apiVersion"] = desired
    return out


def _version_of(api_version: str, versions: Mapping[str, Version], name: str) -> str:
    group, _, version = api_version.partition("/")
    if group != GROUP or version not in versions:
        known = ", ".join(f"{GROUP}/{v}" for v in versions)
        raise ConversionError(f"{name}: {api_version!r} is not a version this operator converts ({known})")
    return version


def review(conversion_review: Mapping[str, Any], versions: Mapping[str, Version] | None = None) -> dict[str, Any]:
    """The ``ConversionReview`` response: every object converted, or a failure naming the first that cannot be."""
    request = conversion_review.get("request") or {}
    desired = str(request.get("desiredAPIVersion", ""))
    objects: Sequence[Any] = request.get("objects") or []
    response: dict[str, Any] = {"uid": request.get("uid", "")}
    try:
        response["convertedObjects"] = [convert(o, desired, versions) for o in objects]
        response["result"] = {"status": "Success"}
    except ConversionError as exc:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": str(exc)}
    return {"apiVersion": conversion_review.get("apiVersion", "apiextensions.k8s.io/v1"),
            "kind": "ConversionReview", "response": response}
