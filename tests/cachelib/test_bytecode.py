"""Byte code as a bundle part (cachelib.in_image.bytecode): what is compiled, where Python finds it, and
that a changed source is never run stale.

Real interpreters throughout: a module tree written here, compiled into a
``PYTHONPYCACHEPREFIX`` tree, then imported by fresh processes with ``PYTHONDONTWRITEBYTECODE=1``
(as the pods of such images run) and ``-X importtime``-free checks of which file Python used."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from cachelib.in_image import bytecode


def write_package(root: Path, value: int = 1) -> Path:
    pkg = root / "zoopkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(f"VALUE = {value}\n")
    return pkg / "mod.py"


def fresh(root: Path, prefix: Path | None, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    if prefix is not None:
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_imported_sources_are_the_loaded_python_files(tmp_path: Path) -> None:
    source = write_package(tmp_path)
    root = str(Path(bytecode.__file__).parents[1])
    code = (
        f"import sys; sys.path.insert(0, {root!r}); import json, zoopkg.mod; from cachelib.in_image import bytecode; "
        "print(json.dumps([str(p) for p in bytecode.imported_sources()]))"
    )
    found = json.loads(fresh(tmp_path, None, code))
    assert str(source) in found and str(tmp_path / "zoopkg" / "__init__.py") in found
    assert any(p.endswith("/json/__init__.py") for p in found), "standard-library modules are part of it"
    assert all(p.endswith(".py") for p in found)


def test_the_tree_is_where_python_looks_and_python_uses_it(tmp_path: Path) -> None:
    source = write_package(tmp_path)
    cache = tmp_path / "cache"
    tree = bytecode.write_tree([source, source.with_name("__init__.py")], cache)
    assert tree.files == 2 and tree.skipped is None and tree.bytes > 0
    prefix = cache / bytecode.PYCACHE_DIR
    pyc = bytecode.bytecode_path(source, prefix)
    assert pyc.is_file() and str(pyc).startswith(str(prefix) + str(source.parent))
    assert bytecode.valid_bytecode(source, pyc)
    manifest = bytecode.read_manifest(cache)
    assert manifest is not None and manifest["files"] == 2 and manifest["cache_tag"] == sys.implementation.cache_tag
    # Python takes the module from the tree: poison the source's code object in the pyc to tell
    poisoned = tmp_path / "poisoned.py"
    poisoned.write_text("VALUE = 'from the tree'\n")
    py_compile.compile(str(poisoned), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    assert fresh(tmp_path, prefix, "import zoopkg.mod as m; print(m.VALUE)") == "from the tree"


def test_a_changed_source_is_recompiled_never_run_stale(tmp_path: Path) -> None:
    source = write_package(tmp_path, value=1)
    cache = tmp_path / "cache"
    bytecode.write_tree([source], cache)
    prefix = cache / bytecode.PYCACHE_DIR
    assert fresh(tmp_path, prefix, "import zoopkg.mod as m; print(m.VALUE)") == "1"
    stat = source.stat()
    source.write_text("VALUE = 2\n")  # same size ...
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... and the same modification time
    assert not bytecode.valid_bytecode(source, bytecode.bytecode_path(source, prefix))
    assert fresh(tmp_path, prefix, "import zoopkg.mod as m; print(m.VALUE)") == "2"


def test_the_tree_holds_only_checked_pycs(tmp_path: Path) -> None:
    source = write_package(tmp_path)
    bytecode.write_tree([source], tmp_path / "cache")
    header = bytecode.bytecode_path(source, tmp_path / "cache" / bytecode.PYCACHE_DIR).read_bytes()[:16]
    flags = int.from_bytes(header[4:8], "little")
    assert flags == 0b11, "a checked-hash pyc (PEP 552): Python hashes the source at every import"


def test_an_image_with_its_own_byte_code_ships_none(tmp_path: Path) -> None:
    sources = [write_package(tmp_path / f"p{i}") for i in range(10)]
    for source in sources:
        py_compile.compile(str(source), cfile=str(bytecode.bytecode_path(source, None)))
    assert bytecode.image_has_bytecode(sources) == (True, 10, 10)
    tree = bytecode.write_tree(sources, tmp_path / "cache")
    assert tree.files == 0 and tree.skipped == "the image carries byte code for 10 of 10 imported modules"
    assert not (tmp_path / "cache" / bytecode.PYCACHE_DIR).exists()


def test_an_image_whose_byte_code_lives_under_its_own_prefix_ships_none(tmp_path: Path) -> None:
    """An image built with ``ENV PYTHONPYCACHEPREFIX`` keeps its byte code there: what the process's imports
    read is what counts, in a fresh interpreter that has the image's prefix set."""
    sources = [write_package(tmp_path / f"p{i}") for i in range(10)]
    prefix = tmp_path / "image-pycache"
    for source in sources:
        py_compile.compile(str(source), cfile=str(bytecode.bytecode_path(source, prefix)))
    code = (
        "import json; from pathlib import Path; from cachelib.in_image import bytecode; "
        f"print(json.dumps(bytecode.image_has_bytecode([Path(p) for p in {[str(s) for s in sources]!r}])))"
    )
    root = Path(bytecode.__file__).resolve().parents[1]
    assert json.loads(fresh(root, prefix, code)) == [True, 10, 10]
    assert json.loads(fresh(root, None, code)) == [False, 0, 10]  # the same image without its prefix


def test_stale_or_foreign_byte_code_beside_a_source_does_not_count(tmp_path: Path) -> None:
    source = write_package(tmp_path)
    pyc = bytecode.bytecode_path(source, None)
    py_compile.compile(str(source), cfile=str(pyc))
    assert bytecode.valid_bytecode(source, pyc)
    source.write_text("VALUE = 12345\n")
    assert not bytecode.valid_bytecode(source, pyc)
    pyc.write_bytes(b"\0" * 32)
    assert not bytecode.valid_bytecode(source, pyc)
    assert not bytecode.valid_bytecode(source, tmp_path / "absent.pyc")


@pytest.mark.parametrize("text", ["", "{", '{"format": 9}', "[]"])
def test_an_unreadable_manifest_reads_as_no_tree(tmp_path: Path, text: str) -> None:
    (tmp_path / bytecode.PYCACHE_DIR).mkdir()
    (tmp_path / bytecode.PYCACHE_DIR / bytecode.MANIFEST_NAME).write_text(text)
    assert bytecode.read_manifest(tmp_path) is None
