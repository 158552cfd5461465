"""The quick start says one thing everywhere: README.md, docs/install.md, the chart's README (its template) and
the chart's NOTES name the same default Redis; the examples that name a store of their own say which allow-list
values they need, and those values admit them; the replica count in docs/install.md is the values' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from compilecache_operator.model.confinement import Confinement, check_confinement
from compilecache_operator.model.spec import Defaults, InvalidSpec
from compilecache_operator.model.spec_parse import parse_spec

from tests.chart.chart import CHART_DIR

ROOT = Path(__file__).resolve().parents[2]
STORE_URL = re.compile(r"\b(?:redis|rediss)://[^\s'\"`)]+")
WORDS = {1: "one", 2: "two", 3: "three"}


def quick_start_block() -> str:
    text = (ROOT / "README.md").read_text()
    marker = text.index("<!-- quick-start -->")
    return text[marker:].split("```sh\n", 1)[1].split("```", 1)[0]


def test_readme_install_and_chart_readme_name_one_redis() -> None:
    (readme_url,) = set(STORE_URL.findall(quick_start_block()))
    for doc in (ROOT / "docs/install.md", CHART_DIR / "README.md.gotmpl", CHART_DIR / "README.md"):
        install = doc.read_text().split("helm install", 1)[1].split("```", 1)[0]
        assert set(STORE_URL.findall(install)) == {readme_url}, doc
    notes = (CHART_DIR / "templates/NOTES.txt").read_text()
    assert not STORE_URL.findall(notes), "NOTES names a store of its own"


def test_the_replica_count_in_docs_is_the_values_one() -> None:
    replicas = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["highAvailability"]["replicas"]
    text = (ROOT / "docs/install.md").read_text()
    said = re.findall(r"\((\w+) replicas?\b", text.split("## Install", 1)[0])
    assert said == [WORDS[replicas]], said


def needed_values() -> dict[str, dict[str, list[str]]]:
    """examples/README.md's table: file -> {storeHosts: [...], storeSecrets: [...]}."""
    rows = re.findall(r"^\| \[([\w-]+\.yaml)\]\([\w-]+\.yaml\) \| (`confinement\..*)\|$",
                      (ROOT / "examples/README.md").read_text(), re.M)
    return {name: {key: items.split(",") for key, items in re.findall(r"confinement\.(\w+)=\{([^}]*)\}", values)}
            for name, values in rows}


def examples_with_a_store() -> list[Path]:
    return [p for p in sorted((ROOT / "examples").glob("*.yaml"))
            for doc in yaml.safe_load_all(p.read_text())
            if doc and doc.get("kind") == "CompileCache" and "storage" in doc["spec"]]


@pytest.mark.parametrize("path", examples_with_a_store(), ids=lambda p: p.name)
def test_an_example_with_its_own_store_says_what_to_allow_and_that_admits_it(path: Path) -> None:
    needed = needed_values()
    assert path.name in needed, f"examples/README.md does not say which allow-list values {path.name} needs"
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CompileCache"]
    spec = parse_spec(doc["spec"], Defaults())
    chart_default = Confinement(store_hosts=(), store_secrets=(), warmup_service_accounts=())
    with pytest.raises(InvalidSpec):  # the chart's default allow-list does not admit it: the values are needed
        check_confinement(chart_default, "ml-team", spec)
    allowed = Confinement(store_hosts=tuple(needed[path.name]["storeHosts"]),
                          store_secrets=tuple(needed[path.name].get("storeSecrets", ())),
                          warmup_service_accounts=())
    check_confinement(allowed, "ml-team", spec)


def test_minimal_uses_the_default_store() -> None:
    doc = yaml.safe_load((ROOT / "examples/minimal.yaml").read_text())
    assert "storage" not in doc["spec"]
