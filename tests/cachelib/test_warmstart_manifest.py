"""The warm-start manifest and its levers (cachelib.in_image.warmstart, cachelib.runtime.warm_start).

Fast tests cover the pure parts and every way a manifest is refused; the slow ones run the
real path on the CPU: a warm-up with ``--precompile auto``, publish, preload into an empty
directory, then fresh processes that compile the same transformer block, comparing outputs
with eager and reading torch's counters (Dynamo cache hits, no frame compiled)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachelib.in_image import harness, precompileguard, warmstart
from tests.cachelib.helpers import ROOT, last_json, run_cli

HERE_VERSIONS = {"torch": "2.13.0", "triton": "none", "python": "3.11.2", "platform": "linux-x86_64"}
HERE_INSTALLATION = {"torch": "a" * 64, "triton": "none"}


def manifest(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "format": 1,
        "versions": dict(HERE_VERSIONS),
        "installation": dict(HERE_INSTALLATION),
        "source_keys": {"torch_key": "00" * 32, "triton_key": None},
        "dynamo_precompile": True,
    }
    value.update(changes)
    return value


# -- pure parts ----------------------------------------------------------------------------------------
def test_the_same_installation_has_no_mismatch() -> None:
    assert warmstart.mismatches(manifest(), HERE_VERSIONS, HERE_INSTALLATION) == []


@pytest.mark.parametrize("field", ["torch", "triton", "python", "platform"])
def test_every_version_difference_is_named(field: str) -> None:
    theirs = manifest(versions={**HERE_VERSIONS, field: "other"})
    found = warmstart.mismatches(theirs, HERE_VERSIONS, HERE_INSTALLATION)
    assert len(found) == 1 and found[0].startswith(f"{field} 'other' in the warm-up"), found


@pytest.mark.parametrize("package", ["torch", "triton"])
def test_other_installed_files_are_a_mismatch_even_with_equal_versions(package: str) -> None:
    theirs = manifest(installation={**HERE_INSTALLATION, package: "b" * 64})
    assert warmstart.mismatches(theirs, HERE_VERSIONS, HERE_INSTALLATION) == [
        f"the installed {package} files differ from the warm-up's"
    ]


def test_tree_digest_follows_sizes_and_times_but_not_byte_code(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pkg" / "include").mkdir()
    source = tmp_path / "pkg" / "mod.py"
    source.write_text("x = 1\n")
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))
    before = warmstart.tree_digest(tmp_path)
    (tmp_path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "mod.pyc").write_bytes(b"\0")
    (tmp_path / "pkg" / "include" / "a.h").write_text("/* headers enter no graph's key */")
    assert warmstart.tree_digest(tmp_path) == before
    source.write_text("x = 2\n")  # same size, another time
    assert warmstart.tree_digest(tmp_path) != before
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))
    assert warmstart.tree_digest(tmp_path) == before
    source.write_text("x = 22\n")  # another size, same time
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))
    assert warmstart.tree_digest(tmp_path) != before


def test_installation_of_a_missing_package_is_none() -> None:
    assert warmstart.installation(["compilecache_no_such_package"]) == {"compilecache_no_such_package": "none"}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not JSON"),
        ("[1]", "not a JSON object"),
        (json.dumps(manifest(format=2)), "format 2, this reader knows 1"),
        (json.dumps({k: v for k, v in manifest().items() if k != "installation"}), "'installation' missing"),
        (json.dumps(manifest(dynamo_precompile="yes")), "'dynamo_precompile' missing or not a bool"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / warmstart.MANIFEST_NAME).write_text(text)
    with pytest.raises(warmstart.ManifestError, match=match) as info:
        warmstart.read_manifest(tmp_path)
    assert str(tmp_path / warmstart.MANIFEST_NAME) in str(info.value)


def test_no_manifest_reads_as_none(tmp_path: Path) -> None:
    assert warmstart.read_manifest(tmp_path) is None


# -- prepare() in this process: only the refusals (the levers themselves run in fresh processes) --------
@pytest.fixture
def dynamo_config() -> Iterator[Any]:
    import torch._dynamo.config as config

    with config.patch(caching_precompile=True):  # as TORCH_CACHING_PRECOMPILE=1 would
        yield config


def test_prepare_without_a_cache_dir_changes_nothing(dynamo_config: Any) -> None:
    done = warmstart.prepare(env={})
    assert done.applied == [] and "TORCHINDUCTOR_CACHE_DIR" in done.declined[0]
    assert dynamo_config.caching_precompile is True


def test_prepare_without_a_manifest_says_so(tmp_path: Path, dynamo_config: Any) -> None:
    done = warmstart.prepare(tmp_path)
    assert done.applied == [] and not done.manifest
    assert done.declined == [f"no {warmstart.MANIFEST_NAME} in {tmp_path}: the bundle was made without precompile"]


def test_prepare_with_a_damaged_manifest_turns_caching_precompile_off(tmp_path: Path, dynamo_config: Any) -> None:
    (tmp_path / warmstart.MANIFEST_NAME).write_text("{")
    done = warmstart.prepare(tmp_path)
    assert done.applied == [] and "not JSON" in done.declined[0]
    assert dynamo_config.caching_precompile is False


def test_prepare_with_a_foreign_manifest_applies_nothing(tmp_path: Path, dynamo_config: Any) -> None:
    warmstart.write_manifest(tmp_path, manifest(versions={**HERE_VERSIONS, "torch": "0.0.1"}))
    done = warmstart.prepare(tmp_path)
    assert done.manifest and done.applied == []
    assert any(reason.startswith("torch '0.0.1' in the warm-up") for reason in done.declined), done.declined
    assert dynamo_config.caching_precompile is False


# -- the real path on the CPU ----------------------------------------------------------------------------
TARGET = "transformer_block"
WORKLOAD = """
import json, sys
import torch
from cachelib import runtime
from cachelib.in_image import targets
prepared = runtime.warm_start().to_dict() if sys.argv[1] == "call" else None
model, args = targets.{target}()[0]
compiled = torch.compile(model)
with torch.no_grad():
    got = compiled(*args)
    again = compiled(*args)
    want = model(*args)
