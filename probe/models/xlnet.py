"""XLNet (post-LN, relative attention, sequence-first inside the model).

In a plain forward (no ``target_mapping``) only the content stream h runs::

    a = LN_attn(dropout(o(attention(x))) + x)    # rel_attn.post_attention(h, attn_vec)
    y = LN_ff(ff(a) + a)                         # XLNetFeedForward

==========  ==================================================  ============================================
ablation    probe (hook)                                        paper's surgery
==========  ==================================================  ============================================
no skip     ``post_attention(h, attn_vec, residual=False)``,    the same: ``post_attention(residual=False)``
            written as a keyword on that call through
            nnsight's ``.source``
no MLP      ``y = a``: XLNetFeedForward is skipped              the same: ``ff`` -> identity
==========  ==================================================  ============================================

Inside the model hidden states are ``(token, batch, hidden)``; the adapter
transposes every read to batch-first.  X_0 is the first layer's input, the word
embeddings after dropout.  Memories are switched off (``use_mems=False``).
"""

from __future__ import annotations

import torch

from ..ablate import Ablation
from .base import Adapter

#: The one-stream branch's call of post_attention, as nnsight's ``.source`` names it.
_POST_ATTENTION = "self_post_attention_2"


class XLNetAdapter(Adapter):
    family = "xlnet"
    model_types = ("xlnet",)
    forward_kwargs = {"use_mems": False}
    table = (
        {
            "ablation": "no skip",
            "probe": "rel_attn.post_attention(h, attn_vec, residual=False): LN(dropout(o(attn)))",
            "paper": "same: post_attention(residual=False)",
        },
        {
            "ablation": "no MLP",
            "probe": "layer output = attention sublayer output (ff skipped)",
            "paper": "same: ff -> identity",
        },
    )

    def max_tokens(self, config) -> int | None:
        return None  # relative positions: no table to run out of

    def layers(self, root):
        return root.layer

    def batch_first(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)  # (token, batch, hidden) -> (batch, token, hidden)

    def ablate(self, layer, ablation: Ablation) -> None:
        if not ablation.attn_skip:
            call = getattr(layer.rel_attn.source, _POST_ATTENTION)
            args, kwargs = call.inputs
            call.inputs = (args, {**kwargs, "residual": False})
        if not ablation.mlp:
            layer.ff.skip(layer.ff.input)
