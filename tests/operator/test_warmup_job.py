"""The warm-up Job: harness copy, compile and publish containers, identity, GPU and options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from compilecache_operator.decisions import warmup_job
from compilecache_operator.model.names import CACHE_LABEL

from tests.operator.samples import job_for


def containers(job: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pod = job["spec"]["template"]["spec"]
    return pod["initContainers"], pod["containers"]


def test_job_runs_harness_copy_then_compile_then_publish() -> None:
    job = job_for(storage={"url": "redis://redis:6379/0", "secretRef": {"name": "redis-creds"}})
    init, main = containers(job)
    assert [c["name"] for c in init] == ["harness", "compile"]
    assert [c["name"] for c in main] == ["publish"]
    harness, compile_, publish = init[0], init[1], main[0]
    assert harness["image"] == publish["image"] == "ghcr.io/compilecache/preloader:1"
    assert harness["command"][:2] == ["python", "-c"] and harness["command"][-1] == warmup_job.HARNESS_FILE
    assert compile_["image"] == "registry.example/workload:1"
    assert compile_["command"] == [
        "python", warmup_job.HARNESS_FILE, "--target", "tiny_mlp", "--out", "/work/out", "--namespace", "team-a",
        "--name", "mlp", "--mode", "default", "--dynamic", "auto", "--backend", "inductor",
    ]
    assert {"name": "TORCH_COMPILE_JOB_ID", "value": "cc-abc"} in compile_["env"]
    assert compile_["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert publish["command"] == ["compilecache", "publish", "/work/out", "--store", "redis://redis:6379/0"]
    assert publish["env"] == [{"name": "TMPDIR", "value": "/work"},
                              {"name": "COMPILECACHE_REDIS_PASSWORD",
                               "valueFrom": {"secretKeyRef": {"name": "redis-creds", "key": "password"}}}]
    assert "env" not in harness and "COMPILECACHE_REDIS_PASSWORD" not in str(compile_)


def test_job_identity_owner_and_labels() -> None:
    job = job_for()
    meta = job["metadata"]
    assert meta["name"] == "cc-mlp-0123456789-g3" and meta["namespace"] == "team-a"
    assert meta["ownerReferences"] == [{"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                                        "name": "mlp", "uid": "uid-1234", "controller": True,
                                        "blockOwnerDeletion": True}]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["compilecache.io/warmup-for"] == "mlp" and labels["compilecache.io/variant"] == "0123456789"
    assert labels["compilecache.io/generation"] == "3"
    assert CACHE_LABEL not in labels, "warm-up pods must never be injected by the webhook"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "nodeSelector" not in pod
    assert job["spec"]["backoffLimit"] == 2 and job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_gpu_variant_selects_the_product_and_requests_a_gpu() -> None:
    job = job_for("NVIDIA-H100-80GB-HBM3", gpuTypes=["NVIDIA-H100-80GB-HBM3"],
                  warmup={"nodeSelector": {"pool": "gpu"}, "resources": {"limits": {"memory": "8Gi"}},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    compile_ = pod["initContainers"][1]
    assert compile_["resources"] == {"limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}
    assert {"name": "COMPILECACHE_GPU", "value": "NVIDIA-H100-80GB-HBM3"} in compile_["env"]


def test_gpus_per_job_zero_requests_no_gpu_resource() -> None:
    job = job_for("NVIDIA-L4", gpuTypes=["NVIDIA-L4"], warmup={"gpusPerJob": 0},
                  gpuDiscovery={"labelKey": "example.com/gpu"})
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"example.com/gpu": "NVIDIA-L4"}
    assert not any("/" in name for part in pod["initContainers"][1]["resources"].values() for name in part)


def test_job_options_command_env_and_remote_cache() -> None:
    job = job_for(model={"command": "python serve.py", "compile": {"fullgraph": True}, "backward": True},
                  remoteCache={"host": "fleet-redis", "port": 6380}, imagePullPolicy="Always",
                  warmup={"env": [{"name": "HF_HOME", "value": "/tmp/hf"}], "serviceAccountName": "warm"})
    compile_ = job["spec"]["template"]["spec"]["initContainers"][1]
    assert compile_["command"][2:4] == ["--command", "python serve.py"]
    assert "--fullgraph" in compile_["command"] and compile_["command"][-1] == "--backward"
    env = {e["name"]: e["value"] for e in compile_["env"]}
    assert env["TORCHINDUCTOR_REDIS_HOST"] == "fleet-redis" and env["TORCHINDUCTOR_REDIS_PORT"] == "6380"
    assert env["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "1" and env["HF_HOME"] == "/tmp/hf"
    assert compile_["imagePullPolicy"] == "Always"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "warm"


def test_harness_copy_brings_the_builtin_targets_along(tmp_path: Path) -> None:
    """The copy command of the ``harness`` init container, run for real: harness.py, targets.py,
    warmstart.py, precheck.py, factors.py, masking.py, the byte-code and Triton-module parts, the pod contract, the
    stage lines and the vLLM warm-up with its command-line reader and table land side by side (the harness starts
    from them alone), so that short target names,
    --precompile (with its check) and vLLM warm-ups work in an image without cachelib."""
    subprocess.run([sys.executable, "-c", warmup_job.COPY_HARNESS, str(tmp_path / "harness.py")], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bytecode.py", "compilekey.py", "compilestep.py", "factors.py", "harness.py", "masking.py", "podcontract.py",
        "precheck.py", "precompileguard.py", "precompileparts.py", "stagelog.py", "targets.py", "triton_modules.py",
        "vllm_options.py", "vllmargs.py", "vllmwarm.py", "warmstart.py",
    ]  # fmt: skip
    alone = subprocess.run([sys.executable, "-E", "-s", str(tmp_path / "harness.py"), "--help"], capture_output=True,
                           text=True, cwd=tmp_path, check=False)  # fmt: skip
    assert alone.returncode == 0 and "--target" in alone.stdout, ("the copy imports only its companions", alone.stderr)
    assert "def tiny_mlp" in (tmp_path / "targets.py").read_text()
