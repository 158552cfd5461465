"""The prediction at admission (pure): each factor a pod manifest shows, changed alone, is predicted cold with the
factor and both values named; the same factors are predicted warm; what a manifest cannot show is ``unknown``
with the reason."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachelib import prediction
from cachelib.in_image.factors import ENV_PER_RUN
from cachelib.prediction import COLD, UNKNOWN, WARM, Cache, Warmed, predict, recorded_env

IMAGE = "registry.example/workload:1"
JOB = "cc-0123456789abcdef"
KEY = "cc1/team-a/mlp/0123456789abcdef/fedcba9876543210/{gpu}/sm90/torch-2.13.0/triton-3.5.0/cuda-12.8/py-3.11.7"
WARMUP_ENV = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "OMP_NUM_THREADS": "8"}


def bundle(gpu: str = "nvidia-h100", **fields: Any) -> dict[str, Any]:
    """A ``status.bundles`` entry as the operator writes it."""
    entry = {"variant": f"v-{gpu}", "key": KEY.format(gpu=gpu), "gpu": gpu, "image": IMAGE, "jobId": JOB,
             "generation": 2, "warmupEnv": {"values": dict(WARMUP_ENV), "fromElsewhere": []}}  # fmt: skip
    entry.update(fields)
    return entry


def cache(*entries: dict[str, Any], planned: tuple[str, ...] = ("nvidia-h100",)) -> Cache:
    records = tuple(Warmed.from_status(e) for e in entries or (bundle(),))
    return Cache("team-a/mlp", records, frozenset(r.variant for r in records), planned)


def manifest(env: dict[str, str] | None = None, image: str = IMAGE, gpu: str | None = "NVIDIA-H100",
             **container: Any) -> dict[str, Any]:  # fmt: skip
    values = WARMUP_ENV if env is None else env
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": image, "command": ["python", "serve.py"],
                                            "env": [{"name": k, "value": v} for k, v in values.items()],
                                            **container}]}  # fmt: skip
    if gpu is not None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": gpu}
    return {"metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def test_the_same_factors_are_predicted_warm() -> None:
    found = predict(manifest(), cache())
    assert (found.outcome, found.cause, found.warning()) == (WARM, "none", None)
    assert "env TORCHINDUCTOR_MAX_AUTOTUNE" in found.compared and "gpu nvidia-h100" in found.compared


# -- one factor at a time ---------------------------------------------------------------------------------------------
KEY_NAMES = st.tuples(
    st.sampled_from(["TORCHINDUCTOR_", "TORCH_", "TRITON_", "PYTORCH_", "CUDA_", "NVIDIA_"]),
    st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True),
).map("".join).filter(prediction.key_factor_env)
VALUES = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30)


@given(name=KEY_NAMES, before=VALUES, after=VALUES)
def test_a_key_factor_variable_that_differs_is_predicted_cold_with_both_values(name: str, before: str,
                                                                                after: str) -> None:  # fmt: skip
    warmed = bundle(warmupEnv={"values": {name: prediction.recorded_value(name, before)}})
    same = predict(manifest({name: before}), cache(warmed))
    assert same.outcome == WARM, same.detail()
    found = predict(manifest({name: after}), cache(warmed))
    if before == after:
        assert found.outcome == WARM
        return
    assert (found.outcome, found.cause) == (COLD, "env")
    (difference,) = found.differences
    assert (difference.name, difference.warmup, difference.pod) == (
        name, prediction.recorded_value(name, before), prediction.recorded_value(name, after))
    assert found.warning() == f"compilecache: this pod will compile: env {name}: {difference.warmup} → {difference.pod}"


@given(name=KEY_NAMES, value=VALUES)
def test_a_variable_set_on_one_side_only_is_predicted_cold(name: str, value: str) -> None:
    only_pod = predict(manifest({name: value}), cache(bundle(warmupEnv={"values": {}})))
    only_warmup = predict(manifest({}), cache(bundle(warmupEnv={"values": {name: value}})))
    assert [(d.name, d.warmup, d.pod) for d in only_pod.differences] == [
        (name, "unset", prediction.recorded_value(name, value))]
    assert [(d.name, d.warmup, d.pod) for d in only_warmup.differences] == [
        (name, prediction.recorded_value(name, value), "unset")]


NOT_COMPARED = ENV_PER_RUN - {"TORCH_COMPILE_JOB_ID"} | prediction.NOT_KEYED | {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
                                                                                 "HF_HOME", "PATH"}


@pytest.mark.parametrize("name", sorted(NOT_COMPARED))
def test_variables_that_enter_no_key_are_not_compared(name: str) -> None:
    """Where files go, which devices a process sees, the remote-cache switches (the webhook sets the warm-up's)."""
    assert predict(manifest({**WARMUP_ENV, name: "/elsewhere"}), cache()).outcome == WARM


def test_an_image_the_bundles_were_not_warmed_with_is_predicted_cold() -> None:
    found = predict(manifest(image="registry.example/workload:2"), cache())
    assert (found.outcome, found.cause) == (COLD, "image")
    assert found.detail() == f"image {IMAGE} → registry.example/workload:2"


def test_a_digest_is_not_its_tag() -> None:
    by_digest = "registry.example/workload@sha256:" + "a" * 64
    found = predict(manifest(image=by_digest), cache())
    assert found.outcome == COLD
    assert found.detail() == (f"image {IMAGE} → {by_digest} (the same repository: a digest and a tag are different "
                              "references)")  # fmt: skip


@pytest.mark.parametrize(
    "pin",
    [
        {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100"}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100"]}]}]}}}},
        {"annotation": "NVIDIA-A100"},
    ],
    ids=["nodeSelector", "affinity", "annotation"],
)  # fmt: skip
def test_a_gpu_type_without_a_bundle_is_predicted_cold(pin: dict[str, Any]) -> None:
    pod = manifest(gpu=None)
    if "annotation" in pin:
        pod["metadata"]["annotations"] = {"compilecache.io/gpu": pin["annotation"]}
    else:
        pod["spec"].update(pin)
    found = predict(pod, cache())
    assert (found.outcome, found.cause) == (COLD, "gpu")
    assert found.detail() == "gpu nvidia-h100 → nvidia-a100"
    on_h100 = copy.deepcopy(pod)
    on_h100["metadata"].pop("annotations", None)
    on_h100["spec"].pop("affinity", None)
    on_h100["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100"}
    assert predict(on_h100, cache()).outcome == WARM


