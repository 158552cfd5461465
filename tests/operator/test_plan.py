"""The variant plan, Job names, missing variants and retention."""

from __future__ import annotations

import re

from compilecache_operator.decisions.plan import (
    BundleRecord,
    Variant,
    bundles_from_status,
    bundles_to_prune,
    job_name,
    merge_bundles,
    missing_variants,
    plan_id,
    plan_variants,
)

from tests.operator.samples import parsed

KEY = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/{gpu}/cpu/torch-2.13.0/triton-none/cuda-none/py-3.11.7"


def record(variant: str, generation: int = 1, gpu: str = "cpu") -> BundleRecord:
    return BundleRecord(variant=variant, key=KEY.format(gpu=f"{gpu}-{variant}"), gpu=gpu, generation=generation)


def test_no_gpu_types_plan_one_cpu_variant() -> None:
    (variant,) = plan_variants("team-a", "mlp", parsed())
    assert variant.gpu == "" and variant.gpu_label == "cpu" and variant.gpu_slug == "cpu"
    assert re.fullmatch(r"[0-9a-f]{10}", variant.id)


def test_gpu_types_plan_one_variant_each_in_a_stable_order() -> None:
    spec = parsed(gpuTypes=["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"])
    variants = plan_variants("team-a", "mlp", spec)
    assert [v.gpu for v in variants] == ["NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"]
    assert variants == plan_variants("team-a", "mlp", spec)
    assert len({v.id for v in variants}) == 2


def test_discovery_adds_node_gpus_and_nothing_found_plans_nothing() -> None:
    spec = parsed(gpuTypes=["NVIDIA-H100-80GB-HBM3"], gpuDiscovery={"auto": True})
    found = plan_variants("team-a", "mlp", spec, {"NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"})
    assert [v.gpu for v in found] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"]
    assert plan_variants("team-a", "mlp", parsed(gpuDiscovery={"auto": True}), set()) == []
    # discovered GPUs are ignored unless discovery is on
    assert [v.gpu for v in plan_variants("team-a", "mlp", parsed(), {"NVIDIA-L4"})] == [""]


def test_variant_ids_follow_what_changes_the_artifacts() -> None:
    def vid(**overrides: object) -> str:
        return plan_variants("team-a", "mlp", parsed(**overrides))[0].id

    base = vid()
    assert vid(warmup={"backoffLimit": 5, "resources": {"limits": {"cpu": 2}}}) == base
    assert vid(retention={"keepGenerations": 4}, deletionPolicy="Delete") == base
    assert vid(image="registry.example/workload:2") != base
    assert vid(model={"target": "tiny_mlp", "compile": {"mode": "max-autotune"}}) != base
    assert vid(model={"target": "tiny_mlp", "backward": True}) != base
    assert plan_variants("team-b", "mlp", parsed())[0].id != base
    assert plan_id("team-a", "mlp", parsed()) == plan_id("team-a", "mlp", parsed(warmup={"backoffLimit": 0}))


def test_job_names_are_deterministic_dns_labels() -> None:
    variant = Variant(id="0123456789", gpu="NVIDIA-H100", image="img")
    assert job_name("mlp", variant, 3) == "cc-mlp-0123456789-g3"
    long_name = "a-very-long.compile.cache-name-" + "x" * 200
    name = job_name(long_name, variant, 12345)
    assert len(name) <= 63 and name.endswith("-0123456789-g12345")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert job_name(long_name, variant, 12345) == name


def test_missing_variants_are_those_without_a_bundle() -> None:
    a, b = Variant("aaaaaaaaaa", "", "img"), Variant("bbbbbbbbbb", "NVIDIA-L4", "img")
    assert missing_variants([a, b], [record("aaaaaaaaaa")]) == [b]
    assert missing_variants([a, b], []) == [a, b]


def test_retention_keeps_the_current_plan_and_the_newest_generations() -> None:
    bundles = [record("old1", 1), record("old2", 2), record("old3", 3), record("cur", 1), record("new4", 4)]
    pruned = bundles_to_prune(bundles, {"cur"}, keep_generations=2)
    assert {b.variant for b in pruned} == {"old1", "old2"}
    assert bundles_to_prune(bundles, {"cur"}, keep_generations=100) == []


def test_status_round_trip_and_merge() -> None:
    rec = BundleRecord(variant="v1", key=KEY.format(gpu="cpu"), bytes=10, compile_seconds=1.5, generation=2,
                       job_id="cc-x", job="cc-mlp-v1-g2", created="2025-01-01T00:00:00Z")
    status = {"bundles": [rec.to_status(), {"variant": "broken"}]}
    assert bundles_from_status(status) == [rec]
    newer = BundleRecord(variant="v1", key=KEY.format(gpu="cpu"), bytes=20, generation=3)
    merged = merge_bundles([rec, record("v2", 1)], [newer])
    assert [b.variant for b in merged] == ["v1", "v2"] and merged[0].bytes == 20
    assert rec.key_gpu_slug == "cpu"
