"""The layering of the product, read from its imports (every ``import`` anywhere in a module, lazy ones included):

- the modules the warm-up Job copies into the user's image (``COPY_HARNESS`` of the operator's warm-up Job) import
  only the standard library, torch (and Triton, which torch brings) and each other: the image has nothing else;
- ``cachelib`` never imports Kubernetes clients, Kopf or the operator: it runs in pods and on laptops;
- the operator never imports torch, Triton or a model library: it runs in a small image without them;
- each operator module belongs to one room of docs/operator.md's map, and imports only the rooms its rule names;
  the pure rooms import no I/O library.

A planted wrong import is found by the same reading (the last tests).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from compilecache_operator.decisions import warmup_job

ROOT = Path(__file__).resolve().parents[1]
CACHELIB = ROOT / "cachelib"
IN_IMAGE = CACHELIB / "in_image"
IN_IMAGE_PACKAGE = "cachelib.in_image"
OPERATOR = ROOT / "operator" / "compilecache_operator"
IN_IMAGE_THIRD_PARTY = frozenset({"torch", "triton"})
NOT_IN_CACHELIB = frozenset({"kubernetes", "kubernetes_asyncio", "kopf", "compilecache_operator", "pykube"})
NOT_IN_OPERATOR = frozenset({"torch", "triton", "transformers", "timm", "torchvision", "vllm", "numpy"})
MAP = ROOT / "docs" / "operator.md"
MAY_IMPORT = {
    "model": {"model"},
    "decisions": {"model", "decisions"},
    "edge": {"model", "decisions", "edge"},
    "controller": {"model", "decisions", "edge", "controller"},
    "admission": {"model", "decisions", "edge", "admission"},
    "top": {"model", "decisions", "edge", "controller", "admission", "top"},
}
"""The rooms a room's modules may import, as docs/operator.md's rules say."""
PURE = frozenset({"model", "decisions"})
IO_LIBRARIES = frozenset({"aiohttp", "kopf", "yaml", "prometheus_client", "cryptography", "kubernetes", "asyncio",
                          "socket", "ssl", "subprocess", "threading", "http", "urllib.request"})  # fmt: skip


def in_image_modules() -> list[str]:
    """The cachelib modules the warm-up Job copies beside the harness, as its command names them."""
    names = re.findall(r"'(\w+)'", warmup_job.COPY_HARNESS.split("for m in", 1)[1])
    assert "harness" in names and len(names) > 5, warmup_job.COPY_HARNESS
    return names


def imported(source: str) -> set[str]:
    """Every module name an import statement of ``source`` names (relative ones as ``.name``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.add("." + (node.module or ""))
            elif node.module and node.module.split(".")[0] in ("cachelib", "compilecache_operator"):
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif node.module:
                found.add(node.module)
    return found


def outside_the_image(names: Iterable[str], companions: Iterable[str]) -> list[str]:
    """What an in-image module may not import: anything but the standard library, torch and Triton, and its
    companions (by their cachelib name, or bare as copied beside each other)."""
    allowed = set(companions)
    wrong = []
    for name in names:
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in IN_IMAGE_THIRD_PARTY or top == "__future__":
            continue
        if name in allowed or (name.startswith(IN_IMAGE_PACKAGE + ".") and name.split(".")[2] in allowed):
            continue
        wrong.append(name)
    return sorted(wrong)


def forbidden(names: Iterable[str], tops: frozenset[str]) -> list[str]:
    return sorted(name for name in names if name.split(".")[0] in tops)


@pytest.mark.parametrize("module", in_image_modules())
def test_what_runs_in_the_users_image_imports_the_standard_library_and_torch_only(module: str) -> None:
    names = imported((IN_IMAGE / f"{module}.py").read_text())
    assert not outside_the_image(names, in_image_modules()), f"cachelib/in_image/{module}.py imports {names}"


def test_the_in_image_package_is_what_the_warm_up_copies() -> None:
    """The folder's rule is the copy's: every module the Job copies is in it, and nothing else is."""
    assert {p.stem for p in IN_IMAGE.glob("*.py")} - {"__init__"} == set(in_image_modules())


@pytest.mark.parametrize("path", sorted(CACHELIB.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_cachelib_never_imports_kubernetes_kopf_or_the_operator(path: Path) -> None:
    assert not forbidden(imported(path.read_text()), NOT_IN_CACHELIB), path


@pytest.mark.parametrize("path", sorted(OPERATOR.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_operator_never_imports_torch_or_a_model_library(path: Path) -> None:
    assert not forbidden(imported(path.read_text()), NOT_IN_OPERATOR), path


def rooms(text: str | None = None) -> dict[str, str]:
    """Module → room, from the map's table in docs/operator.md (a module named twice fails here)."""
    found: dict[str, str] = {}
    for line in (text if text is not None else MAP.read_text()).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] not in MAY_IMPORT:
            continue
        for module in re.findall(r"`(\w+)`", cells[2]):
            assert module not in found, f"{module} is in two rooms of the map: {found[module]} and {cells[0]}"
            found[module] = cells[0]
    return found


def operator_imports(source: str) -> set[str]:
    """The operator's own modules ``source`` imports, by their bare name (a room's package imported whole, by the
    room's name)."""
    own = set()
    for name in imported(source):
        parts = name.split(".")
        if parts[0] != "compilecache_operator" or len(parts) < 2:
            continue
        own.add(parts[2] if parts[1] in MAY_IMPORT and len(parts) > 2 else parts[1])
    return own


def folders() -> dict[str, str]:
    """Module → room, from where each module lies: a room's folder, or the package itself for the top."""
    return {p.stem: p.parent.name if p.parent != OPERATOR else "top"
            for p in OPERATOR.rglob("*.py") if p.stem != "__init__"}  # fmt: skip


def across_the_rule(room: str, source: str, where: dict[str, str]) -> list[str]:
    """What a module of ``room`` imports against the map: a room its rule does not name, an I/O library from
    a pure room."""
    wrong = [f"{m} ({where.get(m, 'no room')})" for m in sorted(operator_imports(source))
             if where.get(m) not in MAY_IMPORT[room]]  # fmt: skip
    if room in PURE:
        wrong += [n for n in sorted(imported(source)) if n in IO_LIBRARIES or n.split(".")[0] in IO_LIBRARIES]
    return wrong


def test_every_operator_module_is_in_one_room_of_the_map() -> None:
    modules = folders()
    where = rooms()
    assert set(modules) - set(where) == set(), "modules missing from docs/operator.md's map"
    assert set(where) - set(modules) == set(), "the map names modules that do not exist"
    assert {m: r for m, r in modules.items() if where[m] != r} == {}, "modules in a folder other than the map's room"
    assert {p.name for p in OPERATOR.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(MAY_IMPORT) - {"top"}


def test_each_room_states_its_rule() -> None:
    """Each room's ``__init__`` docstring says what the room is and what it may import."""
    for room in sorted(set(MAY_IMPORT) - {"top"}):
        doc = ast.get_docstring(ast.parse((OPERATOR / room / "__init__.py").read_text())) or ""
        assert "import" in doc.lower(), f"compilecache_operator/{room}/__init__.py states no rule"
    assert "standard library and torch" in (ast.get_docstring(ast.parse((IN_IMAGE / "__init__.py").read_text())) or "")


@pytest.mark.parametrize("module", sorted(rooms()))
def test_a_module_imports_only_the_rooms_its_room_may(module: str) -> None:
    where = rooms()
    path = OPERATOR / ("" if where[module] == "top" else where[module]) / f"{module}.py"
    assert across_the_rule(where[module], path.read_text(), where) == []


def test_a_planted_import_across_the_rooms_is_found() -> None:
    where = rooms()
    assert across_the_rule("admission", "from compilecache_operator import reconcile\n", where) == [
        "reconcile (controller)"]
    assert across_the_rule("decisions", "import asyncio\nfrom compilecache_operator.edge.kube import KubeAPI\n",
                           where) == ["kube (edge)", "asyncio"]  # fmt: skip
    assert across_the_rule("model", "from compilecache_operator.decisions.plan import Variant\n", where) == [
        "plan (decisions)"]
    assert across_the_rule("admission", "from compilecache_operator.controller import state\n", where) == [
        "state (controller)"]
    assert across_the_rule("edge", "from compilecache_operator import admission\n", where) == ["admission (no room)"]
    top = ("from compilecache_operator.controller import reconcile\n"
           "from compilecache_operator.admission import webhook\n")
    assert across_the_rule("top", top, where) == []
    twice = "| model | pure | `spec` |\n| edge | I/O | `spec` |\n"
    with pytest.raises(AssertionError, match="two rooms"):
        rooms(twice)


@pytest.mark.parametrize("planted, rule", [
    ("def f():\n    import kopf\n", "cachelib"),
    ("from compilecache_operator.model.spec import Spec\n", "cachelib"),
    ("import torch._dynamo\n", "operator"),
    ("from transformers import AutoModel\n", "operator"),
    ("import yaml\n", "image"),
    ("from cachelib import publish\n", "image"),
])  # fmt: skip
def test_a_planted_wrong_import_is_found(planted: str, rule: str) -> None:
    names = imported(f'"""A module."""\nimport os\n{planted}')
    if rule == "cachelib":
        assert forbidden(names, NOT_IN_CACHELIB)
    elif rule == "operator":
        assert forbidden(names, NOT_IN_OPERATOR)
    else:
        assert outside_the_image(names, in_image_modules())


def test_the_allowed_imports_are_not_found() -> None:
    names = imported("import os, json\nimport torch\nfrom cachelib.in_image import compilekey\nimport warmstart\n")
    assert outside_the_image(names, in_image_modules()) == []
    assert forbidden(imported("import kopf\nimport aiohttp\n"), NOT_IN_OPERATOR) == []


TEST_FILE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.\w+)*\.test_\w+)", re.MULTILINE)


def python_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in ("tests", "bench", "testsupport", "scripts") for p in (root / d).rglob("*.py"))


def imported_test_files(source: str) -> list[str]:
    """The test files (``tests/**/test_*.py``) ``source`` imports, in its code or in a script it runs."""
    names = {n for n in imported(source) if n.split(".")[-1].startswith("test_") and n.startswith("tests.")}
    return sorted(names | set(TEST_FILE_IMPORT.findall(source)))


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_file_imports_a_test_file(path: Path) -> None:
    """What tests share lives in a helper module (tests/operator/samples.py, crdschema.py, ...): a test file
    imported elsewhere runs its module-level code twice and hides which tests a change touches."""
    assert imported_test_files(path.read_text()) == [], path


def test_a_planted_test_file_import_is_found() -> None:
    assert imported_test_files("from tests.operator.test_spec import validator\n") == ["tests.operator.test_spec"]
    assert imported_test_files('SCRIPT = """\nfrom tests.cachelib.test_x import Y\n"""\n') == ["tests.cachelib.test_x"]
    assert imported_test_files("from tests.operator.samples import owner\n") == []
