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

from probe.surgery.ablate import Ablation

from .base import Adapter, LayerWeights

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

    # --- attention paths (probe.analyses.paths) ---------------------------------------
    # Post-LN, content stream only.  In the SAN+skip variant a layer is
    # a = LN(x + o(attention(x))) (post_attention with residual=True; no biases in v, o).
    # Frozen per layer: the content-stream attention probabilities, read as the output of
    # the *first* call of rel_attn.dropout (rel_attn_core applies it to attn_prob, shape
    # (batch, head, query, key), before post_attention applies it to attn_out), and the
    # per-token 1/sigma of rel_attn.layer_norm from its input x + o(attn_vec).

    def attention_probs(self, layer) -> torch.Tensor:
        return layer.rel_attn.dropout.output  # first call: attn_prob (batch, head, token, token)

    def norm_input(self, layer) -> torch.Tensor:
        return self.batch_first(layer.rel_attn.layer_norm.input)  # (batch, token, hidden)

    def layer_weights(self, model, index: int) -> LayerWeights:
        rel = model.layer[index].rel_attn
        v, o = rel.v.detach(), rel.o.detach()  # both (hidden, head, head_dim)
        heads, head_dim = v.shape[1], v.shape[2]
        return LayerWeights(
            w_v=v.permute(1, 0, 2),  # (head, hidden, head_dim)
            b_v=v.new_zeros(heads, head_dim),
            w_o=o.permute(1, 2, 0),  # attn_out[h'] = sum_{n,d} vec[n,d] o[h',n,d]
            b_o=v.new_zeros(v.shape[0]),
            gamma=rel.layer_norm.weight.detach(),
            beta=rel.layer_norm.bias.detach(),
            eps=rel.layer_norm.eps,
            norm="post",
        )