from torch._dynamo.utils import counters
print(json.dumps({{
    "prepared": prepared,
    "max_abs_diff": float((got - want).abs().max()),
    "allclose": bool(torch.allclose(got, want, rtol=1e-4, atol=1e-5) and torch.equal(got, again)),
    "counters": {{g: dict(counters[g]) for g in ("dynamo_cache", "frames", "inductor", "aot_autograd")}},
}}))
"""


def run_workload(
    cache_dir: Path, how: str, env: dict[str, str] | None = None, code: str = WORKLOAD.format(target=TARGET)
) -> dict[str, Any]:
    """A fresh process that compiles the target against ``cache_dir``: ``call`` makes the runtime call."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TORCH_CACHING"))}
    environ.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-c", code, how],
        capture_output=True, text=True, env=environ, cwd=ROOT, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)


def warm_up_and_preload(work: Path, target: str, *flags: str) -> Path:
    """A warm-up with --precompile auto, published to a file store and preloaded into an empty dir."""
    out = work / "out"
    proc = subprocess.run(
        [sys.executable, harness.__file__, "--target", target, "--out", str(out),
         "--namespace", "default", "--name", "pre", "--precompile", "auto", *flags],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["options"]["precompile"] == "auto"
    assert result["precompile"]["dynamo_entries"] >= 1, result["precompile"]
    store = f"file://{work / 'store'}"
    assert run_cli("publish", str(out), "--store", store).returncode == 0
    target = work / "pod-cache"
    pre = run_cli("preload", "--store", store, "--key", result["key_string"], "--target", str(target), "--strict")
    assert pre.returncode == 0, pre.stderr
    assert last_json(pre.stdout)["result"] == "hit"
    return target


@pytest.fixture(scope="module")
def preloaded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return warm_up_and_preload(tmp_path_factory.mktemp("precompile"), TARGET)


def fresh_copy(preloaded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache"
    shutil.copytree(preloaded, copy)
    return copy


@pytest.mark.slow
def test_preload_lays_down_the_manifest_and_dynamo_entries(preloaded: Path) -> None:
    manifest = warmstart.read_manifest(preloaded)
    assert manifest is not None and manifest["dynamo_precompile"] is True
    assert warmstart.mismatches(manifest, warmstart.versions(), warmstart.installation()) == []
    assert warmstart.dynamo_entries(preloaded) >= 1


@pytest.mark.slow
def test_the_runtime_call_loads_dynamo_entries_and_matches_eager(preloaded: Path, tmp_path: Path) -> None:
    seen = run_workload(fresh_copy(preloaded, tmp_path), "call")
    assert seen["allclose"], seen
    assert seen["prepared"]["declined"] == [], seen["prepared"]
    assert {"torch_key", "triton_key", "caching_precompile", "lazy_compile_pool"} <= set(seen["prepared"]["applied"])
    assert seen["counters"]["dynamo_cache"] == {"dynamo_cache_hit": 1}, seen["counters"]
    assert seen["counters"]["frames"] == {}, "Dynamo traced a frame: the precompiled entry was not used"


@pytest.mark.slow
def test_the_environment_alone_compiles_on_the_bundles_off_entries(preloaded: Path, tmp_path: Path) -> None:
    """What the webhook gives a pod (no caching precompile): every FX-graph and AOTAutograd lookup hits,
    as in a pod of a bundle made with Off (caching precompile's own AOTAutograd entries are keyed on a
    backend id no other process reproduces: the harness's first pass wrote the ones this pod finds)."""
    seen = run_workload(fresh_copy(preloaded, tmp_path), "none")
    assert seen["allclose"], seen
    counters = seen["counters"]
    assert counters["dynamo_cache"] == {}, counters
    assert counters["inductor"].get("fxgraph_cache_hit", 0) >= 1 and not counters["inductor"].get("fxgraph_cache_miss")
    assert counters["aot_autograd"].get("autograd_cache_hit", 0) >= 1, counters
    assert not counters["aot_autograd"].get("autograd_cache_miss"), counters


@pytest.mark.slow
def test_a_foreign_installation_falls_back_to_an_ordinary_compile(preloaded: Path, tmp_path: Path) -> None:
    cache = fresh_copy(preloaded, tmp_path)
    theirs = json.loads((cache / warmstart.MANIFEST_NAME).read_text())
    theirs["installation"]["torch"] = "0" * 64  # the same versions, other files
    theirs["source_keys"]["torch_key"] = "ff" * 32  # would poison every key if it were used
    (cache / warmstart.MANIFEST_NAME).write_text(json.dumps(theirs))
    seen = run_workload(cache, "call", env={"TORCH_CACHING_PRECOMPILE": "1"})
    assert seen["allclose"], seen
    assert seen["prepared"]["applied"] == []
    assert seen["prepared"]["declined"] == ["the installed torch files differ from the warm-up's"]
    assert seen["counters"]["dynamo_cache"] == {}, "caching precompile stayed on"
    assert seen["counters"]["frames"].get("ok") == 1  # traced and compiled as without compilecache


HAND_OVER = """
import json, sys
import triton, triton.runtime.cache, triton.runtime.autotuner
from cachelib.in_image import warmstart
value = sys.argv[1].replace("VERSION", triton.__version__)
if sys.argv[2] == "computed":
    triton.runtime.cache.triton_key()
done = warmstart.Prepared()
warmstart.hand_over_triton_key(value, done)
from torch._inductor import codecache
from torch._inductor.runtime import triton_compat  # imported after the hand-over: takes it from triton
print(json.dumps({
    "done": done.to_dict(),
    "seen": [triton.runtime.cache.triton_key(), triton.runtime.autotuner.triton_key(), triton_compat.triton_key(),
             codecache.triton_key()],
    "key_of_a_kernel": triton.runtime.cache.get_cache_key.__globals__["triton_key"](),
}))
"""


def hand_over(value: str, when: str = "fresh") -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", HAND_OVER, value, when],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)


@pytest.mark.slow
def test_tritons_own_key_is_handed_over_wherever_it_is_called() -> None:
    """Triton hashes its files the first time a kernel is set up; handed over, every caller sees the value."""
    seen = hand_over("VERSIONwarm-up")
    assert seen["done"]["applied"] == ["triton_key"] and seen["done"]["declined"] == [], seen
    value = seen["seen"][0]
    assert value.endswith("warm-up") and seen["seen"] == [value] * 4 and seen["key_of_a_kernel"] == value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("value", "when", "reason"),
    [
        ("0.0.0warm-up", "fresh", "the warm-up's key is not for Triton"),
        ("VERSIONwarm-up", "computed", "already computed in this process"),
    ],
)
def test_tritons_key_is_not_handed_over_when_it_cannot_be_right(value: str, when: str, reason: str) -> None:
    seen = hand_over(value, when)
    assert seen["done"]["applied"] == [], seen
    assert seen["done"]["declined"][0].startswith(f"triton_key: {reason}"), seen
    assert not any(key.endswith("warm-up") for key in seen["seen"]), "Triton's own hash was replaced"


def test_the_runtime_call_waits_for_a_preload_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo looks its entry up at torch.compile: in Sidecar mode the preload must be done first."""
    from cachelib import handoff, runtime

    done = tmp_path / handoff.DONE_FILE_NAME
    handoff.write_done(done, {"result": "hit"})
    monkeypatch.setenv(handoff.DONE_FILE_ENV, str(done))
    monkeypatch.setattr(handoff, "last_wait", None)
    prepared = runtime.warm_start(str(tmp_path))
    assert handoff.last_wait is not None and handoff.last_wait.result == "hit"
    assert prepared.cache_dir == str(tmp_path) and prepared.applied == []


def test_the_levers_applied_are_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    from cachelib import runtime

    monkeypatch.setattr(warmstart, "last_prepared", warmstart.Prepared(applied=["torch_key", "caching_precompile"]))
    text = runtime.metrics_text()
    assert 'compilecache_runtime_warm_start_levers{lever="torch_key"} 1.0' in text
    assert 'compilecache_runtime_warm_start_levers{lever="caching_precompile"} 1.0' in text


TRAINING = """
import json
import torch
from cachelib import runtime
from cachelib.in_image import targets
prepared = runtime.warm_start().to_dict()
model, args = targets.tiny_mlp()[0]
compiled = torch.compile(model)
got = compiled(*args)
got.sum().backward()
grads = [p.grad.clone() for p in model.parameters()]
model.zero_grad()
want = model(*args)
want.sum().backward()
same = torch.allclose(got, want, atol=1e-5) and all(
    torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, model.parameters())
)
from torch._dynamo.utils import counters
print(json.dumps({"prepared": prepared, "same": bool(same),
                  "counters": {g: dict(counters[g]) for g in ("dynamo_cache", "frames")}}))
