"""What the webhook knows about one CompileCache, from the operator's index (pure): whether it is
Ready, its checked spec, its bundles and its current plan; and what the pods it serves may be given."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachelib import prediction
from cachelib.keyformat import gpu_slug
from compilecache_operator.decisions.plan import CPU, BundleRecord, bundles_from_status, plan_id, variant_id
from compilecache_operator.model import conditions as cond
from compilecache_operator.model.confinement import Confinement, check_confinement
from compilecache_operator.model.spec import CacheSpec, Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec


@dataclass(frozen=True)
class CacheView:
    """What the webhook knows about one CompileCache (from the operator's index)."""

    namespace: str
    name: str
    ready: bool
    spec: CacheSpec | None
    bundles: tuple[BundleRecord, ...] = ()
    current_variants: frozenset[str] = frozenset()
    job_id: str = ""
    planned_gpus: tuple[str, ...] = ()
    """The GPU types of the current plan (``status.plannedGPUs``; ``cpu`` for a CPU cache)."""

    @functools.cached_property
    def prediction_cache(self) -> prediction.Cache:
        """What the admission's prediction compares a pod with (:mod:`cachelib.prediction`): the bundles as status
        records them, the current plan. Made once per view, not per pod: the index keeps the view until the
        CompileCache changes."""
        label_key = self.spec.gpu_discovery.label_key if self.spec is not None else prediction.DEFAULT_GPU_LABEL_KEY
        return prediction.Cache(
            name=f"{self.namespace}/{self.name}",
            bundles=tuple(prediction.Warmed.from_status(b.to_status()) for b in self.bundles),
            current=self.current_variants,
            planned_gpus=tuple(gpu_slug(g) if g != CPU else CPU for g in self.planned_gpus),
            gpu_label_key=label_key,
        )


def cache_view(body: Mapping[str, Any], defaults: Defaults, confinement: Confinement | None = None) -> CacheView:
    """The webhook's view of a CompileCache: Ready, the parsed spec, the bundles, the current plan.
    A spec outside the operator's allow-lists (``confinement``) counts as invalid: no pod gets its
    store or Secret, even before the reconcile marks it InvalidSpec."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    status = body.get("status") or {}
    try:
        spec: CacheSpec | None = parse_spec(body.get("spec"), defaults, name=name)
        if confinement is not None and spec is not None:
            check_confinement(confinement, namespace, spec)
    except InvalidSpec:
        spec = None
    bundles = tuple(bundles_from_status(status))
    current: frozenset[str] = frozenset()
    job_id = ""
    planned = [g for g in str(status.get("plannedGPUs") or "").split(",") if g]
    if spec is not None:
        current = frozenset(variant_id(namespace, name, spec, "" if g == CPU else g) for g in planned)
        job_id = next((b.job_id for b in bundles if b.variant in current and b.job_id), "") or plan_id(
            namespace, name, spec
        )
    return CacheView(
        namespace=namespace,
        name=name,
        ready=cond.is_true(status.get("conditions"), cond.READY) and spec is not None,
        spec=spec,
        bundles=bundles,
        current_variants=current,
        job_id=job_id,
        planned_gpus=tuple(planned),
    )


def view_current_bundles(view: CacheView) -> list[BundleRecord]:
    """The bundles of ``view``'s current plan (older generations may still be kept)."""
    return [b for b in view.bundles if b.variant in view.current_variants]


def bytecode_ready(view: CacheView) -> bool:
    """Whether every current bundle of ``view`` carries a byte-code part (cachelib.in_image.bytecode): only then
    may an app's ``PYTHONPYCACHEPREFIX`` point at it, since a prefix hides the image's own byte code."""
    current = view_current_bundles(view)
    return bool(current) and all(b.bytecode_files > 0 for b in current)
