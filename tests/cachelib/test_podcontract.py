"""The pod contract: the one termination-message writer (whole JSON within Kubernetes' limit) and its path rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.in_image.podcontract import (
    SHRUNK_FIELD,
    TERMINATION_MESSAGE_LIMIT,
    termination_log_path,
    termination_message,
    write_termination_message,
)
from tests.cachelib.helpers import make_key

H100 = make_key()

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(
    scalars | st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=4), st.integers(500, 3000)),
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(), inner, max_size=20),
    max_leaves=50,
)
payloads = st.dictionaries(st.text(max_size=5000), values, max_size=30)


def test_termination_log_path_rules(tmp_path: Path) -> None:
    explicit = tmp_path / "log"
    assert termination_log_path({"COMPILECACHE_TERMINATION_LOG": str(explicit)}) == explicit
    assert termination_log_path({"COMPILECACHE_TERMINATION_LOG": str(tmp_path / "no" / "log")}) is None


def test_termination_message_fits_kubernetes_limit() -> None:
    payload = {"result": "hit", "keys": [str(H100)] * 100, "hits": [str(H100)] * 100, "bytes": 1}
    text = termination_message(payload)
    assert len(text.encode()) <= 4096
    assert json.loads(text) == {"result": "hit", "keys_count": 100, "hits_count": 100, "bytes": 1}


def test_a_message_that_fits_is_written_whole(tmp_path: Path) -> None:
    log = tmp_path / "log"
    payload = {"result": "error", "stage": "compile", "reason": "x" * 3000}
    assert write_termination_message(payload, {"COMPILECACHE_TERMINATION_LOG": str(log)}) == log
    assert json.loads(log.read_text()) == payload


def test_a_long_reason_is_clipped_not_cut_through_the_json() -> None:
    """The harness's error with a traceback longer than the limit: the outcome fields stay, the JSON stays whole."""
    payload = {"result": "error", "stage": "compile", "reason": "Traceback: " + "é\"\\\n" * 5000}
    decoded = json.loads(termination_message(payload))
    assert decoded["result"] == "error" and decoded["stage"] == "compile"
    assert payload["reason"].startswith(decoded["reason"].removesuffix("..."))


def test_fields_left_out_are_counted_and_the_outcome_kept() -> None:
    payload: dict[str, Any] = {f"field-{i:04}": i for i in range(2000)} | {"result": "miss", "reason": "none"}
    decoded = json.loads(termination_message(payload))
    assert decoded["result"] == "miss" and decoded["reason"] == "none"
    assert decoded[SHRUNK_FIELD] == len(payload) - (len(decoded) - 1) > 0


@settings(max_examples=150, deadline=None)
@given(payloads)
def test_any_payload_gives_whole_json_within_the_limit(payload: dict[str, Any]) -> None:
    text = termination_message(payload)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    decoded = json.loads(text)
    assert isinstance(decoded, dict)
    if len(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()) <= TERMINATION_MESSAGE_LIMIT:
        assert decoded == payload
