"""GPT-2 (pre-LN, causal).

One block computes::

    h = x + attn(ln_1(x))          # residual_0 = x
    y = h + mlp(ln_2(h))

==========  ===================================================  ============================================
ablation    probe (hook)                                         paper's surgery
==========  ===================================================  ============================================
no skip     ``h = attn(ln_1(x))``: the block's ``residual``      not in the paper (GPT-2 was not probed);
            before the attention is replaced by zeros            probe's definition: drop the identity term
            (through nnsight's ``.source``; exact)               of the attention residual sum
no MLP      ``y = h``: ln_2 and mlp are skipped, the MLP         same definition: MLP, its norm and its
            branch adds zeros                                     residual removed
==========  ===================================================  ============================================

Pre-LN means that without the skip each layer's input reaches the attention
only through ``ln_1``, so a SAN here is a stack of LayerNorm -> attention maps.
The last residual-stream entry is the last block's output *before* ``ln_f``
(HuggingFace's last ``hidden_states`` entry is after it).
"""

from __future__ import annotations

import torch

from ..ablate import Ablation
from .base import Adapter


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    table = (
        {
            "ablation": "no skip",
            "probe": "h = attn(ln_1(x)) instead of x + attn(ln_1(x)) (the block's residual set to zero)",
            "paper": "not probed in the paper; same definition as for the other families",
        },
        {
            "ablation": "no MLP",
            "probe": "block output = h (ln_2 and mlp skipped)",
            "paper": "not probed in the paper; same definition as for the other families",
        },
    )

    stream_note = (
        "X_l is block l's output, the residual sum before the next block's ln_1 (pre-LN); "
        "X_L is taken before ln_f; X_0 the token plus position embeddings"
    )
    paper_surgery = "not probed in the paper: --surgery paper applies probe's definition"

    def layers(self, root):
        return root.h

    def ablate(self, layer, ablation: Ablation) -> None:
        if not ablation.attn_skip:
            residual = layer.source.residual_0  # `residual = hidden_states` before ln_1
            residual.output = torch.zeros_like(residual.output)
        if not ablation.mlp:
            h = layer.ln_2.input  # (batch, token, hidden), the attention sublayer's output
            layer.ln_2.skip(h)
            layer.mlp.skip(torch.zeros_like(h))
