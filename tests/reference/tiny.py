"""Tiny random base models for the reference oracle (no ``probe``/``nnsight`` imports).

``tiny_model(family, seed)`` builds one of the four base models the project studies
(``BertModel``, ``AlbertModel``, ``XLNetModel``, ``GPT2Model``) at toy size, in eval
mode with ``attn_implementation="eager"`` and the configs' default dropout
probabilities (inactive in eval mode).

Construction is deterministic from ``seed``: the global torch RNG is seeded
(inside ``torch.random.fork_rng``, so the caller's RNG state is left as it was)
before the model is built.  After HuggingFace's own initialisation every floating
parameter is redrawn from the same seeded RNG: LayerNorm gains ~ 1 + 0.2 N(0, 1),
everything else (weights, biases, LayerNorm shifts, embeddings, XLNet's relative
attention biases and segment embeddings) ~ 0.15 N(0, 1).  HF's default init
(std 0.02, zero biases, unit gains) makes attention almost uniform and every bias
zero, which would let bias- or norm-placement mistakes pass unnoticed.
"""

from __future__ import annotations

import torch
from transformers import (
    AlbertConfig,
    AlbertModel,
    BertConfig,
    BertModel,
    GPT2Config,
    GPT2Model,
    PretrainedConfig,
    XLNetConfig,
    XLNetModel,
)

FAMILIES = ("bert", "albert", "xlnet", "gpt2")

VOCAB_SIZE = 80
HIDDEN = 32
HEADS = 4
MAX_POSITIONS = 64


def tiny_config(family: str) -> PretrainedConfig:
    """The config of ``tiny_model(family)`` (eager attention, default dropout)."""
    if family == "bert":
        return BertConfig(
            vocab_size=VOCAB_SIZE,
            hidden_size=HIDDEN,
            num_hidden_layers=2,
            num_attention_heads=HEADS,
            intermediate_size=64,
            max_position_embeddings=MAX_POSITIONS,
            attn_implementation="eager",
        )
    if family == "albert":
        # As albert-base-v2: one layer group holding one layer, applied
        # num_hidden_layers times; embedding_size != hidden_size, so the encoder's
        # embedding_hidden_mapping_in is a real projection.
        return AlbertConfig(
            vocab_size=VOCAB_SIZE,
            embedding_size=16,
            hidden_size=HIDDEN,
            num_hidden_layers=3,
            num_hidden_groups=1,
            inner_group_num=1,
            num_attention_heads=HEADS,
            intermediate_size=64,
            max_position_embeddings=MAX_POSITIONS,
            attn_implementation="eager",
        )
    if family == "xlnet":
        return XLNetConfig(
            vocab_size=VOCAB_SIZE,
            d_model=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            d_head=HIDDEN // HEADS,
            d_inner=64,
            mem_len=None,
            attn_implementation="eager",
        )
    if family == "gpt2":
        return GPT2Config(
            vocab_size=VOCAB_SIZE,
            n_positions=MAX_POSITIONS,
            n_embd=HIDDEN,
            n_layer=2,
            n_head=HEADS,
            bos_token_id=VOCAB_SIZE - 1,
            eos_token_id=VOCAB_SIZE - 1,
            attn_implementation="eager",
        )
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


_MODEL_CLASSES = {
    "bert": BertModel,
    "albert": AlbertModel,
    "xlnet": XLNetModel,
    "gpt2": GPT2Model,
}


def _randomize_(model: torch.nn.Module) -> None:
    """Redraw every floating parameter from the (already seeded) global RNG."""
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if not param.is_floating_point():
                    continue
                if isinstance(module, torch.nn.LayerNorm) and name == "weight":
                    param.copy_(1.0 + 0.2 * torch.randn_like(param))
                else:
                    param.copy_(0.15 * torch.randn_like(param))


def tiny_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A tiny random ``family`` base model in eval mode, deterministic from ``seed``."""
    config = tiny_config(family)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[family](config)
        _randomize_(model)
    return model.to(dtype).eval()