def test_another_job_id_is_predicted_cold() -> None:
    found = predict(manifest({**WARMUP_ENV, "TORCH_COMPILE_JOB_ID": "mine"}), cache())
    assert (found.outcome, found.cause) == (COLD, "job_id")
    assert found.detail() == f"env TORCH_COMPILE_JOB_ID: {JOB} → mine"
    assert predict(manifest({**WARMUP_ENV, "TORCH_COMPILE_JOB_ID": JOB}), cache()).outcome == WARM


@pytest.mark.parametrize("state", ["", "LeftOut"])
def test_caching_precompile_without_a_precompiled_part_is_predicted_cold(state: str) -> None:
    on = {**WARMUP_ENV, "TORCH_CACHING_PRECOMPILE": "1"}
    found = predict(manifest(on), cache(bundle(precompile=state)))
    assert (found.outcome, found.cause) == (COLD, "precompile")
    assert found.differences[0].warmup == f"unset (no precompiled part: precompile {state or 'Off'})"
    assert predict(manifest(on), cache(bundle(precompile="Verified"))).outcome == WARM
    assert predict(manifest({**WARMUP_ENV, "TORCH_CACHING_PRECOMPILE": "0"}), cache(bundle())).outcome == WARM


def test_every_differing_factor_is_named_and_the_first_is_the_cause() -> None:
    pod = manifest({"TORCHINDUCTOR_MAX_AUTOTUNE": "0", "TORCH_COMPILE_JOB_ID": "x"}, gpu="NVIDIA-A100")
    found = predict(pod, cache())
    assert found.cause == "gpu"
    assert [d.kind for d in found.differences] == ["gpu", "env", "env", "job_id"]


def test_a_container_of_another_image_is_not_compared() -> None:
    pod = manifest()
    pod["spec"]["containers"].append({"name": "logs", "image": "fluent/fluent-bit:3", "env": []})
    assert predict(pod, cache()).outcome == WARM


