"""Variants, bundles and the warm-up plan: pure functions over the parsed spec and the status.

A variant is one thing to warm: a GPU type (or the CPU) for the spec's image, model and
compile options. Its id is a digest of all of those plus the cache's namespace and name, so
any change that alters the compiled artifacts yields new variants, and an unrelated change
(resources, tolerations) keeps the existing bundles.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cachelib.keyformat import CacheKey, InvalidKey, digest, gpu_slug
from compilecache_operator.model.spec import CacheSpec

CPU = "cpu"
MAX_NAME = 63


@dataclass(frozen=True)
class Variant:
    id: str
    """10 hex digits identifying (namespace, name, image, model, options, GPU type)."""
    gpu: str
    """The GPU product as the spec or the Node label spells it; ``""`` for the CPU."""
    image: str

    @property
    def gpu_slug(self) -> str:
        return gpu_slug(self.gpu) if self.gpu else CPU

    @property
    def gpu_label(self) -> str:
        """The GPU product for humans and status: the product name, or ``cpu``."""
        return self.gpu or CPU


@dataclass(frozen=True)
class BundleRecord:
    """One published bundle as ``status.bundles`` records it."""

    variant: str
    key: str
    gpu: str = CPU
    capability: str = CPU
    torch: str = ""
    triton: str = ""
    cuda: str = ""
    python: str = ""
    image: str = ""
    digest: str = ""
    bytes: int = 0
    compile_seconds: float = 0.0
    created: str = ""
    generation: int = 0
    job_id: str = ""
    job: str = ""
    precompile: str = ""
    """With precompile Auto: ``Verified`` or ``LeftOut`` by the warm-up's check (cachelib.in_image.precheck)."""
    precompile_reason: str = ""
    bytecode_files: int = 0
    """Modules in the bundle's byte-code part (cachelib.in_image.bytecode); 0: none (the image has its own)."""
    vllm_version: str = ""
    """For a vLLM cache: the vLLM the warm-up ran (cachelib.in_image.vllmwarm)."""
    vllm_hash: str = ""
    """For a vLLM cache: the hash directory vLLM compiled into (empty without its AOT compile)."""
    warmup_env: tuple[tuple[str, str], ...] | None = None
    """The key-factor variables the warm-up's compile container ran with (cachelib.prediction.recorded_env),
    what the admission compares a pod's with; None: recorded before these were."""
    warmup_env_elsewhere: tuple[str, ...] = ()
    """Of those, the ones its Job took from ``valueFrom`` (names only: their values are not known)."""
    bundle_digest: str = field(default="", compare=False)
    """What a bundle signature covers, as the publish step reported it (cachelib.signing); not kept in
    the status: only needed to sign the bundle when it is recorded."""

    def to_status(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "gpu": self.gpu,
            "capability": self.capability,
            "torch": self.torch,
            "triton": self.triton,
            "cuda": self.cuda,
            "python": self.python,
            "image": self.image,
            "key": self.key,
            "digest": self.digest,
            "bytes": self.bytes,
            "compileSeconds": self.compile_seconds,
            "created": self.created,
            "generation": self.generation,
            "jobId": self.job_id,
            "job": self.job,
            "precompile": self.precompile,
            "precompileReason": self.precompile_reason,
        } | ({"bytecodeFiles": self.bytecode_files} if self.bytecode_files else {}) | (
            {"vllm": {"version": self.vllm_version, "hash": self.vllm_hash}} if self.vllm_version else {}
        ) | ({"warmupEnv": {"values": dict(self.warmup_env), "fromElsewhere": list(self.warmup_env_elsewhere)}}
             if self.warmup_env is not None else {})  # fmt: skip

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> BundleRecord:
        return cls(
            variant=str(entry.get("variant", "")),
            key=str(entry.get("key", "")),
            gpu=str(entry.get("gpu", CPU)),
            capability=str(entry.get("capability", CPU)),
            torch=str(entry.get("torch", "")),
            triton=str(entry.get("triton", "")),
            cuda=str(entry.get("cuda", "")),
            python=str(entry.get("python", "")),
            image=str(entry.get("image", "")),
            digest=str(entry.get("digest", "")),
            bytes=int(entry.get("bytes") or 0),
            compile_seconds=float(entry.get("compileSeconds") or 0.0),
            created=str(entry.get("created", "")),
            generation=int(entry.get("generation") or 0),
            job_id=str(entry.get("jobId", "")),
            job=str(entry.get("job", "")),
            precompile=str(entry.get("precompile", "")),
            precompile_reason=str(entry.get("precompileReason", "")),
            bytecode_files=int(entry.get("bytecodeFiles") or 0),
            vllm_version=str((entry.get("vllm") or {}).get("version") or ""),
            vllm_hash=str((entry.get("vllm") or {}).get("hash") or ""),
            **_warmup_env(entry.get("warmupEnv")),
        )

    @property
    def key_gpu_slug(self) -> str:
        """The GPU segment of the key: what the warm-up really compiled on."""
        try:
            return CacheKey.parse(self.key).gpu
        except InvalidKey:
            return gpu_slug(self.gpu) if self.gpu != CPU else CPU


