"""Which keys each query sees, written from the configs and the masks' definitions
(imports nothing from probe).

``allowed(config, layers, tokens, kind, width)``: (layer, query, key) bool, padding aside.

* a mask of the run's own (``kind`` not None): ``tests/reference/masked_attention.pattern``
  at every layer;
* the model's own mask (``kind`` None): causal in a decoder, complete in an encoder (the
  encoders are listed here by model type); where the config gives a sliding window, the
  layers it names (``layer_types[l] == "sliding_attention"``, every layer where the config
  has no ``layer_types``) see only the keys within it: a decoder's query i the keys
  i - W < j <= i (transformers' ``sliding_window`` counts the query itself), ModernBERT's
  |i - j| <= W (its ``sliding_window`` is half the local attention's width).
"""

from __future__ import annotations

import numpy as np

from tests.reference.masked_attention import pattern

#: The model types whose own mask is complete (every query sees every key).
ENCODERS = frozenset(
    {
        "albert",
        "bert",
        "deberta-v2",
        "distilbert",
        "electra",
        "modernbert",
        "roberta",
        "t5",
        "vit",
        "xlnet",
    }  # fmt: skip
)


def _sliding(config, layer: int) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and types[layer] != "sliding_attention":
        return None
    return int(window)


def own(config, layer: int, tokens: int) -> np.ndarray:
    """(query, key) bool of the model's own mask at ``layer`` (0-based), entry by entry."""
    encoder = config.model_type in ENCODERS
    window = _sliding(config, layer)
    out = np.zeros((tokens, tokens), dtype=bool)
    for i in range(tokens):
        for j in range(tokens):
            if encoder:
                out[i, j] = window is None or abs(i - j) <= window
            else:
                out[i, j] = j <= i and (window is None or i - j < window)
    return out


def allowed(config, layers: int, tokens: int, kind: str | None = None, width=None) -> np.ndarray:
    """(layer, query, key) bool: the run's mask ``kind`` (with ``width``), or the model's own."""
    if kind is not None:
        return np.stack([pattern(kind, width, tokens).numpy()] * layers)
    return np.stack([own(config, layer, tokens) for layer in range(layers)])
