"""Every family probe walks with the generic walker, one entry each (see ``family.py``).

Each entry lists one layer's steps in forward order.  The operation names
(``:residual_0``, ``:hidden_states_0``) are nnsight's names for lines of the
layer's ``forward`` in transformers 5; the comment beside each names the line.
``probe check MODEL`` (and every run, before its numbers) verifies that the edits
still mean what the table says.

Adding a family: one entry here (usually a call of :func:`~probe.models.builders.decoder`,
:func:`~probe.models.builders.pre_ln` or :func:`~probe.models.builders.bert_like`), one tiny
config in ``tests/reference/tiny.py`` and its reference entry in ``tests/reference/``;
``docs/adding-a-family.md`` walks through one.
"""

from __future__ import annotations

from .builders import (
    DECODER_KWARGS,
    GEMMA_NOTE,
    bert_like,
    decoder,
    gemma_sandwich,
    gpt2_like,
    pre_ln,
)
from .by_config import (
    bigcode_heads,
    bloom_refuse,
    deberta_refuse,
    falcon_norm,
    falcon_steps,
    neox_mlp_branch,
    neox_steps,
    neox_style,
    opt_steps,
    opt_style,
    stablelm_steps,
    stablelm_style,
    t5_mlp,
)
from .family import GATED_MLP, Family, Heads, Logits, Mlp, put, read, skip, zero

# --- the families -----------------------------------------------------------------


def _electra_like(name: str, model_types: tuple[str, ...], note: str) -> Family:
    return Family(
        name=name,
        model_types=model_types,
        layers="encoder.layer",
        style="post",
        steps=bert_like(),
        norm="attention.output.LayerNorm",
        norm_kind="layernorm",
        heads=Heads("attention.self.value", "attention.output.dense"),
        skip_means="a = LN(dense(attn(x))): BertSelfOutput's input_tensor (the residual) is zero",
        mlp_means="y = a: intermediate and output skipped, the layer returns its attention sublayer",
        unused_modules=("pooler",),
        source_note=note,
        mlp=Mlp("intermediate.dense", "output.dense"),
        mlp_branch="output.dropout",  # BertOutput: `LayerNorm(dropout(dense(h)) + input_tensor)`
    )


