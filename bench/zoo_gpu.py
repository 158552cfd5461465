"""The model zoo (testsupport/models.py) on a chosen device: harness targets ``bench.zoo_gpu:NAME``.

Each target calls ``testsupport.models.NAME`` and moves the model and its inputs to the device of
``$COMPILECACHE_ZOO_DEVICE`` (default ``cuda``). On CUDA, inference models and their floating
inputs are cast to bfloat16; the training steps (``TRAINING``) stay in float32. On the CPU
everything stays float32. Token ids stay integers. The warm-up harness, its check process and
the benchmark's pod processes all build the models through here, so all of them see the same
device and dtype (the variable passes through their environments). torch and the zoo are imported
only when a target runs, so the benchmark's parent process can read the names without them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

DEVICE_ENV = "COMPILECACHE_ZOO_DEVICE"
TRAINING = frozenset({"hf_bert_train", "hf_qwen2_train", "timm_resnet_train"})
"""Training steps: the harness and the pods run them with ``--backward``, in float32."""
DYNAMIC = frozenset({"hf_gpt2_dynamic"})
"""Compiled with ``--dynamic true``; the pods also call them with ``models.SECOND_INPUTS``."""
NAMES = (
    "hf_bert",
    "hf_bert_train",
    "hf_clip_vision",
    "hf_distilbert",
    "hf_gpt2",
    "hf_gpt2_dynamic",
    "hf_llama",
    "hf_phi3",
    "hf_qwen2_train",
    "hf_qwen3",
    "hf_t5_encoder",
    "hf_vit",
    "hf_wav2vec2",
    "hf_whisper_encoder",
    "pyg_gcn",
    "timm_convnext",
    "timm_regnet",
    "timm_resnet_train",
    "timm_vit",
    "tv_efficientnet",
    "tv_resnet",
    "tv_swin",
)


def device() -> str:
    return os.environ.get(DEVICE_ENV, "cuda")


def dtype(name: str) -> torch.dtype:
    """bfloat16 for inference on CUDA; float32 for the training steps and on the CPU."""
    import torch

    return torch.bfloat16 if device() == "cuda" and name not in TRAINING else torch.float32


def _move(value: Any, dev: str, dt: torch.dtype) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dev, dt) if value.is_floating_point() else value.to(dev)
    if isinstance(value, list | tuple):
        return type(value)(_move(v, dev, dt) for v in value)
    return value


def build(name: str) -> list[tuple[Any, tuple[Any, ...]]]:
    """``testsupport.models.NAME()`` with every model and input on the device, in its dtype."""
    from testsupport import models

    dev, dt = device(), dtype(name)
    built = getattr(models, name)()
    return [(model.to(dev, dt), tuple(_move(a, dev, dt) for a in args)) for model, args in built]


def second_inputs(name: str) -> tuple[Any, ...] | None:
    """Another input shape for the dynamic-shape cases, on the device; None for the others."""
    from testsupport import models

    make = models.SECOND_INPUTS.get(name)
    return None if make is None else tuple(_move(a, device(), dtype(name)) for a in make())


def _target(name: str) -> Callable[[], list[tuple[Any, tuple[Any, ...]]]]:
    def target() -> list[tuple[Any, tuple[Any, ...]]]:
        return build(name)

    target.__name__ = target.__qualname__ = name
    target.__doc__ = f"testsupport.models.{name} on ${DEVICE_ENV} (a harness target)."
    return target


hf_bert = _target("hf_bert")
hf_bert_train = _target("hf_bert_train")
hf_clip_vision = _target("hf_clip_vision")
hf_distilbert = _target("hf_distilbert")
hf_gpt2 = _target("hf_gpt2")
hf_gpt2_dynamic = _target("hf_gpt2_dynamic")
hf_llama = _target("hf_llama")
hf_phi3 = _target("hf_phi3")
hf_qwen2_train = _target("hf_qwen2_train")
hf_qwen3 = _target("hf_qwen3")
hf_t5_encoder = _target("hf_t5_encoder")
hf_vit = _target("hf_vit")
hf_wav2vec2 = _target("hf_wav2vec2")
hf_whisper_encoder = _target("hf_whisper_encoder")
pyg_gcn = _target("pyg_gcn")
timm_convnext = _target("timm_convnext")
timm_regnet = _target("timm_regnet")
timm_resnet_train = _target("timm_resnet_train")
timm_vit = _target("timm_vit")
tv_efficientnet = _target("tv_efficientnet")
tv_resnet = _target("tv_resnet")
tv_swin = _target("tv_swin")

_missing = [name for name in NAMES if not callable(globals().get(name))]
assert not _missing, f"bench/zoo_gpu.py: no target for {_missing}"
