"""Every CompileCache in examples/ parses with the operator's spec parser and validates against the CRD."""

from __future__ import annotations

from typing import Any

import pytest
from compilecache_operator.model.spec import Defaults
from compilecache_operator.model.spec_parse import parse_spec

from tests.operator.crdschema import validator
from tests.operator.example_files import EXAMPLES, QUICK_START_STORE


def test_the_examples_hold_compile_caches() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize(("name", "doc"), EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_example_parses_and_fits_the_crd(name: str, doc: dict[str, Any]) -> None:
    parse_spec(doc["spec"], Defaults(storage_url=QUICK_START_STORE))  # minimal.yaml uses the default store
    errors = [e.message for e in validator().iter_errors(doc)]
    assert not errors, f"{name}: {errors}"


def test_an_example_shows_sidecar_mode() -> None:
    defaults = Defaults(storage_url=QUICK_START_STORE)
    modes = {name: parse_spec(doc["spec"], defaults).preload.mode for name, doc in EXAMPLES}
    assert "Sidecar" in modes.values(), modes
