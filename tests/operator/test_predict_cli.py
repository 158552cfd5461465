"""``compilecache predict`` on manifest files: the same answer as the admission for the same CompileCache (its
object as kubectl shows it), the exit status, the workload kinds it reads, and clear errors. Here beside the
operator's tests because the agreement needs the operator's webhook; the command itself imports nothing of it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.decisions import cacheview
from compilecache_operator.decisions.plan import BundleRecord, plan_variants
from compilecache_operator.model import names
from compilecache_operator.model.spec import Defaults
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib import prediction
from cachelib.cli import main
from cachelib.cli.predicting import COLD_EXIT, answer
from tests.operator.samples import KEY, inject, owner, parsed

IMAGE = "registry.example/workload:1"
GPUS = ["NVIDIA-H100", "NVIDIA-L4"]


def cache_body(env: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """The sample CompileCache as ``kubectl get -o json`` shows it once warmed: one bundle per planned GPU type."""
    body = owner(gpuTypes=GPUS, **spec)
    records = [
        BundleRecord(variant=v.id, key=KEY.format(gpu=v.gpu_slug, cap="sm90"), gpu=v.gpu_label, image=v.image,
                     job_id="cc-job", generation=3, warmup_env=tuple(sorted((env or {}).items())))
        for v in plan_variants("team-a", "mlp", parsed(gpuTypes=GPUS, **spec))
    ]  # fmt: skip
    body["status"] = {"conditions": [{"type": "Ready", "status": "True"}], "plannedGPUs": ",".join(GPUS),
                      "bundles": [r.to_status() for r in records]}  # fmt: skip
    return body


def deployment(env: dict[str, str], *, gpu: str | None = "NVIDIA-H100", image: str = IMAGE,
               label: str = "mlp") -> dict[str, Any]:  # fmt: skip
    template_spec: dict[str, Any] = {"containers": [{"name": "app", "image": image, "command": ["python", "app.py"],
                                                     "env": [{"name": k, "value": v} for k, v in env.items()]}]}
    if gpu:
        template_spec["nodeSelector"] = {"nvidia.com/gpu.product": gpu}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"template": {"metadata": {"labels": {names.CACHE_LABEL: label}}, "spec": template_spec}}}


def write(path: Path, *documents: dict[str, Any]) -> str:
    path.write_text("\n---\n".join(json.dumps(d) for d in documents))  # JSON is YAML: a multi-document file
    return str(path)


# -- the same answer as the admission ----------------------------------------------------------------------------
FACTORS = st.fixed_dictionaries({}, optional={
    "TORCHINDUCTOR_MAX_AUTOTUNE": st.sampled_from(["0", "1"]),
    "OMP_NUM_THREADS": st.sampled_from(["4", "8"]),
    "TORCH_COMPILE_JOB_ID": st.sampled_from(["cc-job", "mine"]),
    "TORCH_CACHING_PRECOMPILE": st.sampled_from(["0", "1"]),
})  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(warmup=FACTORS, pod_env=FACTORS, gpu=st.sampled_from([None, "NVIDIA-H100", "NVIDIA-A100"]),
       image=st.sampled_from([IMAGE, "registry.example/workload:2"]))  # fmt: skip
def test_the_command_says_what_the_admission_says(warmup: dict[str, str], pod_env: dict[str, str], gpu: str | None,
                                                  image: str) -> None:  # fmt: skip
    body = cache_body({k: v for k, v in warmup.items() if prediction.key_factor_env(k)})
    (_, pod), = prediction.pods_of(deployment(pod_env, gpu=gpu, image=image))
    view = cacheview.cache_view(body, Defaults())
    admitted = inject(pod, view)
    said = answer(pod, body, prediction.cache_from_body(body), "team-a", "mlp")
    assert said["prediction"] == admitted.annotations[names.PREDICTED_ANNOTATION]
    assert said["detail"][:1000] == admitted.annotations[names.PREDICTED_DETAIL_ANNOTATION]


@pytest.mark.parametrize("args", [["--max-model-len", "8192"], ["--max-model-len", "4096"], []])
def test_a_vllm_start_is_said_as_the_admission_says_it(args: list[str]) -> None:
    vllm = {"model": "Qwen/Qwen3-8B", "args": ["--max-model-len", "8192"]}
    body = cache_body(model={"vllm": vllm})
    template = deployment({}, gpu="NVIDIA-H100")
    template["spec"]["template"]["spec"]["containers"][0].update(command=["vllm", "serve", "Qwen/Qwen3-8B", *args])
    (_, pod), = prediction.pods_of(template)
    admitted = inject(pod, cacheview.cache_view(body, Defaults()))
    said = answer(pod, body, prediction.cache_from_body(body), "team-a", "mlp")
    assert (said["prediction"], said["detail"]) == (admitted.annotations[names.PREDICTED_ANNOTATION],
                                                    admitted.annotations[names.PREDICTED_DETAIL_ANNOTATION])
    assert said["prediction"] == ("warm" if args == vllm["args"] else "cold"), said


# -- on files ------------------------------------------------------------------------------------------------------
def test_a_cold_pod_is_said_with_its_factor_and_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cc = write(tmp_path / "cc.yaml", cache_body({"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}))
    pods = write(tmp_path / "deploy.yaml", deployment({"TORCHINDUCTOR_MAX_AUTOTUNE": "0"}),
                 {"kind": "ConfigMap", "metadata": {"name": "x"}})  # fmt: skip
    assert main(["predict", "--cache-file", cc, "-f", pods]) == COLD_EXIT
    assert capsys.readouterr().out == "Deployment/web: cold: env TORCHINDUCTOR_MAX_AUTOTUNE: 1 → 0\n"
    warm = write(tmp_path / "warm.yaml", deployment({"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}))
    assert main(["predict", "--cache-file", cc, "--cache", "team-a/mlp", "-f", warm, "-o", "json"]) == 0
    (said,) = json.loads(capsys.readouterr().out)
    assert (said["object"], said["prediction"], said["differences"]) == ("Deployment/web", "warm", [])


def test_every_workload_kind_with_a_pod_template_is_read() -> None:
    (_, template), = prediction.pods_of(deployment({}))
    wrapped = {
        "Pod": {**template, "metadata": {**template["metadata"], "name": "p"}},
        "StatefulSet": {"spec": {"template": template}},
        "Job": {"spec": {"template": template}},
        "CronJob": {"spec": {"jobTemplate": {"spec": {"template": template}}}},
    }
    for kind, document in wrapped.items():
        found = prediction.pods_of({"kind": "List", "items": [{**document, "kind": kind}]})
        assert [w.split("/")[0] for w, _ in found] == [kind]
        assert found[0][1]["spec"] == template["spec"]
    assert prediction.pods_of({"kind": "Service", "metadata": {"name": "s"}}) == []


def test_a_pod_of_another_cache_or_a_cache_not_ready_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = cache_body()
    other = write(tmp_path / "other.yaml", deployment({}, label="llama"))
    assert main(["predict", "--cache-file", write(tmp_path / "cc.json", body), "-f", other]) == 0
    assert "not opted in to CompileCache team-a/mlp" in capsys.readouterr().out
    body["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pods = write(tmp_path / "deploy.yaml", deployment({}))
    assert main(["predict", "--cache-file", write(tmp_path / "cc.json", body), "-f", pods]) == COLD_EXIT
    assert "is not Ready: its pods start without a preload" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("files", "extra", "message"),
    [
        ({"cc.yaml": "kind: [\n"}, [], "cc.yaml: neither JSON nor YAML"),
        ({"cc.yaml": '{"kind": "ConfigMap"}'}, [], "cc.yaml: no CompileCache in it"),
        ({"cc.yaml": "- a\n- b\n"}, [], "cc.yaml: expected Kubernetes objects (mappings), found a list"),
        ({}, [], "cc.yaml: cannot read"),
        ({"cc.yaml": "TWO"}, [], "2 CompileCaches (team-a/mlp, team-b/mlp): name one with --cache NS/NAME"),
        ({"cc.yaml": "ONE"}, ["--cache", "team-a/other"], "no CompileCache team-a/other (it has team-a/mlp)"),
        ({"cc.yaml": "ONE", "deploy.yaml": '{"kind": "Service"}'}, [], "no Pod, nor a workload with a pod template"),
        ({"cc.yaml": "ONE", "deploy.yaml": '{"kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}'}, [],
         "Deployment/d has no spec.template"),
    ],
)  # fmt: skip
def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str],
                            extra: list[str], message: str) -> None:  # fmt: skip
    one = cache_body()
    two = {**cache_body(), "metadata": {**one["metadata"], "namespace": "team-b"}}
    texts = {"ONE": json.dumps(one), "TWO": json.dumps(one) + "\n---\n" + json.dumps(two)}
    for name, text in {"deploy.yaml": json.dumps(deployment({})), **files}.items():
        (tmp_path / name).write_text(texts.get(text, text))
    code = main(["predict", "--cache-file", str(tmp_path / "cc.yaml"), "-f", str(tmp_path / "deploy.yaml"), *extra])
    assert code == 1
    error = capsys.readouterr().err
    assert error.startswith("compilecache predict: error: ") and message in error, error


def test_without_a_cache_file_kubectl_reads_the_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """kubectl's answer comes from a script standing in for a cluster (none runs in the unit tests); the command
    line it is given is checked, and that it asks only to get."""
    said = tmp_path / "args"
    fake = tmp_path / "kubectl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {said}\ncat {write(tmp_path / 'cc.json', cache_body())}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    pods = write(tmp_path / "deploy.yaml", deployment({}))
    assert main(["predict", "--cache", "team-a/mlp", "-f", pods, "--context", "prod"]) == 0
    assert said.read_text().split() == ["--context", "prod", "get", "compilecache", "mlp", "-n", "team-a", "-o", "json"]
    assert "Deployment/web: warm" in capsys.readouterr().out
    assert main(["predict", "--cache", "team-a/mlp", "-f", pods, "--kubectl", "false"]) == 1
    assert "kubectl get compilecache mlp -n team-a: exit status 1" in capsys.readouterr().err
    assert main(["predict", "--cache", "team-a/mlp", "-f", pods, "--kubectl", "no-such-kubectl"]) == 1
    assert "no-such-kubectl: not found on PATH" in capsys.readouterr().err
    assert main(["predict", "-f", pods]) == 1
    assert "name the CompileCache" in capsys.readouterr().err


def test_the_names_the_command_shares_with_the_operator_are_the_operators() -> None:
    from compilecache_operator.model.spec import DEFAULT_GPU_LABEL_KEY

    assert (prediction.CACHE_LABEL, prediction.GPU_ANNOTATION, prediction.DEFAULT_GPU_LABEL_KEY) == (
        names.CACHE_LABEL, names.GPU_ANNOTATION, DEFAULT_GPU_LABEL_KEY)
