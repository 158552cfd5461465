"""Warm-up targets of the model zoo: tiny random-weight models built by the libraries users run.

Each function is a harness target (``testsupport.models:NAME``): it returns
``[(model, example_args)]``. The configurations are small enough to compile on two CPU cores in
seconds, but the code is each library's own (attention implementations, config handling,
output dataclasses, closures): what a pod runs. Nothing is downloaded: weights are random,
token ids are random integers. ``SECOND_INPUTS`` gives another input shape for the cases that
are compiled with dynamic shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Target = list[tuple[Any, tuple[Any, ...]]]
SEED = 0


def _ids(batch: int, length: int, vocab: int = 1000) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1))


def _image(batch: int, size: int, channels: int = 3) -> torch.Tensor:
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(2))


def _eval(model: torch.nn.Module) -> torch.nn.Module:
    return model.eval()


# -- transformers ---------------------------------------------------------------------------------
def hf_bert() -> Target:
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
    return [(_eval(BertModel(config)), (_ids(2, 16),))]


def hf_bert_train() -> Target:
    """A training step (the harness runs it with --backward): dropout on, gradients compared."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(SEED)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    return [(BertForSequenceClassification(config).train(), (_ids(2, 16),))]


def hf_gpt2() -> Target:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(SEED)
    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, vocab_size=1000)
    return [(_eval(GPT2Model(config)), (_ids(2, 16),))]


def hf_llama() -> Target:
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64,
    )  # fmt: skip
    return [(_eval(LlamaModel(config)), (_ids(2, 16),))]


def hf_distilbert() -> Target:
    """Sequence classification (the warm-up's check left DistilBERT's part out on an H200, torch 2.11:
    ``install_failed``, a ``DefaultsSource.__init__()`` TypeError)."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(SEED)
    config = DistilBertConfig(
        dim=64, n_layers=2, n_heads=2, hidden_dim=128, vocab_size=1000, max_position_embeddings=64
    )
    return [(_eval(DistilBertForSequenceClassification(config)), (_ids(2, 16),))]


def hf_qwen3() -> Target:
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(SEED)
    config = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=1000, max_position_embeddings=64,
    )  # fmt: skip
    return [(_eval(Qwen3Model(config)), (_ids(2, 16),))]


def hf_wav2vec2() -> Target:
    """Its positional convolution carries a weight-norm parametrization (compiling it with caching
    precompile failed on an H200, torch 2.11)."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    torch.manual_seed(SEED)
    config = Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, do_stable_layer_norm=False, feat_extract_norm="group",
    )  # fmt: skip
    audio = torch.randn(2, 1600, generator=torch.Generator().manual_seed(5))
    return [(_eval(Wav2Vec2Model(config)), (audio,))]


def hf_phi3() -> Target:
    from transformers import Phi3Config, Phi3Model

    torch.manual_seed(SEED)
    config = Phi3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=1000, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return [(_eval(Phi3Model(config)), (_ids(2, 16),))]


def hf_qwen2_train() -> Target:
    """A causal-LM training step (the harness runs it with --backward)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=1000, max_position_embeddings=64,
    )  # fmt: skip
    return [(Qwen2ForCausalLM(config).train(), (_ids(2, 16),))]


def hf_clip_vision() -> Target:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(SEED)
    config = CLIPVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    return [(_eval(CLIPVisionModel(config)), (_image(2, 32),))]


def hf_t5_encoder() -> Target:
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(SEED)
    config = T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000)
    return [(_eval(T5EncoderModel(config)), (_ids(2, 16),))]


def hf_vit() -> Target:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(SEED)
    config = ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=8
    )
    return [(_eval(ViTModel(config)), (_image(2, 32),))]


def hf_whisper_encoder() -> Target:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(SEED)
    config = WhisperConfig(
        d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=32, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=128,
    )  # fmt: skip
    features = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(3))
    return [(_eval(WhisperEncoder(config)), (features,))]


# -- timm -----------------------------------------------------------------------------------------------
def _timm(name: str, **kwargs: Any) -> torch.nn.Module:
    import timm

    torch.manual_seed(SEED)
    return timm.create_model(name, pretrained=False, **kwargs)


def timm_convnext() -> Target:
    return [(_eval(_timm("convnext_atto", num_classes=10)), (_image(2, 32),))]


def timm_resnet_train() -> Target:
    """A training step (the harness runs it with --backward)."""
    return [(_timm("resnet10t", num_classes=10).train(), (_image(2, 32),))]


def timm_regnet() -> Target:
    """RegNetY-1.6GF at its own width (its verified part was measured on an H200: first call 0.49 s)."""
    return [(_eval(_timm("regnety_016", num_classes=10)), (_image(2, 64),))]


def timm_vit() -> Target:
    model = _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)
    return [(_eval(model), (_image(2, 32),))]


# -- torchvision ----------------------------------------------------------------------------------------
def tv_resnet() -> Target:
    from torchvision.models import resnet18

    torch.manual_seed(SEED)
    return [(_eval(resnet18(num_classes=10)), (_image(2, 32),))]


def tv_efficientnet() -> Target:
    """EfficientNet-B0 at its own width (its precompiled part made the first call slower on an H200)."""
    from torchvision.models import efficientnet_b0

    torch.manual_seed(SEED)
    return [(_eval(efficientnet_b0(num_classes=10)), (_image(2, 64),))]


def tv_swin() -> Target:
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(SEED)
    model = SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4], num_classes=10
    )
    return [(_eval(model), (_image(2, 32),))]


# -- torch-geometric -------------------------------------------------------------------------------------
class _GCN(torch.nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.conv1 = GCNConv(features, hidden)
        self.conv2 = GCNConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)  # type: ignore[no-any-return]


def pyg_gcn() -> Target:
    """A two-layer GCN on a random graph (its part was left out on an H200, torch 2.11: ``install_failed``,
    ``'_Missing' object has no attribute 'implements'``)."""
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(20, 16, generator=generator)
    edge_index = torch.randint(0, 20, (2, 60), generator=generator)
    return [(_eval(_GCN()), (x, edge_index))]


# -- the global state of a pod -----------------------------------------------------------------------------
class _LayerLoop(torch.nn.Module):
    """Python builtins (``range``, ``len``) in its traced code: Dynamo installs a builtins dict into the
    module's globals under a minted name, which a loaded precompiled entry brings from the warm-up's
    process; a recompile in the pod then mints the same name (torch 2.11-2.14)."""

    def __init__(self, width: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index in range(len(self.layers)):
            x = torch.nn.functional.gelu(self.layers[index](x))
        return x


def layer_loop() -> Target:
    """The smallest model on which a pod whose global state differs from the warm-up's recompiles a loaded
    precompiled frame (tests/cachelib/test_precompile_pods.py)."""
    torch.manual_seed(SEED)
    return [(_eval(_LayerLoop()), (torch.randn(4, 16, generator=torch.Generator().manual_seed(4)),))]


# -- dynamic shapes -------------------------------------------------------------------------------------
def hf_gpt2_dynamic() -> Target:
    """Compiled with --dynamic true; the pod also calls it with another sequence length."""
    return hf_gpt2()


SECOND_INPUTS: dict[str, Callable[[], tuple[Any, ...]]] = {"hf_gpt2_dynamic": lambda: (_ids(3, 24),)}
"""Another input for the dynamic-shape cases: the pod calls the model with it too."""
