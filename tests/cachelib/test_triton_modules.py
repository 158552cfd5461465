"""Triton's compiled C modules as a bundle part (cachelib.in_image.triton_modules): collected after the warm-up,
installed where the pod's Triton looks, and then loaded without a C compiler.

The end-to-end tests run Triton's own module builder (``triton.runtime.build.compile_module_from_src``,
Triton 3.9 from ``$COMPILECACHE_TEST_TRITON``, installed by scripts/test.sh beside no torch) in fresh
processes, each with its own HOME as a new container has: a warm-up process that builds a module with
gcc, then a pod process whose PATH holds no C compiler. No GPU is needed to build or load such a module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.in_image import triton_modules
from testsupport import unavailable

COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "cpp")

MODULE_SOURCE = """
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(%d); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%s", NULL, -1, methods};
PyMODINIT_FUNC PyInit_%s(void) { return PyModule_Create(&module); }
"""

BUILD = """
import json, sys
from triton.runtime.build import compile_module_from_src
name, value = sys.argv[1], int(sys.argv[2])
try:
    module = compile_module_from_src(sys.argv[3] % (value, name, name), name)
    print(json.dumps({"answer": module.answer(), "file": module.__file__}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def triton_path() -> Path:
    path = Path(os.environ.get("COMPILECACHE_TEST_TRITON", Path.home() / ".cache/compilecache-test/triton-3.9.0"))
    if not (path / "triton" / "runtime" / "build.py").is_file():
        unavailable(f"Triton's package is not at {path} (scripts/test.sh installs it)")
    return path


def path_without_compilers(where: Path) -> str:
    """A directory of links to every program on PATH but the C and C++ compilers: an image without one."""
    where.mkdir(parents=True, exist_ok=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not directory or not Path(directory).is_dir():
            continue
        for program in Path(directory).iterdir():
            name = program.name
            if name in COMPILERS or name.startswith(("gcc", "g++", "clang", "x86_64-linux-gnu-g")):
                continue
            if not (where / name).exists() and os.access(program, os.X_OK):
                (where / name).symlink_to(program)
    return str(where)


def build_in_fresh_process(home: Path, name: str, value: int, path: str | None = None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "CC", "CXX"))}
    env.update(HOME=str(home), PYTHONPATH=str(triton_path()))
    if path is not None:
        env["PATH"] = path
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, name, str(value), MODULE_SOURCE],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_pod_without_a_c_compiler_loads_the_warm_ups_modules(tmp_path: Path) -> None:
    warm_up = build_in_fresh_process(tmp_path / "warm-up-home", "cuda_utils", 42)
    assert warm_up == {"answer": 42, "file": warm_up["file"]}, warm_up
    cache = tmp_path / "cache"
    collected = triton_modules.collect(cache, {"HOME": str(tmp_path / "warm-up-home")})
    assert collected.files == 1 and collected.to_dict()["modules"] == [f"cuda_utils{triton_modules.extension_suffix()}"]

    bare = path_without_compilers(tmp_path / "bin")
    without = build_in_fresh_process(tmp_path / "cold-home", "cuda_utils", 42, path=bare)
    assert "error" in without and "compiler" in str(without["error"]).lower(), without  # what the part saves

    pod_home = tmp_path / "pod-home"
    installed = triton_modules.install(cache, {"HOME": str(pod_home)})
    assert (installed.placed, installed.problems) == (1, [])
    pod = build_in_fresh_process(pod_home, "cuda_utils", 42, path=bare)
    assert pod["answer"] == 42 and str(pod["file"]).startswith(str(pod_home / ".triton" / "cache")), pod


def test_another_source_is_another_key_so_a_shipped_module_is_never_taken_for_it(tmp_path: Path) -> None:
    build_in_fresh_process(tmp_path / "warm-up-home", "cuda_utils", 1)
    cache = tmp_path / "cache"
    triton_modules.collect(cache, {"HOME": str(tmp_path / "warm-up-home")})
    pod_home = tmp_path / "pod-home"
    triton_modules.install(cache, {"HOME": str(pod_home)})
    changed = build_in_fresh_process(pod_home, "cuda_utils", 2)  # a changed source (another Triton): built anew
    assert changed["answer"] == 2


