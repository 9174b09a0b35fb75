"""Builders of the common layer layouts, for the entries of ``families.py``.

A Llama-shaped decoder is one call of :func:`decoder`; other pre-LN layers list their
steps with :func:`pre_ln`, BERT's post-LN layer with :func:`bert_like`.
"""

from __future__ import annotations

import dataclasses

from ..errors import ProbeError
from .family import GATED_MLP, Family, Heads, Logits, Step, put, read, skip, zero


def pre_ln(
    attn: str,
    norm: str,
    mlp: tuple[str, ...],
    *,
    residual: str = ":residual_0",
    probs: int = 1,
    branch: Step | None = None,
) -> tuple[Step, ...]:
    """A pre-LN block ``h = x + attn(norm(x)); y = h + mlp(mlp_norm(h))``.

    No skip: the ``residual = hidden_states`` that the attention sum adds is zero.
    No MLP: every module in ``mlp`` is skipped, the norm(s) pass their input on and
    the last returns zeros, so the block adds exactly nothing: y = h.
    """
    *passes, last = mlp
    return (
        zero(residual),
        read("norm", norm, "input"),
        read("probs", attn, index=probs),
        branch or read("branch", attn, index=0),
        *(skip(site, "input") for site in passes),
        skip(last, "zeros"),
    )


def bert_like(self_attn: str = "attention.self", **_) -> tuple[Step, ...]:
    """BERT's post-LN layer: ``a = LN(dropout(dense(ctx)) + x)`` in ``attention.output``.

    No skip: BertSelfOutput's second input (``input_tensor``, the residual) is zeros.
    No MLP: ``intermediate`` and ``output`` are skipped and return a.
    """
    return (
        read("probs", self_attn, index=1),
        put("attention.output", "zeros", part="arg1"),  # BertSelfOutput(h, input_tensor)
        read("branch", "attention.output.dropout"),
        read("norm", "attention.output.LayerNorm", "input"),
        read("sublayer", "attention", index=0),
        skip("intermediate", "sublayer"),
        skip("output", "sublayer"),
    )


LLAMA_NOTE = "LlamaDecoderLayer.forward: `residual = hidden_states` (residual_0)"
DECODER_KWARGS = {"use_cache": False}


def decoder(name: str, model_types: tuple[str, ...], **extra) -> Family:
    """A Llama-shaped pre-LN decoder (Llama, Mistral, Qwen2, Qwen3, Gemma, Phi3); any field of
    :class:`Family` given in ``extra`` replaces the Llama default."""
    unknown = sorted(set(extra) - {f.name for f in dataclasses.fields(Family)})
    if unknown:
        raise ProbeError(
            f"family entry {name!r}: decoder() has no field {', '.join(map(repr, unknown))}; "
            "the fields are those of probe.models.family.Family"
        )
    fields = {
        "layers": "layers",
        "style": "pre",
        "steps": pre_ln("self_attn", "input_layernorm", ("post_attention_layernorm", "mlp")),
        "norm": "input_layernorm",
        "norm_kind": "rms",
        "heads": Heads("self_attn.v_proj", "self_attn.o_proj"),
        "skip_means": "h = attn(norm(x)): the block's `residual` before the attention sum is zero",
        "mlp_means": "y = h: post_attention_layernorm and mlp skipped, the MLP branch adds zeros",
        "final_norm": "norm",
        "lm_head": "embed_tokens",
        "forward_kwargs": DECODER_KWARGS,
        "float32_softmax": True,
        "causal": True,
        "source_note": f"{name}'s decoder layer, as {LLAMA_NOTE}",
        "mlp": GATED_MLP,  # SwiGLU / GeGLU
        "mlp_branch": "mlp",  # `hidden_states = residual + mlp(...)`
    }
    return Family(name=name, model_types=model_types, **{**fields, **extra})


GEMMA_NOTE = "Gemma{}DecoderLayer.forward: `residual = hidden_states` (residual_0)"


def gemma_sandwich(name: str, model_types: tuple[str, ...], **extra) -> Family:
    """Gemma 2's layer: h = x + P(attn(N(x))), y = h + P'(mlp(N'(h))), four (1 + w) RMS norms,
    the LM's logits soft-capped; ``extra`` as :func:`decoder` takes it."""
    fields = {
        "norm_kind": "rms+1",
        "logits": Logits(softcap="final_logit_softcapping"),
        "style": "sandwich",
        "branch_norm": "post_attention_layernorm",
        "skip_means": "h = post_attention_layernorm(attn(norm(x))): the `residual` is zero",
        "mlp_means": "y = h: pre_feedforward_layernorm, mlp, post_feedforward_layernorm skipped",
        "mlp_branch": "post_feedforward_layernorm",  # `residual + post_feedforward_layernorm(...)`
        "steps": (
            zero(":residual_0"),  # `residual = hidden_states`
            read("norm", "input_layernorm", "input"),
            read("probs", "self_attn", index=1),
            read("branch_norm", "post_attention_layernorm", "input"),
            read("branch", "post_attention_layernorm"),
            skip("pre_feedforward_layernorm", "input"),
            skip("mlp", "zeros"),
            skip("post_feedforward_layernorm", "input"),
        ),
    }
    return decoder(name, model_types, **{**fields, **extra})


def gpt2_like(name: str, model_types: tuple[str, ...], **extra) -> Family:
    """GPT-2's block: h = x + attn(ln_1(x)), y = h + mlp(ln_2(h)), LayerNorms, the final
    ``ln_f`` and a head tied to ``wte``; ``extra`` (the heads and the MLP at least) as
    :func:`decoder` takes it."""
    fields = {
        "layers": "h",
        "style": "pre",
        "steps": pre_ln("attn", "ln_1", ("ln_2", "mlp")),
        "norm": "ln_1",
        "norm_kind": "layernorm",
        "skip_means": "h = attn(ln_1(x)): the block's `residual` before the attention sum is zero",
        "mlp_means": "y = h: ln_2 and mlp skipped, the MLP branch adds zeros",
        "final_norm": "ln_f",
        "lm_head": "wte",
        "forward_kwargs": DECODER_KWARGS,
        "causal": True,
        "mlp_branch": "mlp",  # `hidden_states = residual + feed_forward_hidden_states`
    }
    return Family(name=name, model_types=model_types, **{**fields, **extra})
