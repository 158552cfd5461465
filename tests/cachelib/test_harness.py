"""The warm-up harness: identity functions agree with cachelib.keyformat, options enter the digest,
bad targets fail with clear messages, and a real CPU warm-up writes a complete output directory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cachelib import keyformat
from cachelib.in_image import compilekey, compilestep, harness, podcontract, precompileparts, stagelog, triton_modules
from cachelib.in_image.compilekey import CompileOptions, UsageError
from cachelib.in_image.compilestep import HarnessError
from tests.cachelib.conftest import WARM_NAME, WARM_NAMESPACE, Warmed

PAYLOADS: list[Any] = [
    {"target": "cachelib.in_image.targets:tiny_mlp"},
    {"b": [1, 2, {"z": None, "a": True}], "a": 1.5},
    CompileOptions(mode="max-autotune", dynamic=True, inductor_config=(("x", 1),)).to_dict(),
    "plain",
    [Path("/p")],
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_digest_is_the_same_function_as_keys_digest(payload: Any) -> None:
    assert compilekey.digest(payload) == keyformat.digest(payload)


@pytest.mark.parametrize("product", ["NVIDIA H100 80GB HBM3", "NVIDIA-A100-SXM4-80GB", "AMD Instinct MI300X", ""])
def test_gpu_slug_matches_keys(product: str) -> None:
    assert compilekey.gpu_slug(product) == keyformat.gpu_slug(product)


def test_key_fields_of_a_cuda_device_make_a_valid_key() -> None:
    """Pure function: the device dict is what detect_device() returns on an H100."""
    device = {"type": "cuda", "product": "NVIDIA H100 80GB HBM3", "capability": "9.0", "count": 8}
    versions = {"torch": "2.13.0+cu128", "triton": "3.6.0", "cuda": "12.8", "python": "3.11.7"}
    fields = compilekey.key_fields("ml", "llama", "0" * 16, "1" * 16, device, versions)
    key = keyformat.CacheKey.from_dict(fields)
    assert (key.gpu, key.capability, key.py) == ("nvidia-h100-80gb-hbm3", "sm90", "3.11")
    assert compilekey.key_string(fields) == str(key)


def test_key_fields_of_the_cpu() -> None:
    device = {"type": "cpu", "product": "cpu", "capability": None, "count": 0}
    versions = {"torch": "2.13.0+cpu", "triton": "none", "cuda": "none", "python": "3.12.1"}
    key = keyformat.CacheKey.from_dict(compilekey.key_fields("default", "x", "0" * 16, "1" * 16, device, versions))
    assert (key.gpu, key.capability, key.triton, key.cuda, key.py) == ("cpu", "cpu", "none", "none", "3.12")


def test_version_segment_makes_any_version_a_valid_segment() -> None:
    assert compilekey.version_segment("2.6.0a0+git1234 abc") == "2.6.0a0+git1234-abc"
    keyformat.CacheKey.from_dict({**keyformat.CacheKey.parse(
        "cc1/a/b/0123456789abcdef/0123456789abcdef/cpu/cpu/torch-1/triton-none/cuda-none/py-3.11"
    ).to_dict(), "torch": compilekey.version_segment("2.6.0a0+git1234 abc")})  # fmt: skip


OPTION_VARIANTS = {
    "mode": CompileOptions(mode="max-autotune"),
    "dynamic-true": CompileOptions(dynamic=True),
    "dynamic-false": CompileOptions(dynamic=False),
    "fullgraph": CompileOptions(fullgraph=True),
    "backend": CompileOptions(backend="aot_eager"),
    "backward": CompileOptions(backward=True),
    "compiled_autograd": CompileOptions(compiled_autograd=True),
    "inductor_config": CompileOptions(inductor_config=(("max_autotune_gemm", True),)),
}


def test_every_compile_option_enters_the_digest() -> None:
    digests = {name: o.digest() for name, o in OPTION_VARIANTS.items()}
    digests["default"] = CompileOptions().digest()
    assert len(set(digests.values())) == len(digests)


def test_compile_options_details() -> None:
    assert CompileOptions(compiled_autograd=True).backward is True
    a = CompileOptions(inductor_config=(("b", 1), ("a", 2)))
    b = CompileOptions(inductor_config=(("a", 2), ("b", 1)))
    assert a.digest() == b.digest()
    assert CompileOptions().compile_kwargs() == {"mode": None, "dynamic": None, "fullgraph": False,
                                                 "backend": "inductor"}  # fmt: skip


def test_targets_and_model_digest() -> None:
    assert compilekey.canonical_target("tiny_mlp") == "cachelib.in_image.targets:tiny_mlp"
    assert compilekey.model_digest(target="tiny_mlp") == compilekey.model_digest(
        target="cachelib.in_image.targets:tiny_mlp")
    assert compilekey.model_digest(target="a:b") != compilekey.model_digest(command="a:b")
    for bad in ("nocolon", "mod:", ":fn", "mod:not-an-identifier"):
        with pytest.raises(UsageError, match="module:function") as caught:
            compilekey.canonical_target(bad)
        assert caught.value.exit_code == compilestep.EXIT_USAGE


def test_job_id_is_stable_per_cache() -> None:
    assert compilekey.default_job_id("ns", "a") == compilekey.default_job_id("ns", "a")
    assert compilekey.default_job_id("ns", "a") != compilekey.default_job_id("ns", "b")


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        (42, "returned int"),
        ([], "returned list"),
        ([len], "item 0 is builtin_function_or_method"),
        ([(len, (1,), {}, "extra")], "item 0 is tuple"),
        ([(42, ())], "int is not callable"),
        ([(len, "x")], "example_args is str"),
        ([(len, (), [])], "example_kwargs is list"),
    ],
)
def test_wrong_target_shapes(returned: Any, match: str) -> None:
    with pytest.raises(HarnessError, match=match) as caught:
        compilestep.normalise_entries("m:f", returned)
    assert caught.value.exit_code == compilestep.EXIT_SHAPE


def test_right_target_shapes() -> None:
    assert compilestep.normalise_entries("m:f", None) is None
    assert compilestep.normalise_entries("m:f", [(len, [1]), (max, (1, 2), {"default": 0})]) == [
        (len, (1,), {}),
        (max, (1, 2), {"default": 0}),
    ]


def test_import_failures_are_named() -> None:
    with pytest.raises(HarnessError, match=r"cannot import target 'no_such_module_xyz:f'.*ModuleNotFound") as e:
        compilestep.load_target("no_such_module_xyz:f")
    assert e.value.exit_code == compilestep.EXIT_IMPORT
    with pytest.raises(HarnessError, match="has no function 'nothing'"):
        compilestep.load_target("json:nothing")


def test_detect_device_reads_cuda_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch.cuda's queries are replaced by an H100's answers (a mock, because a GPU
    cannot run on this machine); the harness must take product and capability from them."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    device = compilestep.detect_device()
    assert device == {"type": "cuda", "product": "NVIDIA H100 80GB HBM3", "capability": "9.0", "count": 8}


# -- the harness as a program -------------------------------------------------------------------
def run_harness(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, harness.__file__, "--out", str(tmp_path / "out"), "--namespace", "default", "--name", "t",
         *args],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **(env or {})}, timeout=300, check=False,
    )  # fmt: skip


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    proc = run_harness(tmp_path, "--target", "nocolon")
    assert proc.returncode == 2
    assert "module:function" in proc.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    proc = subprocess.run(
        [sys.executable, harness.__file__, "--out", str(tmp_path / "busy"), "--namespace", "default", "--name", "t",
         "--target", "tiny_mlp"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "not an empty directory" in proc.stderr


def test_target_that_cannot_be_imported_exits_3_and_says_why(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    proc = run_harness(tmp_path, "--target", "missing_module_abc:warm", env={"COMPILECACHE_TERMINATION_LOG": str(log)})
    assert proc.returncode == compilestep.EXIT_IMPORT
    assert proc.stderr.strip().splitlines()[-1] == (
        "harness: error: cannot import target 'missing_module_abc:warm': "
        "ModuleNotFoundError: No module named 'missing_module_abc'"
    )
    message = json.loads(log.read_text())
    assert message["result"] == "error" and "missing_module_abc" in message["reason"]


@pytest.mark.slow
def test_target_with_the_wrong_shape_exits_5_and_failing_target_exits_4(tmp_path: Path) -> None:
    (tmp_path / "usermod.py").write_text(
        textwrap.dedent("""
        def shape():
            return {"model": 1}

        def boom():
            raise RuntimeError("no weights here")
    """)
    )
    proc = run_harness(tmp_path, "--target", "usermod:shape")
    assert proc.returncode == compilestep.EXIT_SHAPE, proc.stderr
    assert "target 'usermod:shape' returned dict; expected a list of" in proc.stderr
    (tmp_path / "out").rename(tmp_path / "out-shape")
    proc = run_harness(tmp_path, "--target", "usermod:boom")
    assert proc.returncode == compilestep.EXIT_FAILED
    assert proc.stderr.strip().splitlines()[-1] == (
        "harness: error: target 'usermod:boom' failed: RuntimeError: no weights here"
    )


@pytest.mark.slow
def test_command_runs_with_the_cache_environment(tmp_path: Path) -> None:
    script = (
        "import os, pathlib; d = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']); "
        "(d / 'marker').write_text(os.environ['TORCH_COMPILE_JOB_ID'])"
    )
    proc = run_harness(tmp_path, "--command", f'{sys.executable} -c "{script}"')
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert (out / "cachedir" / "marker").read_text() == "compilecache-default.t"
    result = json.loads((out / "result.json").read_text())
    assert result["command"].startswith(sys.executable) and result["target"] is None
    assert result["counters"] is None and result["megacache"]["bytes"] == 0
    assert result["key"]["model"] == compilekey.model_digest(command=result["command"])
    out.rename(tmp_path / "out-ok")
    proc = run_harness(tmp_path, "--command", f"{sys.executable} -c 'raise SystemExit(7)'")
    assert proc.returncode == compilestep.EXIT_FAILED and "exited with status 7" in proc.stderr


@pytest.mark.slow
def test_real_warm_up_writes_a_complete_output_directory(warmed: Warmed) -> None:
    result = warmed.result
    key = keyformat.CacheKey.from_dict(result["key"])
    assert str(key) == result["key_string"]
    assert (key.namespace, key.name, key.gpu, key.capability) == (WARM_NAMESPACE, WARM_NAME, "cpu", "cpu")
    assert key.model == compilekey.model_digest(target="tiny_mlp")
    assert key.options == CompileOptions().digest() == compilekey.digest(result["options"])
    import torch

    assert result["versions"]["torch"] == torch.__version__ == key.torch
    assert result["job_id"] == compilekey.default_job_id(WARM_NAMESPACE, WARM_NAME)
    assert result["cache"]["fxgraph_miss"] >= 1 and result["cache"]["fxgraph_hit"] == 0
    assert result["counters"]["aot_autograd"]["autograd_cache_saved"] >= 1
    assert result["targets"][0]["seconds"] > 0 and result["compile_seconds"] >= result["targets"][0]["seconds"]
    assert result["device"]["type"] == "cpu"
    megacache = warmed.out / "megacache.bin"
    assert megacache.stat().st_size == result["megacache"]["bytes"] > 0
    assert any((warmed.out / "cachedir" / "fxgraph").iterdir())
    assert any((warmed.out / "cachedir" / "aotautograd").iterdir())


PKG = "cachelib.in_image."
CONTRACT = {PKG + "podcontract", "podcontract"}
KEYS = {PKG + "compilekey", "compilekey"}
STEP = {PKG + "compilestep", "compilestep"}
COMPANIONS = {PKG + "harness": KEYS | CONTRACT | STEP | {PKG + "precompileparts", "precompileparts", PKG + "stagelog",
                                                       "stagelog"},
              PKG + "precompileparts": CONTRACT | STEP, PKG + "stagelog": set(),
              PKG + "compilekey": set(), PKG + "compilestep": KEYS, PKG + "targets": set(),
              PKG + "warmstart": CONTRACT | {PKG + "precompileguard", "precompileguard"},
              PKG + "precompileguard": set(), PKG + "podcontract": set(), PKG + "triton_modules": set()}


@pytest.mark.parametrize(
    "module", [harness, compilekey, compilestep, podcontract, triton_modules, pytest.importorskip(PKG + "targets"),
               pytest.importorskip(PKG + "warmstart"), pytest.importorskip(PKG + "precompileguard"),
               precompileparts, stagelog]
)
def test_self_contained_modules_import_only_stdlib_and_torch(module: Any) -> None:
    """harness.py, compilekey.py, compilestep.py, podcontract.py, targets.py, warmstart.py, precompileguard.py,
    precompileparts.py and stagelog.py are copied into users' images:
    nothing else of ours, nothing else at all (they import each other from beside themselves, or from cachelib)."""
    import ast

    tree = ast.parse(Path(module.__file__).read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("cachelib", PKG.rstrip(".")):
                roots.update(f"{node.module}.{alias.name}" for alias in node.names)
            else:
                roots.add(node.module.split(".")[0])
    assert roots - set(sys.stdlib_module_names) <= {"torch", "triton"} | COMPANIONS[module.__name__], roots


@pytest.mark.slow
def test_built_in_targets_load_from_beside_the_harness_without_cachelib(tmp_path: Path) -> None:
    """In a user's image only the modules the warm-up Job copies (``warmup_job.COPY_HARNESS``, run for real) exist,
    side by side: short names and --precompile still work."""
    from compilecache_operator.decisions import warmup_job

    from cachelib.in_image import warmstart

    subprocess.run([sys.executable, "-c", warmup_job.COPY_HARNESS, str(tmp_path / "harness.py")], check=True)
    code = (
        "import sys; sys.modules['cachelib'] = None; import harness, compilestep; "
        "entries = compilestep.normalise_entries('tiny_mlp', compilestep.load_target('tiny_mlp')()); "
        "print(type(entries[0][0]).__name__, tuple(entries[0][1][0].shape), harness.load_warmstart().MANIFEST_NAME)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["TinyMLP", "(8,", "64)", warmstart.MANIFEST_NAME]


# -- what the harness says of the precompiled part ---------------------------------------------------------
def test_the_precompile_summary_is_one_line_per_entry_and_one_count() -> None:
    out = Path("/out")
    verified = {"check": {"verified": True, "entry_names": ["Llama", "Head"],
                          "first_call_seconds": {"precompiled": [0.41], "plain": [2.1]}},
                "pass": {"dropped_guards": 118}}  # fmt: skip
    assert precompileparts.precompile_summary(verified, out) == [
        "precompile: entry 0 (Llama): verified, shipped",
        "precompile: entry 1 (Head): verified, shipped",
        "precompile: first call 0.41 s with the part, 2.10 s without",
        "precompile: caching precompile dropped 118 guard(s) it cannot save (each in /out/warmup.log)",
    ]
    left_out = {"check": {"verified": False, "reason": "Dynamo compiled 1 frame(s) afresh", "entry_names": ["A", "B"],
                          "problems": ["entry 1: out.logits: differ"],
                          "plain": {"verified": False, "reason": "missed 1 AOTAutograd lookup(s)"}}}  # fmt: skip
    assert precompileparts.precompile_summary(left_out, out) == [
        "precompile: entry 0 (A): left out: Dynamo compiled 1 frame(s) afresh",
        "precompile: entry 1 (B): left out: out.logits: differ",
        "precompile: a pod without warm_start() would not start warm: missed 1 AOTAutograd lookup(s)",
    ]


def test_dropped_guard_warnings_are_counted_and_kept_out_of_the_output(tmp_path: Path) -> None:
    import logging

    log = logging.getLogger("torch._dynamo.guards.test")
    caught: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: caught.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    dropped = precompileparts.DroppedGuards(tmp_path / precompileparts.LOG_FILE)
    log.addFilter(dropped)
    try:
        for index in range(3):
            log.warning("CLOSURE_MATCH guard on G['m'].f%d is dropped with caching_precompile=True.", index)
        log.warning("something else")
    finally:
        log.removeFilter(dropped)
        log.removeHandler(handler)
    assert dropped.count == 3 and caught == ["something else"]
    assert (tmp_path / harness.LOG_FILE).read_text().count("is dropped with caching_precompile=True") == 3