# -- what a manifest cannot show --------------------------------------------------------------------------------------
def test_no_gpu_pinned_with_bundles_for_only_some_types_is_unknown() -> None:
    partial = cache(bundle(), planned=("nvidia-h100", "nvidia-l4"))
    found = predict(manifest(gpu=None), partial)
    assert (found.outcome, found.cause) == (UNKNOWN, "gpu")
    assert "bundles for nvidia-h100 only (none yet for nvidia-l4)" in found.detail()
    assert found.warning() is None
    assert predict(manifest(gpu=None), cache()).outcome == WARM, "every planned type has its bundle"


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
         "TORCHINDUCTOR_MAX_AUTOTUNE from valueFrom"),
        ({"name": "TORCH_COMPILE_JOB_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
         "TORCH_COMPILE_JOB_ID from valueFrom"),
    ],
)  # fmt: skip
def test_a_variable_from_value_from_is_unknown(entry: dict[str, Any], reason: str) -> None:
    pod = manifest({"OMP_NUM_THREADS": "8"})
    pod["spec"]["containers"][0]["env"].append(entry)
    found = predict(pod, cache(bundle(warmupEnv={"values": {"OMP_NUM_THREADS": "8"}})))
    assert (found.outcome, found.cause) == (UNKNOWN, "env")
    assert reason in found.detail()


def test_env_from_is_unknown() -> None:
    found = predict(manifest(envFrom=[{"configMapRef": {"name": "tuning"}}]), cache())
    assert found.outcome == UNKNOWN and "envFrom configMap tuning" in found.detail()


@pytest.mark.parametrize("image", ["registry.example/workload:latest", "registry.example/workload"])
def test_a_moving_tag_is_unknown(image: str) -> None:
    found = predict(manifest(image=image), cache(bundle(image=image)))
    assert (found.outcome, found.cause) == (UNKNOWN, "image")


def test_a_record_from_before_the_warmup_environment_is_unknown() -> None:
    old = bundle()
    del old["warmupEnv"]
    found = predict(manifest(), cache(old))
    assert found.outcome == UNKNOWN and "predate the warm-up's environment" in found.detail()


def test_a_cold_factor_is_said_with_what_could_not_be_compared() -> None:
    found = predict(manifest({"OMP_NUM_THREADS": "4"}, envFrom=[{"secretRef": {"name": "s"}}]),
                    cache(bundle(warmupEnv={"values": {"OMP_NUM_THREADS": "8"}})))  # fmt: skip
    assert found.outcome == COLD
    assert found.detail().startswith("env OMP_NUM_THREADS: 8 → 4 (not compared: envFrom secret s")


# -- what a bundle records ----------------------------------------------------------------------------------------
def test_the_record_keeps_key_factors_only_and_no_secret_value() -> None:
    values, elsewhere = recorded_env([
        {"name": "TORCH_COMPILE_JOB_ID", "value": "cc-1"}, {"name": "TRITON_HOME", "value": "/scratch"},
        {"name": "TORCHINDUCTOR_MAX_AUTOTUNE", "value": "1"}, {"name": "HF_TOKEN", "value": "hf_x"},
        {"name": "TORCH_HUB_TOKEN", "value": "s3cr3t"},
        {"name": "OMP_NUM_THREADS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ])  # fmt: skip
    assert set(values) == {"TORCHINDUCTOR_MAX_AUTOTUNE", "TORCH_HUB_TOKEN"} and elsewhere == ["OMP_NUM_THREADS"]
    assert values["TORCH_HUB_TOKEN"].startswith("sha256:") and "s3cr3t" not in str(values)
    warmed = bundle(warmupEnv={"values": values})
    assert predict(manifest({"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCH_HUB_TOKEN": "s3cr3t"}), cache(warmed)).outcome \
        == WARM  # fmt: skip
    found = predict(manifest({"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "TORCH_HUB_TOKEN": "other"}), cache(warmed))
    assert found.outcome == COLD and "s3cr3t" not in found.detail() and "other" not in found.detail()


# -- vLLM ------------------------------------------------------------------------------------------------------------
def test_a_vllm_start_that_differs_is_predicted_cold_with_the_argument() -> None:
    warmup = ["vllm", "serve", "Qwen/Qwen3-8B", "--max-model-len", "8192"]
    container = {"name": "vllm", "image": IMAGE, "args": ["Qwen/Qwen3-8B", "--max-model-len", "4096"]}
    starts = prediction.predict_vllm([container], warmup, {}, ("vllm", "serve"))
    pod = {"metadata": {}, "spec": {"containers": [container],
                                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}}}  # fmt: skip
    found = predict(pod, cache(bundle(warmupEnv={"values": {}})), starts)
    assert (found.outcome, found.cause, found.detail()) == (COLD, "engine_argument", "--max-model-len 8192 → 4096")
