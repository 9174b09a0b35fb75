"""BERT (post-LN): ``BertModel`` and any checkpoint with ``model_type == "bert"``.

One layer computes, with ``SelfOutput`` and ``Output`` the two sublayer tails::

    a = LN_1(dense_1(attention(x)) + x)          # BertSelfOutput(h, input_tensor=x)
    y = LN_2(dense_2(act(dense_i(a))) + a)       # BertIntermediate, BertOutput

==========  ===============================================  ==========================================
ablation    probe (hook)                                     paper's surgery
==========  ===============================================  ==========================================
no skip     ``a = LN_1(dense_1(attention(x)))``: the         the same: LN kept, ``LN(dense(h))``
            ``input_tensor`` argument of BertSelfOutput      instead of ``LN(dense(h) + x)``
            is replaced by zeros (exact, no subtraction)
no MLP      ``y = a``: BertIntermediate and BertOutput are   the same: MLP, its residual and its LN
            skipped and return the attention output          replaced by identity
==========  ===============================================  ==========================================

nnsight serves the submodules called ``output`` as ``.E_output``; ``.output``
stays the module's return value.
"""

from __future__ import annotations

import torch

from ..ablate import Ablation
from .base import Adapter, LayerWeights, linear_heads


class BertAdapter(Adapter):
    family = "bert"
    model_types = ("bert",)
    table = (
        {
            "ablation": "no skip",
            "probe": "attention sublayer output LN(dense(attn(x))): BertSelfOutput's input_tensor set to zero",
            "paper": "same: LayerNorm kept, LN(dense(h)) instead of LN(dense(h)+x)",
        },
        {
            "ablation": "no MLP",
            "probe": "layer output = attention sublayer output (BertIntermediate and BertOutput skipped)",
            "paper": "same: MLP, its residual and its LayerNorm replaced by identity",
        },
    )

    unused_modules = ("pooler",)  # the [CLS] head; the residual stream never passes it

    def layers(self, root):
        return root.encoder.layer

    def ablate(self, layer, ablation: Ablation) -> None:
        if not ablation.attn_skip:
            tail = layer.attention.E_output  # BertSelfOutput(hidden_states, input_tensor)
            (hidden, residual), kwargs = tail.inputs
            tail.inputs = ((hidden, torch.zeros_like(residual)), kwargs)
        if not ablation.mlp:
            attended = layer.attention.output[0]  # (batch, token, hidden)
            layer.intermediate.skip(attended)
            layer.E_output.skip(attended)

    # --- attention paths (probe.analyses.paths) ---------------------------------------
    # Post-LN.  In the SAN+skip variant a layer is a = LN_1(x + dense(attention(x))).
    # The decomposition freezes, per layer: the attention probabilities A_h, returned by
    # BertSelfAttention (eager) as its second output, and the per-token 1/sigma of LN_1 =
    # BertSelfOutput.LayerNorm, computed from that LayerNorm's input x + dense(ctx).  The
    # frozen LN sits after the sum of skip and heads, so it scales both branches.

    def attention_probs(self, layer) -> torch.Tensor:
        return layer.attention.self.output[1]  # (batch, head, token, token)

    def norm_input(self, layer) -> torch.Tensor:
        return layer.attention.E_output.LayerNorm.input  # (batch, token, hidden)

    def layer_weights(self, model, index: int) -> LayerWeights:
        attention = model.encoder.layer[index].attention
        heads = self.n_heads(model.config)
        norm = attention.output.LayerNorm
        return LayerWeights(
            *linear_heads(attention.self.value, attention.output.dense, heads),
            gamma=norm.weight.detach(),
            beta=norm.bias.detach(),
            eps=norm.eps,
            norm="post",
        )
