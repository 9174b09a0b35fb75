"""Layers and heads of well-known architectures, for counting their attention paths.

Each entry is (L, H) as published in the model's own configuration (the
``config.json`` on the HuggingFace hub, or the paper's table where no config was
released), not read off a figure's label; the source is recorded beside it and
travels into the Dataset and the report.

Conventions: H counts *query* heads, because every query head has its own
attention matrix and so opens its own path (grouped-query models such as
Llama 3 and Mistral share key/value projections between query heads, which does
not merge their attention probabilities).  For the encoder-decoder T5, L is one
stack (the encoder's 24 self-attention layers; the decoder has as many, each
with cross-attention as well, and is not counted).
"""

from __future__ import annotations

from typing import NamedTuple


class Preset(NamedTuple):
    name: str
    layers: int
    heads: int
    group: str  # "paper": the architectures of the paper's path-length figure; "today"
    source: str


PAPER = "paper"
TODAY = "today"

PRESETS: tuple[Preset, ...] = (
    Preset(
        "DistilBERT", 6, 12, PAPER, "distilbert-base-uncased config.json: n_layers=6, n_heads=12"
    ),
    Preset(
        "MobileBERT",
        24,
        4,
        PAPER,
        "google/mobilebert-uncased config.json: num_hidden_layers=24, num_attention_heads=4",
    ),
    Preset(
        "BERT-Base/ViT-B",
        12,
        12,
        PAPER,
        "bert-base-uncased and google/vit-base-patch16-224 config.json: "
        "num_hidden_layers=12, num_attention_heads=12",
    ),
    Preset(
        "BERT-Large/ViT-L",
        24,
        16,
        PAPER,
        "bert-large-uncased and google/vit-large-patch16-224 config.json: "
        "num_hidden_layers=24, num_attention_heads=16",
    ),
    Preset(
        "ViT-H",
        32,
        16,
        PAPER,
        "google/vit-huge-patch14-224-in21k config.json: num_hidden_layers=32, "
        "num_attention_heads=16 (Dosovitskiy et al. 2021, Table 1)",
    ),
    Preset(
        "T5-3B",
        24,
        32,
        PAPER,
        "t5-3b config.json: num_layers=24 per stack (num_decoder_layers=24), num_heads=32",
    ),
    Preset(
        "T5-11B",
        24,
        128,
        PAPER,
        "t5-11b config.json: num_layers=24 per stack (num_decoder_layers=24), num_heads=128",
    ),
    Preset(
        "GPT-3 175B",
        96,
        96,
        PAPER,
        "Brown et al. 2020, Table 2.1 (GPT-3 175B): n_layers=96, n_heads=96",
    ),
    Preset(
        "DeiT-T",
        12,
        3,
        PAPER,
        "facebook/deit-tiny-patch16-224 config.json: num_hidden_layers=12, "
        "num_attention_heads=3 (Touvron et al. 2021, Table 1)",
    ),
    Preset("GPT-2", 12, 12, TODAY, "gpt2 config.json: n_layer=12, n_head=12"),
    Preset("GPT-2 medium", 24, 16, TODAY, "gpt2-medium config.json: n_layer=24, n_head=16"),
    Preset("GPT-2 large", 36, 20, TODAY, "gpt2-large config.json: n_layer=36, n_head=20"),
    Preset("GPT-2 XL", 48, 25, TODAY, "gpt2-xl config.json: n_layer=48, n_head=25"),
    Preset(
        "Llama 3 8B",
        32,
        32,
        TODAY,
        "meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers=32, "
        "num_attention_heads=32 (num_key_value_heads=8)",
    ),
    Preset(
        "Llama 3 70B",
        80,
        64,
        TODAY,
        "meta-llama/Meta-Llama-3-70B config.json: num_hidden_layers=80, "
        "num_attention_heads=64 (num_key_value_heads=8)",
    ),
    Preset(
        "Mistral 7B",
        32,
        32,
        TODAY,
        "mistralai/Mistral-7B-v0.1 config.json: num_hidden_layers=32, "
        "num_attention_heads=32 (num_key_value_heads=8)",
    ),
)
