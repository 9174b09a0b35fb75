"""Layers and heads of well-known architectures, for counting their attention paths.

Each entry is (L, H) as published in the model's own configuration (the
``config.json`` on the HuggingFace hub, or the paper's table where no config was
released), not read off a figure's label; the source is recorded beside it and
travels into the Dataset and the report.  Two kinds of entries:

* written here by hand: the architectures of the paper's path-length figure
  (``paper``), and today's models whose configs probe does not ship (``today``);
* read from the configs that ship with probe (``probe/configs/*.json``, the hub's
  own files), one entry per file, named by its hub id (``today``): Llama-3.2-1B,
  Qwen, Gemma-2, Phi-3, Mistral, Pythia, OPT, GPT-J, Falcon, RoBERTa, DeBERTa-v3,
  ELECTRA, ModernBERT, T5, GPT-2 and the others.  A shipped config that a paper
  entry already stands for (``configs``) is not repeated; the tests check that the
  hand-written (L, H) of such an entry is the one its config file says.

Conventions: H counts *query* heads, because every query head has its own
attention matrix and so opens its own path (grouped-query models such as
Llama 3 and Mistral share key/value projections between query heads, which does
not merge their attention probabilities).  For the encoder-decoder T5, L is one
stack (the encoder's self-attention layers; the decoder has as many, each with
cross-attention as well, and is not counted).
"""

from __future__ import annotations

import functools
import json
from typing import NamedTuple


class Preset(NamedTuple):
    """An architecture whose paths [`paths.count`][probe.analyses.paths.count] counts.

    Attributes
    ----------
    name : str
        The architecture's name (`DistilBERT`, `GPT-3`, ...).
    layers : int
        L.
    heads : int
        H.
    group : str
        `"paper"`: the architectures of the paper's path-length figure; `"today"`: later
        ones; `"given"`: a shape given by hand; `"model"`: a model's config.
    source : str
        Where its L and H come from.
    configs : tuple[str, ...]
        Hub ids of shipped configs this entry stands for (they are not listed again).
    """

    name: str
    layers: int
    heads: int
    group: str  # "paper": the architectures of the paper's path-length figure; "today"
    source: str
    #: Hub ids of shipped configs this entry stands for (they are not listed again).
    configs: tuple[str, ...] = ()


PAPER = "paper"
TODAY = "today"

PRESETS: tuple[Preset, ...] = (
    Preset(
        "DistilBERT",
        6,
        12,
        PAPER,
        "distilbert-base-uncased config.json: n_layers=6, n_heads=12",
        ("distilbert/distilbert-base-uncased",),
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
        ("bert-base-uncased", "google/vit-base-patch16-224"),
    ),
    Preset(
        "BERT-Large/ViT-L",
        24,
        16,
        PAPER,
        "bert-large-uncased and google/vit-large-patch16-224 config.json: "
        "num_hidden_layers=24, num_attention_heads=16",
        ("bert-large-uncased",),
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
)


@functools.cache
def shipped_presets() -> tuple[Preset, ...]:
    """One entry per config shipped with probe, (L, H) read from the file itself.

    The file is read as every command reads it (``probe.loading.read_config``), and L, H
    through the family's adapter, so ``n_layer``, ``num_layers`` and ``num_hidden_layers``
    all mean the same.  Configs a hand-written entry stands for are left out.
    """
    from probe.loading import bundled_configs, read_config
    from probe.models import adapter_for

    covered = {hub_id for preset in PRESETS for hub_id in preset.configs}
    files = {}
    for hub_id, path in sorted(bundled_configs().items(), key=lambda item: item[0].lower()):
        canonical = path.stem.replace("--", "/")
        if hub_id == canonical and hub_id not in covered:
            files[hub_id] = path
    rows = []
    for hub_id, path in files.items():
        config, _ = read_config(hub_id, prefer_bundled=True)
        adapter = adapter_for(config.model_type)
        layers, heads = adapter.n_layers(config), adapter.n_heads(config)
        data = json.loads(path.read_text())
        kv = data.get("num_key_value_heads") or data.get("num_kv_heads")
        grouped = f" ({kv} key/value heads)" if kv and kv != heads else ""
        if data.get("multi_query") and not data.get("new_decoder_architecture"):
            grouped = " (multi-query: one key/value head)"
        source = (
            f"{hub_id} config.json, shipped with probe as configs/{path.name}: "
            f"L={layers}, H={heads}{grouped}"
        )
        rows.append(Preset(hub_id, layers, heads, TODAY, source))
    return tuple(rows)


def all_presets() -> tuple[Preset, ...]:
    """The hand-written presets, then one per shipped config (what ``count`` counts given no shape)."""
    return PRESETS + shipped_presets()
