"""The server's model, and the warm-up target compilecache compiles it with.

The model is a small GPT-2 built from its configuration with random weights (nothing to download);
a real server loads its own weights here. On a GPU it runs in bfloat16, on the CPU in float32.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH_SIZES = (1, 4)
"""The batch sizes the server pads its requests to: the shapes it compiles, and the warm-up too."""
SEQUENCE = 32
"""Tokens per row (the server pads or cuts every row to this length)."""


def device_and_dtype() -> tuple[str, torch.dtype]:
    return ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)


def build_model() -> torch.nn.Module:
    device, dtype = device_and_dtype()
    torch.manual_seed(0)
    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=SEQUENCE, vocab_size=1000, bos_token_id=0,
                        eos_token_id=0, use_cache=False)
    return GPT2LMHeadModel(config).to(device=device, dtype=dtype).eval()


def input_ids(rows: list[list[int]]) -> torch.Tensor:
    """Token ids as the model takes them: each row padded (with 0) or cut to SEQUENCE."""
    padded = [(row + [0] * SEQUENCE)[:SEQUENCE] for row in rows]
    return torch.tensor(padded, dtype=torch.long, device=device_and_dtype()[0])


def warmup_targets() -> list[tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """compilecache's warm-up target: a list of (callable_or_module, example_args[, example_kwargs]).

    The warm-up harness compiles each entry the way the server does (torch.compile with the
    CompileCache's options, called under torch.no_grad()) and calls it once: here the model at each
    batch size the server serves."""
    model = build_model()
    return [(model, (input_ids([[0]] * batch),)) for batch in BATCH_SIZES]
