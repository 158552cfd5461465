"""The Argo CD health check of docs/install.md, run by a real Lua 5.4 (Debian's lua5.4; Argo CD runs gopher-lua,
Lua 5.1's language, which the snippet keeps to) on CompileCaches whose status the operator's own status code
wrote, for every Ready reason it writes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from compilecache_operator.decisions import cache_status
from compilecache_operator.decisions.job_reports import JobState
from compilecache_operator.decisions.plan import BundleRecord, Variant
from compilecache_operator.model import conditions as cond

from testsupport import unavailable

ROOT = Path(__file__).resolve().parents[2]
KEY = "resource.customizations.health.compilecache.io_CompileCache"
NOW = "2026-01-01T00:00:00Z"
SERVING_OR_WAITING = {"BundlesAvailable", "PartiallyAvailable", "WarmupInProgress", "WarmupPending"}


def ready_reasons() -> list[str]:
    """Every Ready reason docs/operator.md lists (its "Ready reasons:" paragraph)."""
    text = (ROOT / "docs" / "operator.md").read_text()
    paragraph = text[text.index("Ready reasons:"):].split("\n\n", 1)[0].split("Degraded carries", 1)[0]
    return re.findall(r"`([A-Z][A-Za-z]+)`", paragraph)


def snippet() -> str:
    """The Lua under the health key in docs/install.md, unindented."""
    text = (ROOT / "docs" / "install.md").read_text()
    match = re.search(rf"^(\s*){re.escape(KEY)}: \|\n((?:\1  .*\n|\n)+)", text, re.M)
    assert match, f"docs/install.md has no {KEY}"
    indent = len(match.group(1)) + 2
    return "".join(line[indent:] + "\n" for line in match.group(2).splitlines())


def lua(value: Any) -> str:
    """``value`` (JSON-like) as a Lua table constructor; None is nil (left out, as Argo CD's conversion does)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "{" + ", ".join(lua(v) for v in value) + "}"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"[{lua(k)}] = {lua(v)}" for k, v in value.items() if v is not None) + "}"


def health(tmp_path: Path, obj: dict[str, Any]) -> tuple[str, str]:
    script = tmp_path / "health.lua"
    script.write_text(snippet())
    runner = f'obj = {lua(obj)}\nlocal hs = dofile("{script}")\nio.write(hs.status, "\\t", hs.message or "")\n'
    proc = subprocess.run([LUA or "lua5.4", "-"], input=runner, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    status, _, message = proc.stdout.partition("\t")
    return status, message


LUA = shutil.which("lua5.4")


@pytest.fixture(autouse=True)
def lua_interpreter() -> None:
    """Skip without lua5.4 (scripts/test.sh installs it), except with CI=true: CI never passes by skipping."""
    if LUA is None:
        unavailable("lua5.4 is not installed (apt-get install lua5.4)")


def cache(conditions: list[cond.Condition] | None, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "compilecache.io/v1alpha1", "kind": "CompileCache",
                            "metadata": {"name": "mlp", "namespace": "ml", "generation": generation}}
    if conditions is not None:
        body["status"] = cache_status.build_status(None, generation=observed, conditions=conditions, bundles=None,
                                                   planned_gpus=None, storage_url=None, now=NOW)
    return body


V1, V2 = Variant("a1", "NVIDIA-L4", "img:1"), Variant("b2", "NVIDIA-H100-80GB-HBM3", "img:1")
BUNDLE = BundleRecord(variant="a1", key="k1", gpu="NVIDIA-L4", image="img:1")


def test_a_served_cache_is_healthy_and_a_warming_one_progressing(tmp_path: Path) -> None:
    assert health(tmp_path, cache(cache_status.warmup_conditions([V1], [BUNDLE], {})))[0] == "Healthy"
    active = {"b2": JobState("cc-mlp-b2-g2", "b2", 2, "active", message="running")}
    assert health(tmp_path, cache(cache_status.warmup_conditions([V1, V2], [BUNDLE], active)))[0] == "Progressing"
    assert health(tmp_path, cache(cache_status.warmup_conditions([V1, V2], [], {})))[0] == "Progressing"  # pending


def test_an_unreconciled_cache_is_progressing(tmp_path: Path) -> None:
    assert health(tmp_path, cache(None)) == ("Progressing", "Waiting for the operator to reconcile the CompileCache")
    served = cache_status.warmup_conditions([V1], [BUNDLE], {})
    status, message = health(tmp_path, cache(served, generation=3, observed=2))
    assert status == "Progressing" and "generation 3" in message


def test_a_partly_failed_cache_and_every_failure_are_degraded_with_the_reason(tmp_path: Path) -> None:
    failed = {"b2": JobState("cc-mlp-b2-g2", "b2", 2, "failed", reason="CompileFailed", message="exit 1")}
    partial = cache_status.warmup_conditions([V1, V2], [BUNDLE], failed)
    status, message = health(tmp_path, cache(partial))
    assert status == "Degraded" and message.startswith("CompileFailed: ") and "exit 1" in message
    failures = [r for r in ready_reasons() if r not in SERVING_OR_WAITING]
    assert len(failures) >= 9 and "InvalidSpec" in failures, failures
    for reason in failures:
        conditions = cache_status.failure_conditions(cache_status.Failure(reason, f"what went wrong: {reason}"))
        status, message = health(tmp_path, cache(conditions))
        assert (status, message) == ("Degraded", f"{reason}: what went wrong: {reason}"), reason
