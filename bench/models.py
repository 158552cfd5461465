"""Reference models for the warm-start benchmark, written out in plain torch.

Every model is built from a config with random weights: nothing is downloaded. Each
workload pairs a model with example inputs and a module-level step function
(``forward`` or ``train_loss``) so that every way of compiling it — ``torch.compile``,
the warm-up harness, ahead-of-time compile — traces the same graph.

Full sizes (``tiny=False``) are meant for one GPU; ``tiny=True`` shrinks every model so
that the whole benchmark runs on a CPU in minutes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------
# Step functions: what gets compiled. Module level so that ahead-of-time compiled
# artifacts can refer to them by import path.


def forward(model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """One inference call."""
    out: torch.Tensor = model(*inputs)
    return out


def train_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Forward pass of one training step (bf16 autocast on CUDA); the caller runs ``backward``."""
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=idx.device.type == "cuda"):
        loss: torch.Tensor = model(idx, targets)
    return loss


# ---------------------------------------------------------------------------------------
# GPT-2 (124M): 12 layers, 12 heads, 768 wide, 1024 positions, tied embeddings.


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    n_positions: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.mlp_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


# ---------------------------------------------------------------------------------------
# ResNet-50: bottleneck blocks [3, 4, 6, 3], 224x224 inputs.


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.downsample(x))


class ResNet(nn.Module):
    def __init__(self, layers: tuple[int, ...] = (3, 4, 6, 3), base: int = 64, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages: list[nn.Module] = []
        in_ch = base
        for i, depth in enumerate(layers):
            width = base * 2**i
            for j in range(depth):
                stages.append(Bottleneck(in_ch, width, stride=2 if (j == 0 and i > 0) else 1))
                in_ch = width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---------------------------------------------------------------------------------------
# Llama-style decoder (~1.2B, the shape of Llama 3.2 1B): RMSNorm, rotary embeddings,
# grouped-query attention, SwiGLU, tied embeddings.


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 128256
    dim: int = 2048
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_dim: int = 8192
    rope_theta: float = 500000.0
    max_seq_len: int = 2048
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = cfg.dim // cfg.n_heads
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(cfg.max_seq_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.output.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


# ---------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class Workload:
    """A model, its example inputs and the step function that is compiled."""

    name: str
    description: str
    step: Callable[..., torch.Tensor]
    backward: bool
    """True when the first call includes ``loss.backward()`` (a training step)."""
    build: Callable[[torch.device, bool], tuple[nn.Module, tuple[torch.Tensor, ...]]]

    def make(self, device: str | torch.device, tiny: bool, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
        """The model (random init, on ``device``) and the step's arguments ``(model, *inputs)``."""
        torch.manual_seed(seed)
        model, inputs = self.build(torch.device(device), tiny)
        return model, (model, *inputs)


def _inference_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _frozen(model: nn.Module, device: torch.device) -> nn.Module:
    model = model.to(device=device, dtype=_inference_dtype(device)).eval()
    model.requires_grad_(False)
    return model


def _gpt_config(tiny: bool) -> GPTConfig:
    return GPTConfig(vocab_size=512, n_positions=64, n_layer=2, n_head=4, n_embd=64) if tiny else GPTConfig()


def _tokens(vocab: int, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), device=device)


def build_gpt2(device: torch.device, tiny: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    cfg = _gpt_config(tiny)
    batch, seq = (2, 32) if tiny else (8, 512)
    return _frozen(GPT(cfg), device), (_tokens(cfg.vocab_size, batch, seq, device),)


def build_gpt2_train(device: torch.device, tiny: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    cfg = _gpt_config(tiny)
    batch, seq = (2, 32) if tiny else (8, 512)
    model = GPT(cfg).to(device).train()
    return model, (_tokens(cfg.vocab_size, batch, seq, device), _tokens(cfg.vocab_size, batch, seq, device))


def build_resnet50(device: torch.device, tiny: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model = ResNet(layers=(1, 1, 1, 1), base=8, num_classes=10) if tiny else ResNet()
    batch, size = (2, 32) if tiny else (32, 224)
    model = _frozen(model, device).to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device, dtype=_inference_dtype(device))
    return model, (x.contiguous(memory_format=torch.channels_last),)


def build_llama1b(device: torch.device, tiny: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    cfg = (
        LlamaConfig(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)
        if tiny
        else LlamaConfig()
    )
    batch, seq = (2, 32) if tiny else (2, 1024)
    with torch.device("meta" if not tiny else "cpu"):
        model = Llama(cfg)
    if not tiny:  # initialise on the target device: 1.2B parameters are slow to init on a CPU
        model = model.to_empty(device=device)
        _init_llama(model, cfg)
    return _frozen(model, device), (_tokens(cfg.vocab_size, batch, seq, device),)


@torch.no_grad()
def _init_llama(model: Llama, cfg: LlamaConfig) -> None:
    std = 0.02
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std / math.sqrt(2 * cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else std)
    cos, sin = rotary_tables(cfg)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)


def _builtin(name: str) -> Callable[[torch.device, bool], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """A built-in warm-up target of cachelib (one size: ``tiny`` changes nothing), on ``device``."""

    def build(device: torch.device, tiny: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        from cachelib.in_image import targets

        model, inputs = getattr(targets, name)()[0]
        return model.to(device).eval(), tuple(x.to(device) for x in inputs)

    return build


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("gpt2", "GPT-2 124M forward, batch 8 × 512 tokens, bf16", forward, False, build_gpt2),
        Workload("resnet50", "ResNet-50 forward, batch 32 × 224², bf16, channels-last", forward, False, build_resnet50),
        Workload(
            "llama1b", "Llama-style 1.2B (16 layers) forward, batch 2 × 1024, bf16", forward, False, build_llama1b
        ),
        Workload(
            "gpt2_train",
            "GPT-2 124M training step (fwd+bwd), batch 8 × 512, bf16 autocast",
            train_loss,
            True,
            build_gpt2_train,
        ),
        Workload("tiny_mlp", "cachelib's tiny_mlp: two linear layers, 8 x 64", forward, False, _builtin("tiny_mlp")),
        Workload(
            "transformer_block",
            "cachelib's transformer_block: dim 64, 4 heads, 2 x 16 tokens",
            forward,
            False,
            _builtin("transformer_block"),
        ),
        Workload(
            "small_convnet",
            "cachelib's small_convnet: two convolutions, 2 x 3 x 32²",
            forward,
            False,
            _builtin("small_convnet"),
        ),
    )
}


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(WORKLOADS)}") from None


# ---------------------------------------------------------------------------------------
# Targets for the warm-up harness (``--target bench.models:gpt2_target``): each returns
# [(callable, example_args)], the same step function and arguments the benchmark compiles.


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _tiny() -> bool:
    import os

    return os.environ.get("WARM_START_TINY", "") == "1"


def gpt2_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["gpt2"].make(_device(), _tiny())[1])]


def resnet50_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["resnet50"].make(_device(), _tiny())[1])]


def llama1b_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["llama1b"].make(_device(), _tiny())[1])]


def gpt2_train_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(train_loss, WORKLOADS["gpt2_train"].make(_device(), _tiny())[1])]


def tiny_mlp_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["tiny_mlp"].make(_device(), _tiny())[1])]


def transformer_block_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["transformer_block"].make(_device(), _tiny())[1])]


def small_convnet_target() -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    return [(forward, WORKLOADS["small_convnet"].make(_device(), _tiny())[1])]
