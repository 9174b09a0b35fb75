"""ALBERT (post-LN, one layer shared across depth).

The shared ``AlbertLayer`` is applied L times; each application computes::

    a = LN_attn(x + dense(attention(x)))                 # inside AlbertAttention
    y = LN_full(ffn_output(act(ffn(a))) + a)             # full_layer_layer_norm

==========  ================================================  ===============================================
ablation    probe (hook)                                      paper's surgery
==========  ================================================  ===============================================
no skip     ``a = LN_attn(dense(attention(x)))``: the         the same
            attention LayerNorm's input is replaced by the
            projected attention output (exact)
no MLP      ``y = a``: ffn, ffn_output and                    ``ffn`` and ``ffn_output`` set to identity: the
            full_layer_layer_norm are skipped                 activation, the MLP's residual and the final
                                                              LN stay, so ``y = LN_full(gelu(a) + a)``
==========  ================================================  ===============================================

``Ablation(surgery="paper")`` (``surgery="paper"`` of an analysis) applies the right-hand
column: for "no MLP" the adapter makes ``ffn`` and ``ffn_output`` return their
inputs and leaves the rest running.  At random init this keeps SAN+skip near
0.26-0.32 after 12 layers (the value in the paper's ALBERT figure), where
probe's definition reaches 0.07-0.08.

The ablation is written on every application of the shared layer: the trace
loops over ``tracer.iter[:L]`` so each read binds to the matching call.  The
residual stream X_0 is the output of ``embedding_hidden_mapping_in`` (the
embeddings projected to the hidden size); configurations with several layer
groups (``num_hidden_groups > 1``) are not supported.
"""

from __future__ import annotations

import torch

from probe.surgery.ablate import Ablation

from ..errors import ProbeError
from .base import Adapter, LayerWeights, linear_heads


class AlbertAdapter(Adapter):
    family = "albert"
    model_types = ("albert",)
    table = (
        {
            "ablation": "no skip",
            "probe": "attention sublayer output LN(dense(attn(x))): the attention LayerNorm reads only the projection",
            "paper": "same",
        },
        {
            "ablation": "no MLP",
            "probe": "layer output = attention sublayer output (ffn, ffn_output, full_layer_layer_norm skipped)",
            "paper": "ffn and ffn_output set to identity: the activation, the MLP's residual and the final LayerNorm stay, so the layer outputs LN(gelu(a) + a)",
        },
    )
    unused_modules = ("pooler",)  # the [CLS] head; the residual stream never passes it
    paper_surgery = "differs for no MLP: ffn and ffn_output become identities, the layer outputs LN(gelu(a) + a)"

    def check(self, config) -> None:
        if config.num_hidden_groups != 1:
            raise ProbeError(
                f"ALBERT with num_hidden_groups={config.num_hidden_groups} is not supported; "
                "probe traces the shared-layer layout of the released checkpoints (one group)"
            )

    def ablate(self, layer, ablation: Ablation) -> None:
        if not ablation.attn_skip:
            attn = layer.attention
            attn.LayerNorm.input = attn.output_dropout.output  # (batch, token, hidden)
        if not ablation.mlp and ablation.surgery == "paper":
            layer.ffn.skip(layer.ffn.input)  # activation(a) follows, then ffn_output
            layer.ffn_output.skip(layer.ffn_output.input)
        elif not ablation.mlp:
            attended = layer.attention.output[0]
            layer.ffn.skip(attended)
            layer.activation.skip(attended)
            layer.ffn_output.skip(attended)
            layer.full_layer_layer_norm.skip(attended)

    def stream(self, root, tracer, ablation: Ablation):
        encoder = root.encoder
        group = encoder.albert_layer_groups[0]
        yield encoder.embedding_hidden_mapping_in.output
        # One shared group, called once per layer: iteration i binds every read
        # and write in the body to the i-th call.
        for _ in tracer.iter[: self.n_layers(root._module.config)]:
            if not ablation.is_identity:
                for layer in group.albert_layers:
                    self.ablate(layer, ablation)
            yield group.output

    # --- attention paths (probe.analyses.paths) ---------------------------------------
    # Post-LN, one shared layer.  In the SAN+skip variant an application is
    # a = LN_attn(x + dense(attention(x))).  Frozen per application (the trace loops over
    # tracer.iter, so application l binds to the l-th call): the attention probabilities,
    # AlbertAttention's second output, and the per-token 1/sigma of
    # AlbertAttention.LayerNorm from its input x + dense(ctx).  The weights are the same
    # for every layer index; the frozen quantities differ per application.

    def attention_probs(self, layer) -> torch.Tensor:
        return layer.attention.output[1]  # (batch, head, token, token)

    def norm_input(self, layer) -> torch.Tensor:
        return layer.attention.LayerNorm.input  # (batch, token, hidden)

    def paths_layer(self, layer, ablation: Ablation, norms: bool) -> dict:
        # The LayerNorm runs inside AlbertAttention, before the module returns its probabilities.
        reads = {"norm_input": self.norm_input(layer) if norms else None}
        reads["attn"] = self.attention_probs(layer)
        if not ablation.is_identity:
            self.ablate(layer, ablation)
        return reads

    def paths_stream(
        self, root, tracer, ablation: Ablation, norms: bool = True, masks: bool = False
    ):
        encoder = root.encoder
        group = encoder.albert_layer_groups[0]
        yield {"x": encoder.embedding_hidden_mapping_in.output}
        for _ in tracer.iter[: self.n_layers(root._module.config)]:
            reads = {}
            for layer in group.albert_layers:
                reads = self.paths_layer(layer, ablation, norms)
            reads["x"] = group.output  # (batch, token, hidden)
            yield reads

    def layer_weights(self, model, index: int) -> LayerWeights:
        attention = model.encoder.albert_layer_groups[0].albert_layers[0].attention
        heads = self.n_heads(model.config)
        return LayerWeights(
            *linear_heads(attention.value, attention.dense, heads),
            gamma=attention.LayerNorm.weight.detach(),
            beta=attention.LayerNorm.bias.detach(),
            eps=attention.LayerNorm.eps,
            norm="post",
        )