"""


@pytest.mark.slow
def test_a_training_step_loads_forward_and_backward_and_matches_eager(tmp_path: Path) -> None:
    seen = run_workload(warm_up_and_preload(tmp_path, "tiny_mlp", "--backward"), "call", code=TRAINING)
    assert seen["same"], seen
    assert "caching_precompile" in seen["prepared"]["applied"]
    assert seen["counters"] == {"dynamo_cache": {"dynamo_cache_hit": 1}, "frames": {}}, seen["counters"]


def test_this_torch_lets_its_compile_pool_wait_and_the_lever_keeps_a_workload_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert warmstart.warm_pool_problem() is None  # the installed torch is one of the proven releases
    monkeypatch.delenv(warmstart.WARM_POOL_ENV, raising=False)
    done = warmstart.Prepared()
    warmstart.defer_compile_pool(done, {})
    assert done.applied == ["lazy_compile_pool"] and os.environ[warmstart.WARM_POOL_ENV] == "0"
    kept = warmstart.Prepared()
    warmstart.defer_compile_pool(kept, {warmstart.WARM_POOL_ENV: "1"})
    assert kept.applied == [] and "set by the workload" in kept.declined[0]


def test_a_torch_outside_the_proven_range_keeps_its_compile_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "__version__", "2.99.0")
    assert "outside" in str(warmstart.warm_pool_problem())
    monkeypatch.delenv(warmstart.WARM_POOL_ENV, raising=False)
    done = warmstart.Prepared()
    warmstart.defer_compile_pool(done, {})
    assert done.applied == [] and warmstart.WARM_POOL_ENV not in os.environ


@pytest.mark.slow
def test_a_global_state_set_after_the_call_fails_the_entrys_guards_and_compiles_afresh_without_crashing(
    preloaded: Path, tmp_path: Path
) -> None:
    """Set after ``warm_start()``, a setting cannot decline the part: the entry loads, its guards fail and
    Dynamo compiles the frame afresh. The loaded entry's names come from the warm-up's process; the
    recompile must not reuse them (torch 2.11-2.14 failed the first call with ``Name '__builtins_dict___0'
    already exists in scope``)."""
    before = "compiled = torch.compile(model)"
    code = WORKLOAD.format(target=TARGET).replace(before, f"torch.use_deterministic_algorithms(True)\n{before}")
    seen = run_workload(fresh_copy(preloaded, tmp_path), "call", code=code)
    assert seen["allclose"], seen
    assert seen["counters"]["dynamo_cache"] == {"dynamo_cache_hit": 1}, seen["counters"]
    assert seen["counters"]["frames"].get("ok") == 1, seen["counters"]


@pytest.mark.slow
def test_a_global_state_known_at_the_call_declines_the_part_by_name(preloaded: Path, tmp_path: Path) -> None:
    """One intra-op thread, as torchrun sets it: ``warm_start()`` sees it, leaves caching precompile off and
    names the setting with both values; the pod compiles as with Off."""
    seen = run_workload(fresh_copy(preloaded, tmp_path), "call", env={"OMP_NUM_THREADS": "1"})
    assert seen["allclose"], seen
    declined = [d for d in seen["prepared"]["declined"] if d.startswith("caching_precompile:")]
    assert declined and "num_threads 1 here" in declined[0] and "in the warm-up" in declined[0], seen["prepared"]
    assert seen["counters"]["dynamo_cache"] == {}, seen["counters"]


@given(
    warmup=st.dictionaries(st.sampled_from(["num_threads", "default_dtype", "deterministic_algorithms", "allow_tf32"]),
                           st.one_of(st.integers(1, 64), st.booleans(), st.sampled_from(["float32", "bfloat16"]))),
    changed=st.sets(st.sampled_from(["num_threads", "default_dtype", "deterministic_algorithms", "allow_tf32"])),
)
def test_each_differing_global_setting_is_named_with_both_values(warmup: dict[str, Any], changed: set[str]) -> None:
    here = {k: (f"other-{v}" if k in changed else v) for k, v in warmup.items()}
    found = warmstart.global_state_differences(warmup, here)
    assert len(found) == len(changed & set(warmup))
    for line in found:
        name = line.split(" ", 1)[0]
        assert name in changed and f"{here[name]!r} here, {warmup[name]!r} in the warm-up" in line
    assert warmstart.global_state_differences(None, here) == [] == warmstart.global_state_differences(warmup, None)


def test_this_process_says_its_global_state_without_the_per_call_settings() -> None:
    import torch

    state = warmstart.global_state()
    assert state is not None and state["num_threads"] == torch.get_num_threads()
    assert state["default_dtype"] == "float32" and not set(state) & warmstart.PER_CALL_STATE


def test_dynamo_names_from_another_process_move_the_counter_forward_only() -> None:
    from torch._dynamo import bytecode_transformation

    names = ["__builtins_dict___7", "__compiled_fn_3_0b1c2d3e_4f50_6172_8394_a5b6c7d8e9f0", "__resume_at_30_2", "x_99"]
    assert precompileguard.highest_unique_id(names) == 7
    assert precompileguard.highest_unique_id(["plain", "__no_number_"]) == -1
    start = int(bytecode_transformation.unique_id("probe").rsplit("_", 1)[1])
    precompileguard.advance_unique_ids([dict.fromkeys(names)])
    after = int(bytecode_transformation.unique_id("probe").rsplit("_", 1)[1])
    assert after >= max(start + 1, 8)
    precompileguard.advance_unique_ids([{"__builtins_dict___0": None}])  # never backwards
    assert int(bytecode_transformation.unique_id("probe").rsplit("_", 1)[1]) == after + 1
