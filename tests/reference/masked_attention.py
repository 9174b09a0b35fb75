"""A hand-written masked attention for the references (imports nothing from probe).

Every query sees the keys a pattern allows and that are real tokens; the padding is the
2D attention mask the caller passes (not read from the model's mask), the pattern a
function of (query position, key position) written out with loops.  Registered with
transformers under its own name, so that a model runs it through its own code.
"""

from __future__ import annotations

import torch

from tests.reference.attention import reference_eager

NAME = "reference_masked"
_STATE: dict = {}

PATTERNS = {
    "bidirectional": lambda i, j, w: True,
    "causal": lambda i, j, w: j <= i,
    "window": lambda i, j, w: abs(i - j) <= w,
    "causal-window": lambda i, j, w: i - w <= j <= i,
}


def pattern(kind: str, width: int | None, tokens: int) -> torch.Tensor:
    """(tokens, tokens) bool, filled one entry at a time."""
    allowed = torch.zeros(tokens, tokens, dtype=torch.bool)
    for i in range(tokens):
        for j in range(tokens):
            allowed[i, j] = bool(PATTERNS[kind](i, j, width))
    return allowed


def reference_masked(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     softcap=None, **kwargs):  # fmt: skip
    kind, width, padding = _STATE["kind"], _STATE["width"], _STATE["padding"]
    batch, tokens = query.shape[0], key.shape[-2]
    allowed = pattern(kind, width, tokens)[None, None].repeat(batch, 1, 1, 1)
    if padding is not None:
        allowed &= padding.bool()[:, None, None, :tokens]
    additive = torch.zeros(allowed.shape, dtype=query.dtype)
    additive[~allowed] = torch.finfo(query.dtype).min
    return reference_eager(module, query, key, value, additive, scaling, dropout, softcap,
                           position_bias=kwargs.get("position_bias"),
                           s_aux=kwargs.get("s_aux"))  # fmt: skip


def use(kind: str, width: int | None, padding: torch.Tensor | None) -> str:
    """Register the masked attention with this mask and padding (batch, token); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    _STATE.update(kind=kind, width=width, padding=padding)
    AttentionInterface.register(NAME, reference_masked)
    AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
