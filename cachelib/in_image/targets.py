"""Built-in warm-up targets: small models that compile in seconds on a CPU.

Each function returns ``[(module, example_args)]`` as the harness expects. Weights are
seeded, inputs fixed, so that a warm-up and a later process compile the same graphs.
The models run on the first CUDA device when there is one, else on the CPU. Like the
harness, this module needs only the standard library and torch (it may be copied beside
``harness.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Entries = list[tuple[nn.Module, tuple[torch.Tensor, ...]]]


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TinyMLP(nn.Module):
    def __init__(self, width: int = 64, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # type: ignore[no-any-return]


class TransformerBlock(nn.Module):
    """Pre-norm attention and MLP, the building block of GPT-style models."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp(self.norm2(x))  # type: ignore[no-any-return]


class SmallConvNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))  # type: ignore[no-any-return]


def _entry(model: nn.Module, *shape: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    device = _device()
    generator = torch.Generator().manual_seed(0)
    return model.to(device), (torch.randn(*shape, generator=generator).to(device),)


def _seeded(factory: Any) -> nn.Module:
    torch.manual_seed(0)
    return factory()  # type: ignore[no-any-return]


def tiny_mlp() -> Entries:
    """A two-layer MLP on a batch of 8 vectors of width 64."""
    return [_entry(_seeded(TinyMLP), 8, 64)]


def transformer_block() -> Entries:
    """One pre-norm transformer block (dim 64, 4 heads) on 2 sequences of 16 tokens."""
    return [_entry(_seeded(TransformerBlock), 2, 16, 64)]


def small_convnet() -> Entries:
    """Two convolutions and a linear head on 2 RGB images of 32x32."""
    return [_entry(_seeded(SmallConvNet), 2, 3, 32, 32)]
