"""Tiny models for the path tests: L=3 layers, H=2 heads, so (H+1)^L = 27 paths."""

from __future__ import annotations

import torch

from tests.reference.tiny import _MODEL_CLASSES, HIDDEN, _randomize_, tiny_config


def tiny_paths_model(family: str, layers: int = 3, heads: int = 2, seed: int = 0):
    """A float64 eval-mode model of ``family`` with ``layers`` x ``heads``, weights as tiny_model."""
    config = tiny_config(family)
    config.num_hidden_layers = layers  # attribute_map: n_layer for XLNet and GPT-2
    config.num_attention_heads = heads
    if family == "xlnet":
        config.d_head = HIDDEN // heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[family](config)
        _randomize_(model)
    return model.to(torch.float64).eval()


def ids(batch: int = 2, tokens: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 80, (batch, tokens), generator=torch.Generator().manual_seed(seed))
