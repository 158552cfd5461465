"""What a warm-up's compile container reads besides the image: environment variables (plain
values, or one key of a Secret or ConfigMap through ``valueFrom``) and volumes (model weights on
a PersistentVolumeClaim, a CA file from a Secret or ConfigMap, scratch space) mounted where
``spec.warmup.volumeMounts`` says.

Pure parsing: each function takes the raw ``spec.warmup`` field, reports every bad entry with
its field path through ``errors.add(path, message)``, and returns the Kubernetes objects for the
Job's pod spec as they will be written. Only volume types the "restricted" Pod Security Standard
allows are accepted (no hostPath), and the warm-up's own volumes and paths stay its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from compilecache_operator.model.names import HARNESS_DIR, HARNESS_VOLUME, SCRATCH_VOLUME, WORK_DIR, WORK_VOLUME

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$")

KEY_REFS = {"secretKeyRef": "Secret", "configMapKeyRef": "ConfigMap"}
"""``valueFrom`` sources a warm-up may use, and the kind each reads."""
VOLUME_SOURCES = ("persistentVolumeClaim", "secret", "configMap", "emptyDir")
"""Volume types a warm-up may mount (all allowed by the "restricted" Pod Security Standard)."""
RESERVED_VOLUMES = (HARNESS_VOLUME, WORK_VOLUME, SCRATCH_VOLUME)
RESERVED_PATHS = (HARNESS_DIR, WORK_DIR)


class Errors(Protocol):
    def add(self, path: str, message: str) -> None: ...


def parse_env(raw: Any, path: str, errors: Errors) -> tuple[Mapping[str, Any], ...]:
    """``spec.warmup.env``: ``{name, value}`` or ``{name, valueFrom: {secretKeyRef|configMapKeyRef:
    {name, key, optional}}}`` -> the container's ``env`` entries, in order."""
    out: list[Mapping[str, Any]] = []
    for i, entry in enumerate(_objects(raw, path, errors)):
        where = f"{path}[{i}]"
        name = entry.get("name")
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            errors.add(f"{where}.name", "required" if name is None else f"{name!r} is not an environment variable name")
            continue
        if "valueFrom" in entry and "value" in entry:
            errors.add(where, "set value or valueFrom, not both")
        elif "valueFrom" in entry:
            source = _key_ref(entry["valueFrom"], f"{where}.valueFrom", errors)
            if source is not None:
                out.append({"name": name, "valueFrom": source})
        else:
            value = entry.get("value", "")
            if not isinstance(value, str):
                errors.add(f"{where}.value", f"expected a string, got {type(value).__name__}")
            else:
                out.append({"name": name, "value": value})
    return tuple(out)


def _key_ref(raw: Any, path: str, errors: Errors) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in KEY_REFS:
        errors.add(path, f"expected exactly one of {', '.join(KEY_REFS)}")
        return None
    kind = next(iter(raw))
    ref = raw[kind]
    where = f"{path}.{kind}"
    if not isinstance(ref, Mapping):
        errors.add(where, "expected an object with name and key")
        return None
    good = _check(ref, "name", where, errors, DNS_SUBDOMAIN, f"a {KEY_REFS[kind]} name")
    good &= _check(ref, "key", where, errors, CONFIG_KEY, f"a {KEY_REFS[kind]} key")
    optional = ref.get("optional", False)
    if not isinstance(optional, bool):
        errors.add(f"{where}.optional", "expected true or false")
        good = False
    if not good:
        return None
    body: dict[str, Any] = {"name": ref["name"], "key": ref["key"]}
    if optional:
        body["optional"] = True
    return {kind: body}


def _first(value: str, seen: set[str], field: str, errors: Errors, again: str) -> bool:
    """Whether ``value`` is new (then ``seen`` keeps it); else ``errors`` says at ``field``: ``value`` ``again``."""
    if value in seen:
        errors.add(field, f"{value!r} {again}")
        return False
    seen.add(value)
    return True


def parse_volumes(raw: Any, path: str, errors: Errors) -> tuple[Mapping[str, Any], ...]:
    """``spec.warmup.volumes``: each a name and exactly one of persistentVolumeClaim, secret,
    configMap, emptyDir -> the pod's extra ``volumes``."""
    out: list[Mapping[str, Any]] = []
    seen: set[str] = set()
    for i, entry in enumerate(_objects(raw, path, errors)):
        where = f"{path}[{i}]"
        if not _check(entry, "name", where, errors, _DNS_LABEL, "a volume name (a DNS label)"):
            continue
        name = str(entry["name"])
        if name in RESERVED_VOLUMES:
            errors.add(f"{where}.name", f"{name!r} is the warm-up's own volume; choose another name")
            continue
        if not _first(name, seen, f"{where}.name", errors, "is given twice"):
            continue
        sources = [s for s in VOLUME_SOURCES if s in entry]
        unknown = sorted(set(entry) - {"name", *VOLUME_SOURCES})
        if unknown:
            errors.add(f"{where}.{unknown[0]}", f"not a volume type a warm-up may use ({', '.join(VOLUME_SOURCES)})")
        elif len(sources) != 1:
            errors.add(where, f"expected exactly one of {', '.join(VOLUME_SOURCES)}")
        else:
            source = _volume_source(sources[0], entry[sources[0]], f"{where}.{sources[0]}", errors)
            if source is not None:
                out.append({"name": name, sources[0]: source})
    return tuple(out)