def _warmup_env(recorded: Any) -> dict[str, Any]:
    """``warmup_env`` and ``warmup_env_elsewhere`` from a status entry's ``warmupEnv`` (none: not recorded)."""
    if not isinstance(recorded, Mapping):
        return {}
    values = recorded.get("values")
    named = recorded.get("fromElsewhere")
    values = values if isinstance(values, Mapping) else {}
    named = named if isinstance(named, list) else []
    return {"warmup_env": tuple(sorted((str(k), str(v)) for k, v in values.items())),
            "warmup_env_elsewhere": tuple(str(n) for n in named)}


def bundles_from_status(status: Mapping[str, Any] | None) -> list[BundleRecord]:
    entries = (status or {}).get("bundles") or []
    return [BundleRecord.from_status(e) for e in entries if isinstance(e, Mapping) and e.get("key")]


def variant_id(namespace: str, name: str, spec: CacheSpec, gpu: str) -> str:
    identity = {
        "namespace": namespace,
        "name": name,
        "image": spec.image,
        "model": spec.model.identity(),
        "gpu": gpu_slug(gpu) if gpu else CPU,
    }
    return digest(identity)[:10]


def plan_id(namespace: str, name: str, spec: CacheSpec) -> str:
    """One id for the whole plan (image, model, options): the warm-ups' ``TORCH_COMPILE_JOB_ID``."""
    return "cc-" + digest({"namespace": namespace, "name": name, "image": spec.image, "model": spec.model.identity()})


def planned_gpu_types(spec: CacheSpec, discovered: Iterable[str] = ()) -> list[str]:
    """The spec's GPU types plus the discovered ones (when discovery is on), one per slug, in a stable order."""
    by_slug: dict[str, str] = {}
    for product in list(spec.gpu_types) + (sorted(discovered) if spec.gpu_discovery.auto else []):
        by_slug.setdefault(gpu_slug(product), product)
    return [by_slug[slug] for slug in sorted(by_slug)]


def plan_variants(namespace: str, name: str, spec: CacheSpec, discovered: Iterable[str] = ()) -> list[Variant]:
    """The variants to warm. Without GPU types (and no discovery) one CPU variant; with discovery on
    and nothing discovered, none (the caller reports that no GPU node was found)."""
    gpus = planned_gpu_types(spec, discovered)
    if not gpus:
        if spec.gpu_discovery.auto:
            return []
        gpus = [""]
    return [Variant(id=variant_id(namespace, name, spec, gpu), gpu=gpu, image=spec.image) for gpu in gpus]


def job_name(cache_name: str, variant: Variant, generation: int) -> str:
    """``cc-<name>-<variant id>-g<generation>``, the name cut so the whole is at most 63 characters."""
    suffix = f"-{variant.id}-g{generation}"
    room = MAX_NAME - len("cc-") - len(suffix)
    stem = re.sub(r"[^a-z0-9-]", "-", cache_name.lower())[:room].strip("-") or "cache"
    return f"cc-{stem}{suffix}"


def missing_variants(variants: Sequence[Variant], bundles: Iterable[BundleRecord]) -> list[Variant]:
    have = {b.variant for b in bundles}
    return [v for v in variants if v.id not in have]


def bundles_to_prune(
    bundles: Sequence[BundleRecord], current: Iterable[str], keep_generations: int
) -> list[BundleRecord]:
    """Bundles outside retention: not of the current plan and not among the newest
    ``keep_generations`` warm-up generations present in status."""
    current_ids = set(current)
    generations = sorted({b.generation for b in bundles}, reverse=True)
    kept_generations = set(generations[:keep_generations])
    return [b for b in bundles if b.variant not in current_ids and b.generation not in kept_generations]


def merge_bundles(existing: Sequence[BundleRecord], new: Iterable[BundleRecord]) -> list[BundleRecord]:
    """Existing records with ``new`` ones replacing those of the same variant; ordered by GPU, then variant."""
    by_variant = {b.variant: b for b in existing}
    for record in new:
        by_variant[record.variant] = record
    return sorted(by_variant.values(), key=lambda b: (-b.generation, b.gpu, b.variant))


def current_bundles(bundles: Iterable[BundleRecord], variants: Iterable[Variant]) -> list[BundleRecord]:
    ids = {v.id for v in variants}
    return [b for b in bundles if b.variant in ids]
