"""Tiny Fastformer checkpoints for the tests: the shared format, drawn by hand.

The weights come from ``tests.reference.fastformer.state_dict_for`` (no probe
code involved); ``tiny_fastformer`` loads them into probe's model class.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.reference.fastformer import state_dict_for

TINY = {
    "hidden_size": 32,
    "vocab_size": 80,
    "n_heads": 4,
    "max_position_embeddings": 64,
    "num_hidden_layers": 3,
    "convolve": False,
    "groups": 1,
    "kernel_size": 4,
    "hidden_dropout_prob": 0.1,
    "initializer_range": 0.02,
    "label_smoothing": 0,
}


def tiny_config(**changes) -> dict:
    return {**TINY, **changes}


def write_shared_format(folder: Path, config: dict, seed: int = 0, dtype=torch.float64) -> dict:
    """config.json + pytorch_model.bin (both tied keys), as transformers 4.x wrote them."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = state_dict_for(config, seed, dtype)
    (folder / "config.json").write_text(
        json.dumps({"model_type": "FastformerForCausalLM", **config}, indent=2)
    )
    torch.save(sd, folder / "pytorch_model.bin")
    return sd


def tiny_fastformer(seed: int = 0, dtype=torch.float64, **changes):
    """probe's FastformerForCausalLM holding ``state_dict_for(tiny_config(**changes), seed)``."""
    from probe.fastformer import FastformerConfig, FastformerForCausalLM

    config = tiny_config(**changes)
    model = FastformerForCausalLM(FastformerConfig(**config)).to(dtype)
    model.load_state_dict(state_dict_for(config, seed, dtype))
    return model.eval()
