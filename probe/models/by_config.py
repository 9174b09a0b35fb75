"""What the entries of ``families.py`` compute from a config, where a layer's code branches on it.

OPT is pre- or post-LN (``do_layer_norm_before``), GPT-NeoX, StableLM and Falcon parallel
or sequential, Falcon has one or two norms before its branches, T5's MLP is plain or
gated; some configurations cannot be probed exactly and are refused with the reason.
Each function takes the model's config; the comments name the transformers lines.
"""

from __future__ import annotations

from .builders import pre_ln
from .family import GATED_MLP, Heads, Mlp, Step, put, read, skip, zero


def opt_style(config) -> str:
    return "pre" if config.do_layer_norm_before else "post"


def opt_steps(config) -> tuple[Step, ...]:
    # OPTDecoderLayer.forward: `residual = hidden_states` (residual_0), then the attention,
    # `hidden_states = residual + hidden_states`; 350m normalises after the sums instead.
    # Reads follow forward order: pre-LN runs self_attn_layer_norm before the attention,
    # post-LN after the residual sum.
    attn = (read("probs", "self_attn", index=1), read("branch", "self_attn", index=0))
    norm = (read("norm", "self_attn_layer_norm", "input"),)
    mlp = (skip("fc1", "zeros"), skip("fc2", "input"))  # `residual + fc2(...)`: adds zeros
    if config.do_layer_norm_before:
        return (zero(":residual_0"), *norm, *attn, skip("final_layer_norm", "input"), *mlp)
    return (zero(":residual_0"), *attn, *norm, *mlp, skip("final_layer_norm", "input"))


def neox_style(config) -> str:
    return "parallel" if config.use_parallel_residual else "pre"


def neox_steps(config) -> tuple[Step, ...]:
    head = (
        read("norm", "input_layernorm", "input"),
        read("probs", "attention", index=1),
        read("branch", ":attn_output_0"),  # attn_output = self.post_attention_dropout(...)
    )
    mlp = (skip("post_attention_layernorm", "input"), skip("mlp", "zeros"))
    if config.use_parallel_residual:
        # `hidden_states = mlp_output + attn_output + hidden_states` (hidden_states_0): the
        # layer's input is a function argument, so the sum itself is replaced.
        return (
            head
            + mlp
            + (
                read("mlp_out", ":mlp_output_1", when="no_skip"),
                put(":hidden_states_0", "mlp_out+branch"),
            )
        )
    # `attn_output = attn_output + hidden_states` (attn_output_1)
    return head + (put(":attn_output_1", "branch"),) + mlp


def neox_mlp_branch(config) -> str:
    # `mlp_output = self.post_mlp_dropout(mlp_output)`: the parallel branch's line, or the
    # sequential one's (nnsight numbers the assignments in the order of the source).
    return ":mlp_output_1" if config.use_parallel_residual else ":mlp_output_3"


def falcon_norm(config) -> str:
    two_norms = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
    return "ln_attn" if two_norms else "input_layernorm"


def falcon_steps(config) -> tuple[Step, ...]:
    two_norms = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
    norm = falcon_norm(config)
    mlp_norms = ("ln_mlp",) if two_norms else ()
    if not config.parallel_attn and not config.new_decoder_architecture:
        mlp_norms = ("post_attention_layernorm",)
    norms = tuple(skip(site, "input") for site in mlp_norms)
    return (
        zero(":residual_0"),  # `residual = hidden_states`
        read("norm", norm, "input"),
        *(norms if two_norms else ()),  # ln_mlp runs before the attention there
        read("probs", "self_attention", index=1),
        read("branch", "self_attention", index=0),
        *(() if two_norms else norms),
        skip("mlp", "zeros"),  # `mlp_output += attention_output`: adds to zeros, exactly
    )


def stablelm_style(config) -> str:
    return "parallel" if config.use_parallel_residual else "pre"


def stablelm_steps(config) -> tuple[Step, ...]:
    # StableLmDecoderLayer.forward: `residual = hidden_states` (residual_0) is added to the
    # attention (`residual + self_attn_output`, sequential) or to both branches (`residual +
    # self_attn_output + mlp_output`, parallel); the parallel layer has no second norm.
    mlp = ("mlp",) if config.use_parallel_residual else ("post_attention_layernorm", "mlp")
    return pre_ln("self_attn", "input_layernorm", mlp)


def deberta_refuse(config) -> str:
    if getattr(config, "conv_kernel_size", 0):
        return (
            "DeBERTa-v2 with conv_kernel_size > 0 mixes tokens with a convolution after "
            "the first layer, outside attention; probe's ablations would not be exact, so "
            "it is refused (DeBERTa-v3 checkpoints have no conv and are supported)"
        )
    return ""


def bloom_refuse(config) -> str:
    if getattr(config, "apply_residual_connection_post_layernorm", False):
        return (
            "BLOOM with apply_residual_connection_post_layernorm=True adds the normalised "
            "input as the residual, not the input: the residual stream is not x + branch, and "
            "probe's ablations would not be exact, so this config option is refused"
        )
    if getattr(config, "pretraining_tp", 1) > 1 and getattr(config, "slow_but_exact", False):
        return (
            "BLOOM with slow_but_exact=True and pretraining_tp > 1 computes the attention's "
            "output projection in slices outside `dense`, which probe reads as the branch; "
            "this config option is refused (set slow_but_exact=False)"
        )
    return ""


def t5_mlp(config) -> Mlp:
    if getattr(config, "is_gated_act", False):  # T5 v1.1, Flan-T5: gated-gelu
        return GATED_MLP
    return Mlp("layer.1.DenseReluDense.wi", "layer.1.DenseReluDense.wo")


def bigcode_heads(config) -> Heads:
    # GPTBigCodeAttention.forward: multi-query splits c_attn's rows (embed_dim, kv_dim,
    # kv_dim) with one key/value head; multi-head views them as (heads, 3 head_dim) first,
    # [q_h | k_h | v_h] per head.
    if config.multi_query:
        return Heads("attn.c_attn", "attn.c_proj", layout="fused", kv_heads=1)
    return Heads("attn.c_attn", "attn.c_proj", layout="neox")