def write_triton_cache(root: Path, modules: dict[str, bytes]) -> None:
    for name, data in modules.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


KEYS = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=8, max_size=52)
NAMES = st.sampled_from(["cuda_utils", "hip_utils", "__triton_launcher", "some_module"])


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.tuples(KEYS, NAMES), st.binary(min_size=1, max_size=64), min_size=1, max_size=6))
def test_collect_then_install_puts_every_module_where_triton_looks(
    tmp_path_factory: pytest.TempPathFactory, modules: dict[tuple[str, str], bytes]
) -> None:
    tmp = tmp_path_factory.mktemp("mods")
    suffix = triton_modules.extension_suffix()
    files = {f"{key}/{name}{suffix}": data for (key, name), data in modules.items()}
    write_triton_cache(tmp / "warm-up" / ".triton" / "cache", files)
    # kernels and other files of Triton's cache are not modules: never shipped
    kernels = {"KERNELKEY/kernel.cubin": b"x", "KERNELKEY/k.json": b"{}"}
    write_triton_cache(tmp / "warm-up" / ".triton" / "cache", kernels)
    cache = tmp / "cache"
    collected = triton_modules.collect(cache, {"HOME": str(tmp / "warm-up")})
    assert collected.files == len(files)
    explicit = tmp / "explicit"
    for environ, root in (({"HOME": str(tmp / "pod")}, tmp / "pod" / ".triton" / "cache"),
                          ({"TRITON_HOME": str(tmp / "th"), "HOME": "/nonexistent"}, tmp / "th" / ".triton" / "cache"),
                          ({"TRITON_CACHE_DIR": str(explicit)}, explicit)):  # fmt: skip
        done = triton_modules.install(cache, environ)
        assert (done.placed, done.problems) == (len(files), [])
        assert {str(p.relative_to(root)) for p in root.rglob(f"*{suffix}")} == set(files)
        assert all((root / name).read_bytes() == data for name, data in files.items())
        assert triton_modules.install(cache, environ).present == len(files)  # a second call changes nothing


def test_a_module_already_there_is_kept_and_an_unwritable_place_is_reported(tmp_path: Path) -> None:
    suffix = triton_modules.extension_suffix()
    write_triton_cache(tmp_path / "warm-up" / ".triton" / "cache", {f"KEY/cuda_utils{suffix}": b"shipped"})
    cache = tmp_path / "cache"
    triton_modules.collect(cache, {"HOME": str(tmp_path / "warm-up")})
    own = tmp_path / "pod" / ".triton" / "cache" / "KEY" / f"cuda_utils{suffix}"
    write_triton_cache(tmp_path / "pod" / ".triton" / "cache", {f"KEY/cuda_utils{suffix}": b"built here"})
    done = triton_modules.install(cache, {"HOME": str(tmp_path / "pod")})
    assert (done.placed, done.present) == (0, 1) and own.read_bytes() == b"built here"
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    done = triton_modules.install(cache, {"TRITON_CACHE_DIR": str(blocked)})
    assert done.placed == 0 and len(done.problems) == 1 and str(blocked) in done.problems[0]


@pytest.mark.parametrize(
    "manifest",
    ["", "{", '{"format": 9}', '{"format": 1, "suffix": ".cpython-399-x.so", "modules": ["K/m.so"]}',
     '{"format": 1, "suffix": "SUFFIX", "modules": ["../../etc/x.so", "K/../y.so", ".hidden/m.so", "K/m/n.so"]}'],
)  # fmt: skip
def test_an_unreadable_foreign_or_unsafe_part_installs_nothing(tmp_path: Path, manifest: str) -> None:
    part = tmp_path / "cache" / triton_modules.PART_DIR
    part.mkdir(parents=True)
    (part / triton_modules.MANIFEST_NAME).write_text(manifest.replace("SUFFIX", triton_modules.extension_suffix()))
    done = triton_modules.install(tmp_path / "cache", {"HOME": str(tmp_path / "pod")})
    assert (done.placed, done.present, done.problems) == (0, 0, [])
    assert not (tmp_path / "pod").exists()
