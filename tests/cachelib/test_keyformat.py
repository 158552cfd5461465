"""Cache keys: one string form that round-trips, never collides, and names what is wrong."""

from __future__ import annotations

import pytest

from cachelib.keyformat import CacheKey, InvalidKey, cache_prefix, capability_slug, digest, gpu_slug
from tests.cachelib.helpers import BASE_FIELDS, make_key

OTHER_VALUES = {
    "namespace": "team-b",
    "name": "llama.v2",
    "model": "1123456789abcdef",
    "options": "aedcba9876543210",
    "gpu": "nvidia-a100-sxm4-80gb",
    "capability": "sm80",
    "torch": "2.13.0+cu126",
    "triton": "3.5.0",
    "cuda": "12.6",
    "py": "3.12",
}


def test_string_form_round_trips() -> None:
    key = make_key()
    text = str(key)
    assert text == (
        "cc1/team-a/llama/0123456789abcdef/fedcba9876543210/nvidia-h100-80gb-hbm3/sm90/"
        "torch-2.13.0+cu128/triton-3.6.0/cuda-12.8/py-3.11"
    )
    assert CacheKey.parse(text) == key
    assert CacheKey.from_dict(key.to_dict()) == key


@pytest.mark.parametrize("field", sorted(BASE_FIELDS))
def test_every_field_changes_the_string(field: str) -> None:
    base, changed = make_key(), make_key(**{field: OTHER_VALUES[field]})
    assert str(base) != str(changed)
    assert CacheKey.parse(str(changed)) == changed


def test_cpu_key_round_trips() -> None:
    key = make_key(gpu="cpu", capability="cpu", triton="none", cuda="none", torch="2.13.0+cpu")
    assert CacheKey.parse(str(key)) == key
    assert key.variant == "cpu/cpu/torch-2.13.0+cpu/triton-none/cuda-none/py-3.11"


def test_prefix_lists_a_whole_cache() -> None:
    key = make_key()
    assert str(key).startswith(cache_prefix("team-a", "llama"))
    assert not str(make_key(name="llama2")).startswith(cache_prefix("team-a", "llama"))
    assert key.cache_prefix == "cc1/team-a/llama/"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", "Team_A"),
        ("name", "-bad"),
        ("model", "xyz"),
        ("options", "0123"),
        ("gpu", "NVIDIA H100"),
        ("capability", "9.0.1"),
        ("torch", "2.13 0"),
        ("py", ""),
    ],
)
def test_invalid_field_is_named(field: str, value: str) -> None:
    with pytest.raises(InvalidKey, match=field):
        make_key(**{field: value})


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("cc2/team-a/llama/0123456789abcdef/fedcba9876543210/cpu/cpu/torch-1/triton-none/cuda-none/py-3.11", "prefix"),
        ("cc1/team-a/llama/0123456789abcdef", "11"),
        ("cc1/team-a/llama/0123456789abcdef/fedcba9876543210/cpu/cpu/pytorch-1/triton-none/cuda-none/py-3", "torch-"),
    ],
)
def test_parse_names_what_is_wrong(text: str, complaint: str) -> None:
    with pytest.raises(InvalidKey, match=complaint):
        CacheKey.parse(text)


def test_from_dict_names_missing_field() -> None:
    fields = dict(BASE_FIELDS)
    del fields["triton"]
    with pytest.raises(InvalidKey, match="triton"):
        CacheKey.from_dict(fields)


def test_slugs() -> None:
    assert gpu_slug("NVIDIA-H100-80GB-HBM3") == gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_slug("") == "cpu"
    assert capability_slug((9, 0)) == capability_slug("9.0") == "sm90"
    assert capability_slug(None) == "cpu"
    with pytest.raises(InvalidKey, match="capability"):
        capability_slug("nine")


def test_digest_ignores_dict_order_and_sees_values() -> None:
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})
    assert len(digest("x")) == 16
