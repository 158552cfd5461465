"""Sample CompileCache objects for the operator's unit tests."""

from __future__ import annotations

from typing import Any

from compilecache_operator.decisions import cacheview, podpatch, warmup_job
from compilecache_operator.decisions.plan import BundleRecord, Variant, plan_variants
from compilecache_operator.model.names import CACHE_LABEL
from compilecache_operator.model.sidecars import SidecarSupport
from compilecache_operator.model.spec import CacheSpec, Defaults
from compilecache_operator.model.spec_parse import parse_spec

WITH_SIDECARS = SidecarSupport(True, "the API server is v1.30.1")
SETTINGS = warmup_job.JobSettings(preloader_image="ghcr.io/compilecache/preloader:1", image_pull_secrets=("regcred",))
KEY = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/{gpu}/{cap}/torch-2.13.0/triton-none/cuda-none/py-3.11.7"


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


def job_for(gpu: str = "", **spec: Any) -> dict[str, Any]:
    """The warm-up Job of the sample cache's one variant: ``gpu``, or the CPU."""
    body = owner(**spec)
    parsed_spec = parse_spec(body["spec"], Defaults())
    variant = Variant(id="0123456789", gpu=gpu, image=parsed_spec.image)
    return warmup_job.build_job(body, parsed_spec, variant, name="cc-mlp-0123456789-g3", job_id="cc-abc",
                                settings=SETTINGS)


# -- pods and the webhook's view of a cache ---------------------------------------------------------------
def view(ready: bool = True, precompile: str = "", bytecode_files: int = 0,
         warmup_env: tuple[tuple[str, str], ...] | None = (), **spec: Any) -> cacheview.CacheView:
    """The sample cache's view with one bundle per planned variant; ``warmup_env``: the key-factor variables the
    bundles recorded of their warm-up (None: a record from before these were kept)."""
    parsed_spec = parsed(**spec)
    variants = plan_variants("team-a", "mlp", parsed_spec)
    bundles = tuple(
        BundleRecord(variant=v.id, key=KEY.format(gpu=v.gpu_slug, cap="cpu"), gpu=v.gpu_label, image=v.image,
                     job_id="cc-job", precompile=precompile, bytecode_files=bytecode_files, warmup_env=warmup_env)
        for v in variants
    )
    return cacheview.CacheView(namespace="team-a", name="mlp", ready=ready, spec=parsed_spec, bundles=bundles,
                               current_variants=frozenset(v.id for v in variants), job_id="cc-job")


def pod(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "containers": [{"name": "app", "image": "registry.example/workload:1", "command": ["python", "app.py"]}]
    }
    base.update(spec)
    return {"metadata": {"name": "p", "namespace": "team-a", "labels": {CACHE_LABEL: "mlp"}}, "spec": base}


def inject(p: dict[str, Any], v: cacheview.CacheView | None,
           sidecars: SidecarSupport = WITH_SIDECARS) -> podpatch.PodPatch:
    return podpatch.build_pod_patch(p, v, preloader_image="ghcr.io/compilecache/preloader:1", sidecars=sidecars)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def flag(command: list[str], name: str) -> str | None:
    """The value after ``name`` in a command line, None when the flag is absent."""
    return command[command.index(name) + 1] if name in command else None


BUDGET = str(16 * 2**30)
"""The default ``--max-bytes``: the cache volume's default sizeLimit, 16Gi."""
