"""docs/your-own-server.md shows its files as they are, its resources fit the CRD and Pod Security, and every
document, example and help text says one thing of what a warm-up target returns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from compilecache_operator.model.spec import Defaults
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.crdschema import validator
from tests.operator.restricted import restricted_violations

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "your-own-server.md"
EXAMPLE = ROOT / "examples" / "your-own-server"
CONTRACT = "(callable_or_module, example_args[, example_kwargs])"
SHOWN = re.compile(r"```(?:python|yaml|dockerfile)\n# (examples/your-own-server/\S+)\n(.*?)```", re.S)
# What targets were said to return before: a model and its inputs, as a pair (exit status 5 when followed).
WRONG = re.compile(r"\(?\b(?:the )?(?:model|function),? (?:and )?example inputs\)?", re.I)
CONTRACT_PLACES = (
    "docs/cli.md", "docs/operator.md", "docs/your-own-server.md", "examples/s3-multi-gpu.yaml",
    "examples/your-own-server/compilecache.yaml", "examples/your-own-server/app/serving.py",
    "crds/compilecache.io_compilecaches.yaml",
    "charts/compilecache-operator/templates/crds/compilecache.io_compilecaches.yaml",
    "cachelib/in_image/harness.py", "cachelib/in_image/compilestep.py", "cachelib/cli/parser.py",
)  # fmt: skip
"""Every place that says what a target returns."""


def searched() -> list[Path]:
    """The documents, examples, CRDs and the command line's help: where a user reads about targets."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.yaml")),
             *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.md")),
             *sorted((ROOT / "crds").glob("*.yaml")), *sorted((ROOT / "cachelib").rglob("*.py"))]  # fmt: skip
    return [*found, *sorted((ROOT / "charts").rglob("*.yaml")), *sorted((ROOT / "operator").rglob("*.py"))]


def test_every_place_says_one_target_contract() -> None:
    wrong = [f"{p.relative_to(ROOT)}: {m[0]!r}" for p in searched() for m in WRONG.finditer(p.read_text())]
    assert not wrong, "targets return a list of (callable_or_module, example_args[, example_kwargs]):\n" + "\n".join(
        wrong
    )
    for place in CONTRACT_PLACES:
        text = " ".join((ROOT / place).read_text().split())
        assert CONTRACT in text, f"{place} does not state the target contract"


def test_the_guide_shows_the_example_files_as_they_are() -> None:
    shown = {path: body for path, body in SHOWN.findall(GUIDE.read_text())}
    expected = {"app/serving.py", "app/server.py", "Dockerfile", "compilecache.yaml", "deployment.yaml"}
    assert {p.removeprefix("examples/your-own-server/") for p in shown} == expected
    for path, body in shown.items():
        assert "# " + path + "\n" + body == "# " + path + "\n" + (ROOT / path).read_text(), path


def test_the_guide_s_compile_cache_fits_the_crd_and_matches_the_server() -> None:
    cache = yaml.safe_load((EXAMPLE / "compilecache.yaml").read_text())
    spec = parse_spec(cache["spec"], Defaults(storage_url="redis://redis.compilecache-system.svc:6379/0"))
    assert not [e.message for e in validator().iter_errors(cache)]
    deployment = yaml.safe_load((EXAMPLE / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]
    (server,) = pod["spec"]["containers"]
    assert pod["metadata"]["labels"]["compilecache.io/cache"] == cache["metadata"]["name"]
    assert server["image"] == cache["spec"]["image"], "the webhook preloads only for the image that was warmed"
    module, function = cache["spec"]["model"]["target"].split(":")
    assert f"def {function}(" in (EXAMPLE / "app" / f"{module}.py").read_text()
    assert spec.model.compile.dynamic is False
    assert "torch.compile(serving.build_model(), dynamic=False)" in (EXAMPLE / "app" / "server.py").read_text()
    assert restricted_violations(pod["spec"]) == []
    assert {"cpu", "memory"} <= set(server["resources"]["limits"])


@pytest.mark.parametrize("line", ["runtime.warm_start()", "compilecache why", "[metrics]"])
def test_the_guide_says_the_runtime_steps(line: str) -> None:
    assert line in GUIDE.read_text()