def _volume_source(kind: str, raw: Any, path: str, errors: Errors) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        errors.add(path, "expected an object")
        return None
    if kind == "persistentVolumeClaim":
        if not _check(raw, "claimName", path, errors, DNS_SUBDOMAIN, "a PersistentVolumeClaim name"):
            return None
        return {"claimName": raw["claimName"], "readOnly": _flag(raw, "readOnly", path, errors)}
    if kind == "emptyDir":
        out: dict[str, Any] = {}
        if raw.get("medium") not in (None, "", "Memory"):
            errors.add(f"{path}.medium", "expected Memory or unset")
        elif raw.get("medium"):
            out["medium"] = "Memory"
        limit = raw.get("sizeLimit")
        if limit is not None and _check(raw, "sizeLimit", path, errors, _QUANTITY, "a quantity of bytes such as 10Gi"):
            out["sizeLimit"] = limit
        return out
    name_field = "secretName" if kind == "secret" else "name"
    what = "Secret" if kind == "secret" else "ConfigMap"
    good = _check(raw, name_field, path, errors, DNS_SUBDOMAIN, f"a {what} name")
    out = {name_field: raw.get(name_field)}
    items = []
    for i, item in enumerate(_objects(raw.get("items"), f"{path}.items", errors)):
        ipath = f"{path}.items[{i}]"
        good &= _check(item, "key", ipath, errors, CONFIG_KEY, f"a {what} key")
        target = item.get("path")
        if not isinstance(target, str) or not target or target.startswith("/") or ".." in target.split("/"):
            errors.add(f"{ipath}.path", "expected a relative path without '..'")
            good = False
        items.append({"key": item.get("key"), "path": target})
    if items:
        out["items"] = items
    if raw.get("optional") is not None:
        out["optional"] = _flag(raw, "optional", path, errors)
    return out if good else None


def secrets_read(
    env: Sequence[Mapping[str, Any]], volumes: Sequence[Mapping[str, Any]], path: str
) -> list[tuple[str, str]]:
    """The Secrets a compile container with this ``env`` and these ``volumes`` (as :func:`parse_env` and
    :func:`parse_volumes` return them, under ``path``) can read, each as (the field naming it, its name)."""
    found: list[tuple[str, str]] = []
    for i, entry in enumerate(env):
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            found.append((f"{path}.env[{i}].valueFrom.secretKeyRef.name", str(ref["name"])))
    for i, volume in enumerate(volumes):
        if "secret" in volume:
            found.append((f"{path}.volumes[{i}].secret.secretName", str(volume["secret"]["secretName"])))
    return found


def parse_volume_mounts(
    raw: Any, path: str, volumes: Sequence[Mapping[str, Any]], errors: Errors
) -> tuple[Mapping[str, Any], ...]:
    """``spec.warmup.volumeMounts`` of the compile container: each names one of ``volumes``,
    at an absolute path outside the warm-up's own directories."""
    declared = {str(v["name"]) for v in volumes}
    out: list[Mapping[str, Any]] = []
    paths: set[str] = set()
    for i, entry in enumerate(_objects(raw, path, errors)):
        where = f"{path}[{i}]"
        name, mount = entry.get("name"), entry.get("mountPath")
        if not isinstance(name, str) or name not in declared:
            errors.add(f"{where}.name", f"{name!r} is not a volume in spec.warmup.volumes")
            continue
        if not isinstance(mount, str) or not mount.startswith("/") or ".." in mount.split("/"):
            errors.add(f"{where}.mountPath", "expected an absolute path without '..'")
            continue
        mount = mount.rstrip("/") or "/"
        clash = [p for p in RESERVED_PATHS if _overlaps(mount, p)]
        if clash:
            errors.add(f"{where}.mountPath", f"{mount!r} overlaps the warm-up's own directory {clash[0]}")
            continue
        if not _first(mount, paths, f"{where}.mountPath", errors, "is mounted twice"):
            continue
        body: dict[str, Any] = {"name": name, "mountPath": mount, "readOnly": _flag(entry, "readOnly", where, errors)}
        sub = entry.get("subPath")
        if sub is not None:
            if not isinstance(sub, str) or sub.startswith("/") or ".." in sub.split("/"):
                errors.add(f"{where}.subPath", "expected a relative path without '..'")
                continue
            body["subPath"] = sub
        out.append(body)
    return tuple(out)


def _overlaps(a: str, b: str) -> bool:
    """One path is the other or lies inside it."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _objects(raw: Any, path: str, errors: Errors) -> list[Mapping[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        errors.add(path, f"expected a list, got {type(raw).__name__}")
        return []
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, Mapping):
            out.append(item)
        else:
            errors.add(f"{path}[{i}]", f"expected an object, got {type(item).__name__}")
    return out


def _check(obj: Mapping[str, Any], key: str, path: str, errors: Errors, pattern: re.Pattern[str], what: str) -> bool:
    value = obj.get(key)
    if value is None:
        errors.add(f"{path}.{key}", "required")
        return False
    if not isinstance(value, str) or len(value) > 253 or not pattern.match(value):
        errors.add(f"{path}.{key}", f"{value!r} is not {what}")
        return False
    return True


def _flag(obj: Mapping[str, Any], key: str, path: str, errors: Errors) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        errors.add(f"{path}.{key}", "expected true or false")
        return False
    return value
