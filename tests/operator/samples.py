"""Sample CompileCache objects for the operator's unit tests."""

from __future__ import annotations

from typing import Any

from compilecache_operator.spec import CacheSpec, Defaults, parse_spec


def raw_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "registry.example/workload:1",
        "model": {"target": "tiny_mlp"},
        "storage": {"url": "redis://redis.cache:6379/0"},
    }
    spec.update(overrides)
    return spec


def owner(name: str = "mlp", namespace: str = "team-a", generation: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "compilecache.io/v1alpha1",
        "kind": "CompileCache",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1234", "generation": generation},
        "spec": raw_spec(**spec),
    }


def parsed(**overrides: Any) -> CacheSpec:
    return parse_spec(raw_spec(**overrides), Defaults())
