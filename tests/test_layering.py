"""The layering of the product, read from its imports (every ``import`` anywhere in a module, lazy ones included):

- the modules the warm-up Job copies into the user's image (``COPY_HARNESS`` of the operator's warm-up Job) import
  only the standard library, torch (and Triton, which torch brings) and each other: the image has nothing else;
- ``cachelib`` never imports Kubernetes clients, Kopf or the operator: it runs in pods and on laptops;
- the operator never imports torch, Triton or a model library: it runs in a small image without them.

A planted wrong import is found by the same reading (the last tests).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from compilecache_operator import warmup_job

ROOT = Path(__file__).resolve().parents[1]
CACHELIB = ROOT / "cachelib"
OPERATOR = ROOT / "operator" / "compilecache_operator"
IN_IMAGE_THIRD_PARTY = frozenset({"torch", "triton"})
NOT_IN_CACHELIB = frozenset({"kubernetes", "kubernetes_asyncio", "kopf", "compilecache_operator", "pykube"})
NOT_IN_OPERATOR = frozenset({"torch", "triton", "transformers", "timm", "torchvision", "vllm", "numpy"})


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
            elif node.module == "cachelib":
                found |= {f"cachelib.{alias.name}" for alias in node.names}
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
        if name in allowed or (top == "cachelib" and name.split(".")[1] in allowed):
            continue
        wrong.append(name)
    return sorted(wrong)


def forbidden(names: Iterable[str], tops: frozenset[str]) -> list[str]:
    return sorted(name for name in names if name.split(".")[0] in tops)


@pytest.mark.parametrize("module", in_image_modules())
def test_what_runs_in_the_users_image_imports_the_standard_library_and_torch_only(module: str) -> None:
    names = imported((CACHELIB / f"{module}.py").read_text())
    assert not outside_the_image(names, in_image_modules()), f"cachelib/{module}.py imports {names}"


@pytest.mark.parametrize("path", sorted(CACHELIB.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_cachelib_never_imports_kubernetes_kopf_or_the_operator(path: Path) -> None:
    assert not forbidden(imported(path.read_text()), NOT_IN_CACHELIB), path


@pytest.mark.parametrize("path", sorted(OPERATOR.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_operator_never_imports_torch_or_a_model_library(path: Path) -> None:
    assert not forbidden(imported(path.read_text()), NOT_IN_OPERATOR), path


@pytest.mark.parametrize("planted, rule", [
    ("def f():\n    import kopf\n", "cachelib"),
    ("from compilecache_operator.spec import Spec\n", "cachelib"),
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
    names = imported("import os, json\nimport torch\nfrom cachelib import compilekey\nimport warmstart\n")
    assert outside_the_image(names, in_image_modules()) == []
    assert forbidden(imported("import kopf\nimport aiohttp\n"), NOT_IN_OPERATOR) == []