FAMILIES: tuple[Family, ...] = (
    _electra_like("bert", ("bert",), "BertSelfOutput.forward(hidden_states, input_tensor)"),
    _electra_like("roberta", ("roberta", "xlm-roberta", "camembert"), "as BERT"),
    _electra_like("electra", ("electra",), "as BERT"),
    Family(
        name="deberta-v2",
        model_types=("deberta-v2",),
        layers="encoder.layer",
        style="post",
        steps=bert_like(),
        norm="attention.output.LayerNorm",
        norm_kind="layernorm",
        heads=Heads("attention.self.value_proj", "attention.output.dense"),
        skip_means="a = LN(dense(attn(x))): DebertaV2SelfOutput's input_tensor is zero",
        mlp_means="y = a: intermediate and output skipped",
        forward_kwargs={"output_attentions": True},  # att_matrix is returned only then
        refuse=deberta_refuse,
        source_note="DebertaV2SelfOutput.forward(hidden_states, input_tensor)",
        mlp=Mlp("intermediate.dense", "output.dense"),
        mlp_branch="output.dropout",  # BertOutput: `LayerNorm(dropout(dense(h)) + input_tensor)`
    ),
    Family(
        name="distilbert",
        model_types=("distilbert",),
        layers="transformer.layer",
        style="post",
        steps=(
            read("probs", "attention", index=1),
            read("branch", "attention", index=0),
            read("norm", "sa_layer_norm", "input"),
            # `sa_layer_norm(attention_output + hidden_states)`: its input becomes the branch
            put("sa_layer_norm", "branch", part="input"),
            read("sublayer", "sa_layer_norm", when="no_mlp"),
            skip("ffn", "zeros", when="no_mlp"),
            skip("output_layer_norm", "sublayer"),
        ),
        norm="sa_layer_norm",
        norm_kind="layernorm",
        heads=Heads("attention.v_lin", "attention.out_lin"),
        skip_means="a = LN(attn(x)): sa_layer_norm's input is the attention output alone",
        mlp_means="y = a: ffn and output_layer_norm skipped",
        source_note="TransformerBlock.forward: `self.sa_layer_norm(attention_output + hidden_states)`",
        mlp=Mlp("ffn.lin1", "ffn.lin2"),
        mlp_branch="ffn",  # `output_layer_norm(ffn_output + sa_output)`
    ),
    gpt2_like(
        "gpt2",
        ("gpt2",),
        heads=Heads("attn.c_attn", "attn.c_proj", layout="conv1d"),
        source_note="GPT2Block.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("mlp.c_fc", "mlp.c_proj", layout="conv1d"),
    ),
    # GPT-BigCode: GPT-2's block with nn.Linear projections; multi-query or multi-head by
    # config, so the fused c_attn's layout is a function of it.
    gpt2_like(
        "gpt-bigcode",
        ("gpt_bigcode",),
        heads=bigcode_heads,
        float32_softmax=True,
        source_note="GPTBigCodeBlock.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("mlp.c_fc", "mlp.c_proj"),
    ),
    decoder("llama", ("llama",)),
    decoder("mistral", ("mistral",)),
    decoder("qwen2", ("qwen2",)),
    decoder("qwen3", ("qwen3",), qk_norms=("self_attn.q_norm", "self_attn.k_norm")),
    decoder("gemma", ("gemma",), norm_kind="rms+1"),
    # Mixture of experts: the routed block stands where Llama's MLP stands and returns the
    # hidden states alone, so "no MLP" skips it exactly like an MLP.
    decoder(
        "mixtral",
        ("mixtral",),
        mlp_means="y = h: post_attention_layernorm and the mixture-of-experts block skipped",
    ),
    # GPT-OSS: Llama's layer with learned per-head sink logits in each softmax (a share of
    # every row goes to no key), alternating sliding and full layers and a mixture of
    # experts that returns (hidden states, router scores): "no MLP" skips the experts
    # inside it, whose zeros the block passes on.
    decoder(
        "gpt-oss",
        ("gpt_oss",),
        steps=pre_ln("self_attn", "input_layernorm", ("post_attention_layernorm", "mlp.experts")),
        mlp_branch="mlp.experts",  # `hidden_states, _ = self.mlp(...)`: the experts' output
        score_notes=(
            "learned per-head sink logits take a share of each row outside the keys: W_QK "
            "leaves them out",
        ),
        mlp_means="y = h: post_attention_layernorm and the experts skipped, the block adds zeros",
    ),
    # The worked example of docs/adding-a-family.md: a Llama-shaped layer with LayerNorm.
    decoder(
        "starcoder2", ("starcoder2",), norm_kind="layernorm", mlp=Mlp("mlp.c_fc", "mlp.c_proj")
    ),
    # OLMo2 normalises only the sublayers' outputs: no norm before the attention (norm="").
    decoder(
        "olmo2",
        ("olmo2",),
        norm="",
        style="sandwich",
        branch_norm="post_attention_layernorm",
        qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
        skip_means="h = post_attention_layernorm(attn(x)): the `residual` before the sum is zero",
        mlp_means="y = h: mlp and post_feedforward_layernorm skipped, the MLP branch adds zeros",
        source_note="Olmo2DecoderLayer.forward: `residual = hidden_states` (residual_0)",
        mlp_branch="post_feedforward_layernorm",  # `residual + post_feedforward_layernorm(...)`
        steps=(
            zero(":residual_0"),  # `residual = hidden_states`
            read("probs", "self_attn", index=1),
            read("branch_norm", "post_attention_layernorm", "input"),
            read("branch", "post_attention_layernorm"),
            skip("mlp", "zeros"),
            skip("post_feedforward_layernorm", "input"),  # `residual + ...`: adds zeros
        ),
    ),
    gemma_sandwich("gemma2", ("gemma2",), source_note=GEMMA_NOTE.format(2)),
    # Gemma 3: Gemma 2's layer with query/key norms; sliding and global layers differ only in
    # their mask and rotary base, which the model's own attention call carries.
    gemma_sandwich(
        "gemma3",
        ("gemma3_text",),
        qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
        source_note=GEMMA_NOTE.format(3),
    ),
    # Phi: one LayerNorm feeds the attention and the MLP in parallel, rotary on part of each
    # head, query/key LayerNorms by config; its LM head (outside the base model) has a bias.
    decoder(
        "phi",
        ("phi",),
        style="parallel",
        steps=pre_ln("self_attn", "input_layernorm", ("mlp",)),
        norm_kind="layernorm",
        heads=Heads("self_attn.v_proj", "self_attn.dense"),
        qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm"),
        mlp=Mlp("mlp.fc1", "mlp.fc2"),
        final_norm="final_layernorm",
        skip_means="y = attn(ln(x)) + mlp(ln(x)): the layer's `residual` is zero",
        mlp_means="y = x + attn(ln(x)): mlp skipped, adding zeros",
        source_note="PhiDecoderLayer.forward: `attn_outputs + feed_forward_hidden_states + residual`",
    ),
    decoder(
        "phi3",
        ("phi3",),
        heads=Heads("self_attn.qkv_proj", "self_attn.o_proj", layout="fused"),
        steps=pre_ln(
            "self_attn",
            "input_layernorm",
            ("post_attention_layernorm", "mlp"),
            branch=read("branch", "resid_attn_dropout"),
        ),
        mlp_branch="resid_mlp_dropout",  # `residual + self.resid_mlp_dropout(...)`
    ),
    # StableLM: LayerNorm with a bias; sequential or parallel residual by config; optional
    # per-head q/k LayerNorms (one nn.LayerNorm per head inside q_layernorm / k_layernorm).
    decoder(
        "stablelm",
        ("stablelm",),
        style=stablelm_style,
        steps=stablelm_steps,
        norm_kind="layernorm",
        qk_norms=("self_attn.q_layernorm", "self_attn.k_layernorm"),
        skip_means="h = attn(ln(x)): the layer's `residual` is zero (sequential and parallel)",
        mlp_means="y = the attention sublayer: (post_attention_layernorm and) mlp skipped, adding zeros",
        source_note="StableLmDecoderLayer.forward: `residual = hidden_states` (residual_0)",
    ),
    # Cohere: one bias-free LayerNorm (computed in float32) feeds both parallel branches;
    # the LM multiplies its logits by logit_scale.
    decoder(
        "cohere",
        ("cohere",),
        style="parallel",
        steps=pre_ln("self_attn", "input_layernorm", ("mlp",)),
        norm_kind="layernorm",
        qk_norms=("self_attn.q_norm", "self_attn.k_norm"),
        logits=Logits(multiply="logit_scale"),
        skip_means="y = attn(ln(x)) + mlp(ln(x)): the layer's `residual` is zero",
        mlp_means="y = x + attn(ln(x)): mlp skipped, adding zeros",
        source_note="CohereDecoderLayer.forward: `residual = hidden_states` (residual_0)",
    ),
    # Granite: Llama's layer with multipliers on the embeddings, the scores, each branch and
    # the logits, all read from the config.
    decoder(
        "granite",
        ("granite",),
        embedding_multiplier="embedding_multiplier",
        attention_multiplier="attention_multiplier",
        residual_multiplier="residual_multiplier",
        logits=Logits(divide="logits_scaling"),
        skip_means="h = m attn(norm(x)): the block's `residual` before the attention sum is zero",
        mlp_means="y = h: post_attention_layernorm and mlp skipped, the MLP branch adds zeros",
        source_note="GraniteDecoderLayer.forward: `residual + hidden_states * self.residual_multiplier`",
    ),
    Family(
        name="opt",
        model_types=("opt",),
        layers="decoder.layers",
        style=opt_style,
        steps=opt_steps,
        norm="self_attn_layer_norm",
        norm_kind="layernorm",
        heads=Heads("self_attn.v_proj", "self_attn.out_proj"),
        skip_means="the layer's `residual` before the attention sum is zero (pre-LN 125m, post-LN 350m)",
        mlp_means="y = the attention sublayer: fc1, fc2 (and final_layer_norm) skipped, adding zeros",
        final_norm="decoder.final_layer_norm",
        output=("decoder.final_layer_norm", "decoder.project_out"),  # 350m: no norm, a projection
        lm_head="decoder.embed_tokens",
        forward_kwargs=DECODER_KWARGS,
        float32_softmax=True,
        causal=True,
        source_note="OPTDecoderLayer.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("fc1", "fc2"),
        mlp_branch="fc2",  # `residual + dropout(fc2(...))` (a functional dropout)
    ),
    Family(
        name="gptj",
        model_types=("gptj",),
        layers="h",
        style="parallel",
        steps=(
            zero(":residual_0"),  # `residual = hidden_states`
            read("norm", "ln_1", "input"),
            read("probs", "attn", index=1),
            read("branch", "attn", index=0),
            skip("mlp", "zeros"),  # `attn_outputs + feed_forward_hidden_states + residual`
        ),
        norm="ln_1",
        norm_kind="layernorm",
        heads=Heads("attn.v_proj", "attn.out_proj"),
        skip_means="y = attn(ln_1(x)) + mlp(ln_1(x)): the block's `residual` is zero",
        mlp_means="y = x + attn(ln_1(x)): mlp skipped, adding zeros",
        final_norm="ln_f",
        forward_kwargs=DECODER_KWARGS,
        float32_softmax=True,  # from transformers 5.24 (the shared eager attention)
        causal=True,
        source_note="GPTJBlock.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("mlp.fc_in", "mlp.fc_out"),
        mlp_branch="mlp",  # `attn_output + feed_forward_hidden_states + residual`
    ),
    Family(
        name="falcon",
        model_types=("falcon",),
        layers="h",
        style=lambda c: "parallel" if c.parallel_attn or c.new_decoder_architecture else "pre",
        steps=falcon_steps,
        norm=falcon_norm,
        norm_kind="layernorm",
        heads=Heads("self_attention.query_key_value", "self_attention.dense", layout="falcon"),
        skip_means="the layer's `residual` is zero: y = attn(ln(x)) + mlp(ln(x))",
        mlp_means="y = x + attn(ln(x)): mlp (and its own norm) skipped, adding zeros",
        final_norm="ln_f",
        lm_head="word_embeddings",
        forward_kwargs=DECODER_KWARGS,
        causal=True,
        source_note="FalconDecoderLayer.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        mlp_branch="mlp",  # `mlp_output += attention_output`, then the residual
    ),
    Family(
        name="gpt-neox",
        model_types=("gpt_neox",),
        layers="layers",
        style=neox_style,
        steps=neox_steps,
        norm="input_layernorm",
        norm_kind="layernorm",
        heads=Heads("attention.query_key_value", "attention.dense", layout="neox"),
        skip_means="the sum `mlp_output + attn_output + hidden_states` becomes mlp_output + attn_output",
        mlp_means="y = x + attn(ln(x)): post_attention_layernorm and mlp skipped, adding zeros",
        final_norm="final_layer_norm",
        forward_kwargs=DECODER_KWARGS,
        float32_softmax=True,
        causal=True,
        source_note="GPTNeoXLayer.forward: `hidden_states = mlp_output + attn_output + hidden_states`",
        mlp=Mlp("mlp.dense_h_to_4h", "mlp.dense_4h_to_h"),
        mlp_branch=neox_mlp_branch,
    ),
    Family(
        name="bloom",
        model_types=("bloom",),
        layers="h",
        style="pre",
        steps=(
            read("norm", "input_layernorm", "input"),
            # BloomAttention(layernorm_output, residual, ...) adds `residual` itself
            # (`dropout_add(output_tensor, residual, ...)`): its second input becomes zeros.
            put("self_attention", "zeros", part="arg1"),
            read("branch", "self_attention.dense"),
            read("probs", "self_attention", index=1),
            skip("post_attention_layernorm", "input"),
            skip("mlp", "input"),  # BloomMLP(h, residual) returns h: the layer returns h
        ),
        norm="input_layernorm",
        norm_kind="layernorm",
        heads=Heads("self_attention.query_key_value", "self_attention.dense", layout="neox"),
        skip_means="h = attn(ln(x)): BloomAttention's `residual` input is zero",
        mlp_means="y = h: post_attention_layernorm and mlp skipped, the layer returns h",
        final_norm="ln_f",
        lm_head="word_embeddings",
        forward_kwargs=DECODER_KWARGS,
        # BloomAttention computes its own softmax in float32 and never calls transformers'
        # attention functions: probe's eager attention cannot keep float64 there.
        float32_softmax=False,
        causal=True,
        refuse=bloom_refuse,
        source_note="BloomAttention.forward: `dropout_add(output_tensor, residual, ...)`",
        mlp=Mlp("mlp.dense_h_to_4h", "mlp.dense_4h_to_h", activation="gelu_pytorch_tanh"),
        # BloomMLP: `dropout_add(dense_4h_to_h(...), residual)` adds the residual itself.
        mlp_branch="mlp.dense_4h_to_h",
        score_notes=("ALiBi position biases add to the attention scores: W_QK leaves them out",),
    ),
    Family(
        name="modernbert",
        model_types=("modernbert",),
        layers="layers",
        style="pre",
        steps=(
            read("norm", "attn_norm", "input"),
            read("probs", "attn", index=1),
            read("branch", "attn", index=0),
            put(":hidden_states_0", "branch"),  # `hidden_states = hidden_states + attn_output`
            skip("mlp_norm", "input"),
            skip("mlp", "zeros"),
        ),
        norm="attn_norm",
        norm_kind="layernorm",
        heads=Heads("attn.Wqkv", "attn.Wo", layout="fused"),
        skip_means="h = attn(attn_norm(x)): the sum `hidden_states + attn_output` becomes attn_output",
        mlp_means="y = h: mlp_norm and mlp skipped, adding zeros",
        final_norm="final_norm",
        float32_softmax=True,
        source_note="ModernBertEncoderLayer.forward: `hidden_states = hidden_states + attn_output`",
        mlp=GATED_MLP,  # Wi's two halves: act(input) * gate
        mlp_branch="mlp",  # `hidden_states + self.mlp(self.mlp_norm(hidden_states))`
    ),
    Family(
        name="t5",
        model_types=("t5",),
        layers="encoder.block",
        style="pre",
        steps=(
            read("norm", "layer.0.layer_norm", "input"),
            read("probs", "layer.0.SelfAttention", index=2),
            read("branch", "layer.0.dropout"),
            # T5LayerSelfAttention: `attention_output = hidden_states + self.dropout(...)`
            put("layer.0:attention_output_0", "branch"),
            skip("layer.1", "input"),  # T5LayerFF, the whole MLP sublayer with its residual
        ),
        norm="layer.0.layer_norm",
        norm_kind="rms",
        heads=Heads("layer.0.SelfAttention.v", "layer.0.SelfAttention.o"),
        skip_means="h = attn(norm(x)): the sum `hidden_states + dropout(attention_output)` becomes the branch",
        mlp_means="y = h: the feed-forward sublayer (layer[1]) skipped",
        final_norm="encoder.final_layer_norm",
        model_class="T5EncoderModel",
        source_note="T5LayerSelfAttention.forward: `attention_output = hidden_states + ...`",
        mlp=t5_mlp,
        mlp_branch="layer.1.dropout",  # T5LayerFF: `hidden_states + self.dropout(...)`
        score_notes=(
            "the attention's scale is not 1/sqrt(d_qk) in this family",
            "relative position terms add to the attention scores: W_QK leaves them out",
        ),
    ),
    Family(
        name="vit",
        model_types=("vit",),
        layers="layers",
        style="pre",
        steps=pre_ln("attention", "layernorm_before", ("layernorm_after", "mlp")),
        norm="layernorm_before",
        norm_kind="layernorm",
        heads=Heads("attention.v_proj", "attention.o_proj"),
        skip_means="h = attn(layernorm_before(x)): the layer's `residual` is zero",
        mlp_means="y = h: layernorm_after and mlp skipped, adding zeros",
        final_norm="layernorm",
        inputs="pixels",
        float32_softmax=True,
        unused_modules=("pooler",),
        source_note="ViTLayer.forward: `residual = hidden_states` (residual_0)",
        mlp=Mlp("mlp.fc1", "mlp.fc2"),
        mlp_branch="mlp",  # `dropout(mlp(...)) + residual` (dropout: eval, the identity)
    ),
)

#: model_type -> why probe refuses it (families whose ablations cannot be exact).
REFUSED: dict[str, str] = {
    **{
        kind: "not an attention model (a state-space or recurrent layer mixes the tokens); "
        "rank collapse under attention does not apply"
        for kind in ("mamba", "mamba2", "rwkv", "recurrent_gemma")
    },
    # Hybrids: some layers mix the tokens with a state-space, linear-attention or
    # convolution mixer instead of softmax attention.
    **{
        kind: "a hybrid whose layers are partly state-space, linear-attention or convolution "
        "mixers: they mix the tokens outside softmax attention, so SAN, the paths through "
        "heads and the collapse bound do not describe the model; probe walks attention "
        "networks only"
        for kind in (
            "jamba",
            "falcon_h1",
            "zamba",
            "zamba2",
            "bamba",
            "granitemoehybrid",
            "nemotron_h",
            "lfm2",
            "qwen3_next",
        )
    },
}
