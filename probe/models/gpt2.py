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
from .base import Adapter, LayerWeights


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

    # --- attention paths (probe.analyses.paths) ---------------------------------------
    # Pre-LN.  In the SAN+skip variant a block is h = x + attn(ln_1(x)): the skip branch
    # is the identity and the frozen LayerNorm ln_1 (per-token 1/sigma from its input x)
    # sits on the heads' input only.  The attention probabilities are GPT2Attention's
    # second output.  The final ln_f is part of the output: the decomposition freezes it
    # too (1/sigma from the last block's output) and decomposes ln_f(X_L).
    norm_position = "pre"

    def attention_probs(self, layer) -> torch.Tensor:
        return layer.attn.output[1]  # (batch, head, token, token), causal

    def norm_input(self, layer) -> torch.Tensor:
        return layer.ln_1.input  # (batch, token, hidden)

    def paths_layer(self, layer, ablation: Ablation, norms: bool) -> dict:
        # Forward order: the skip's residual_0, ln_1, attn, then ln_2/mlp.
        if not ablation.attn_skip:
            self.ablate(layer, Ablation(attn_skip=False))
        reads = {"norm_input": self.norm_input(layer) if norms else None}
        reads["attn"] = self.attention_probs(layer)
        if not ablation.mlp:
            self.ablate(layer, Ablation(mlp=False))
        return reads

    def layer_weights(self, model, index: int) -> LayerWeights:
        block = model.h[index]
        hidden, heads = self.hidden_size(model.config), self.n_heads(model.config)
        weight, bias = block.attn.c_attn.weight.detach(), block.attn.c_attn.bias.detach()
        # Conv1D: y = x W + b, W (hidden, 3 hidden) = [query | key | value], heads contiguous.
        w_v = weight[:, 2 * hidden :].reshape(hidden, heads, -1).permute(1, 0, 2)
        proj = block.attn.c_proj
        return LayerWeights(
            w_v=w_v,
            b_v=bias[2 * hidden :].reshape(heads, -1),
            w_o=proj.weight.detach().reshape(heads, -1, hidden),
            b_o=proj.bias.detach(),
            gamma=block.ln_1.weight.detach(),
            beta=block.ln_1.bias.detach(),
            eps=block.ln_1.eps,
            norm="pre",
        )

    def final_norm(self, model):
        return model.ln_f.weight.detach(), model.ln_f.bias.detach(), model.ln_f.eps

    def lm_head(self, model) -> torch.Tensor | None:
        # GPT2LMHeadModel's lm_head (no bias) is tied to wte unless the config unties it.
        return model.wte.weight.detach() if model.config.tie_word_embeddings else None
