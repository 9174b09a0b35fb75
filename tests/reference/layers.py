"""Independent reference for the ablations of the walker families, by module surgery.

Imports neither ``probe`` nor ``nnsight``.  ``reference_hidden_states`` deep-copies the
model, replaces each transformer layer's ``forward`` on the copy with the short
re-implementation of its family below (calling the layer's own submodules: norms,
attention, MLP), runs the copy's ordinary forward and records the residual stream
with plain torch hooks.  The model passed in is never modified.

The definitions (the same as ``reference/surgery.py`` for BERT and GPT-2):
``attn_skip=False`` drops the identity term of the attention sublayer's residual sum,
keeping everything else; ``mlp=False`` makes a layer's output its attention
sublayer's output (MLP, its norm and its residual removed).  Each function writes
every sum with the grouping transformers' code uses, so the unablated reference
equals the model's own output exactly (asserted in the tests), which checks these
re-implementations too.

Which function a model's layers get, and where its layer list is, is its family's entry
in ``ENTRIES`` of ``tests/reference/families.py`` (``layer_implementation``): a new
family is a function here and that one entry; a Llama-shaped layer of any model_type
gets ``_llama`` without one.

==========  ==============================================  =========================
layout      layer (x the input, a the attention branch)     families
==========  ==============================================  =========================
pre-LN      h = x + a(N(x)); y = h + mlp(N'(h))             Llama, Mistral, Qwen2/3,
                                                            Gemma, Phi3, ViT,
                                                            ModernBERT, OPT-125m, T5,
                                                            BLOOM, StableLM
scaled      h = x + a(N(x)) m; y = h + mlp(N'(h)) m         Granite (m its
                                                            residual_multiplier)
sandwich    h = x + P(a(N(x))); y = h + Q(mlp(N'(h)))       Gemma2, Gemma3 (OLMo2:
                                                            no N, N')
parallel    y = (a(N(x)) + mlp(N(x))) + x                   GPT-J, Falcon, GPT-NeoX
            y = (x + a(N(x))) + mlp(N(x))                   StableLM (parallel), Cohere
            y = (a(N(x)) + mlp(N(x))) + x                   Phi
post-LN     h = N(drop(dense(a(x))) + x); y = ...           RoBERTa, ELECTRA,
                                                            DeBERTa-v2, DistilBERT,
                                                            OPT-350m
==========  ==============================================  =========================
"""

from __future__ import annotations

import copy
import inspect
from functools import partial

import torch
from torch import nn

__all__ = [
    "layer_implementation",
    "layer_list",
    "record_stream",
    "reference_hidden_states",
]


def _llama(layer, hidden_states, *, skip, mlp, **kwargs):
    a = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)[0]
    a = getattr(layer, "resid_attn_dropout", nn.Identity())(a)  # Phi3
    h = hidden_states + a if skip else a
    if not mlp:
        return h
    m = layer.mlp(layer.post_attention_layernorm(h))
    return h + getattr(layer, "resid_mlp_dropout", nn.Identity())(m)


def _gemma2(layer, hidden_states, *, skip, mlp, **kwargs):
    a = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)[0]
    a = layer.post_attention_layernorm(a)
    h = hidden_states + a if skip else a
    if not mlp:
        return h
    return h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))


def _olmo2(layer, hidden_states, *, skip, mlp, **kwargs):
    # Olmo2DecoderLayer: no norm before the sublayers, a norm on each sublayer's output.
    a = layer.post_attention_layernorm(layer.self_attn(hidden_states=hidden_states, **kwargs)[0])
    h = hidden_states + a if skip else a
    if not mlp:
        return h
    return h + layer.post_feedforward_layernorm(layer.mlp(h))


def _bloom(layer, hidden_states, alibi, attention_mask, *, skip, mlp, **kwargs):
    # BloomBlock with apply_residual_connection_post_layernorm=False: BloomAttention adds
    # its `residual` argument (dropout_add), BloomMLP its own.
    attention = layer.self_attention
    x = layer.input_layernorm(hidden_states)
    residual = hidden_states if skip else torch.zeros_like(hidden_states)
    kwargs.pop("output_attentions", None)
    h, _ = attention(x, residual, alibi=alibi, attention_mask=attention_mask, **kwargs)
    if not mlp:
        return h, None
    return layer.mlp(layer.post_attention_layernorm(h), h), None


def _opt(layer, hidden_states, *, skip, mlp, **kwargs):
    pre = layer.do_layer_norm_before
    x = layer.self_attn_layer_norm(hidden_states) if pre else hidden_states
    a = layer.self_attn(hidden_states=x, **kwargs)[0]
    h = hidden_states + a if skip else a
    if not pre:
        h = layer.self_attn_layer_norm(h)
    if not mlp:
        return h
    m = layer.final_layer_norm(h) if pre else h
    y = h + layer.fc2(layer.activation_fn(layer.fc1(m)))
    return y if pre else layer.final_layer_norm(y)


def _gptj(layer, hidden_states, *, skip, mlp, **kwargs):
    x = layer.ln_1(hidden_states)
    y = layer.attn(hidden_states=x, **kwargs)[0]
    if mlp:
        y = y + layer.mlp(x)
    if skip:
        y = y + hidden_states
    # transformers 5.24 rewrote GPTJBlock to return the tensor; before, (tensor, weights).
    returns_tensor = inspect.signature(type(layer).forward).return_annotation is torch.Tensor
    return y if returns_tensor else (y, None)


def _falcon(layer, hidden_states, *, skip, mlp, alibi=None, attention_mask=None, **kwargs):
    config = layer.config
    two = config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2
    x = layer.ln_attn(hidden_states) if two else layer.input_layernorm(hidden_states)
    a = layer.self_attention(x, alibi=alibi, attention_mask=attention_mask, **kwargs)[0]
    if config.new_decoder_architecture or config.parallel_attn:
        y = a
        if mlp:
            y = layer.mlp(layer.ln_mlp(hidden_states) if two else x) + a
        return (y + hidden_states if skip else y), None
    h = a + hidden_states if skip else a
    if mlp:
        h = layer.mlp(layer.post_attention_layernorm(h)) + h
    return h, None


def _neox(layer, hidden_states, *, skip, mlp, **kwargs):
    a = layer.attention(layer.input_layernorm(hidden_states), **kwargs)[0]
    a = layer.post_attention_dropout(a)
    if layer.use_parallel_residual:
        y = a
        if mlp:
            m = layer.mlp(layer.post_attention_layernorm(hidden_states))
            y = layer.post_mlp_dropout(m) + a
        return y + hidden_states if skip else y
    h = a + hidden_states if skip else a
    if not mlp:
        return h
    return layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(h))) + h


#: The arguments StableLmDecoderLayer passes its attention (the rest of its **kwargs it drops).
_STABLELM_ATTENTION_ARGS = (
    "attention_mask",
    "position_ids",
    "cache",
    "past_key_values",  # the name before transformers renamed it to ``cache``
    "use_cache",
    "position_embeddings",
)


def _stablelm(layer, hidden_states, *, skip, mlp, **kwargs):
    # StableLmDecoderLayer: hidden_dropout follows the MLP only, in both layouts.
    x = layer.input_layernorm(hidden_states)
    kwargs = {k: v for k, v in kwargs.items() if k in _STABLELM_ATTENTION_ARGS}
    a = layer.self_attn(hidden_states=x, **kwargs)[0]
    if layer.use_parallel_residual:  # residual + attn + dropout(mlp(ln(x))), left to right
        y = hidden_states + a if skip else a
        return y + layer.dropout(layer.mlp(x)) if mlp else y
    h = hidden_states + a if skip else a
    if not mlp:
        return h
    return h + layer.dropout(layer.mlp(layer.post_attention_layernorm(h)))


def _cohere(layer, hidden_states, *, skip, mlp, **kwargs):
    # CohereDecoderLayer: one norm feeds both branches; residual + attn + mlp, left to right.
    x = layer.input_layernorm(hidden_states)
    a = layer.self_attn(hidden_states=x, **kwargs)[0]
    y = hidden_states + a if skip else a
    return y + layer.mlp(x) if mlp else y


def _gpt_oss(layer, hidden_states, *, skip, mlp, **kwargs):
    # GptOssDecoderLayer: Llama's sums; its MLP returns (hidden states, router scores).
    a = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)[0]
    h = hidden_states + a if skip else a
    return h + layer.mlp(layer.post_attention_layernorm(h))[0] if mlp else h


def _phi(layer, hidden_states, *, skip, mlp, **kwargs):
    # PhiDecoderLayer: `attn_outputs + feed_forward_hidden_states + residual`, one LayerNorm
    # feeding both branches, each through the same resid_dropout.
    x = layer.input_layernorm(hidden_states)
    y = layer.resid_dropout(layer.self_attn(hidden_states=x, **kwargs)[0])
    if mlp:
        y = y + layer.resid_dropout(layer.mlp(x))
    return y + hidden_states if skip else y


def _gpt_bigcode(layer, hidden_states, encoder_hidden_states=None, *, skip, mlp, **kwargs):
    # GPTBigCodeBlock: `attn_output + residual`, then `residual + mlp(ln_2(h))`.
    kwargs.pop("encoder_attention_mask", None)
    a = layer.attn(layer.ln_1(hidden_states), **kwargs)[0]
    h = a + hidden_states if skip else a
    return h + layer.mlp(layer.ln_2(h)) if mlp else h


def _granite(layer, hidden_states, *, skip, mlp, **kwargs):
    # GraniteDecoderLayer scales each branch by residual_multiplier before adding it; without
    # the skip the attention branch keeps its multiplier.
    m = layer.residual_multiplier
    a = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)[0]
    h = hidden_states + a * m if skip else a * m
    if not mlp:
        return h
    return h + layer.mlp(layer.post_attention_layernorm(h)) * m


def _modernbert(layer, hidden_states, *, skip, mlp, **kwargs):
    a = layer.attn(layer.attn_norm(hidden_states), **kwargs)[0]
    h = hidden_states + a if skip else a
    return h + layer.mlp(layer.mlp_norm(h)) if mlp else h


def _t5(block, hidden_states, attention_mask=None, position_bias=None, *args, skip, mlp, **kwargs):
    sa = block.layer[0]
    kwargs.pop("past_key_values", None)
    a, position_bias, _ = sa.SelfAttention(
        sa.layer_norm(hidden_states), mask=attention_mask, position_bias=position_bias
    )
    a = sa.dropout(a)
    h = hidden_states + a if skip else a
    if mlp:
        h = block.layer[-1](h)
    return h, position_bias, None


def _vit(layer, hidden_states, attention_mask=None, *, skip, mlp, **kwargs):
    a = layer.attention(layer.layernorm_before(hidden_states), attention_mask, **kwargs)[0]
    a = layer.dropout(a)
    h = a + hidden_states if skip else a
    if not mlp:
        return h
    return layer.dropout(layer.mlp(layer.layernorm_after(h))) + h


def _bert_like(layer, hidden_states, attention_mask=None, *args, skip, mlp, **kwargs):
    attention = layer.attention
    context = attention.self(hidden_states, attention_mask=attention_mask, **kwargs)[0]
    tail = attention.output  # BertSelfOutput: LN(dropout(dense(h)) + input_tensor)
    branch = tail.dropout(tail.dense(context))
    a = tail.LayerNorm(branch + hidden_states if skip else branch)
    return layer.output(layer.intermediate(a), a) if mlp else a


def _deberta(layer, hidden_states, attention_mask, *, skip, mlp, query_states=None, **kwargs):
    attention = layer.attention
    output_attentions = kwargs.pop("output_attentions", False)
    context, probs = attention.self(
        hidden_states, attention_mask, output_attentions, query_states=query_states, **kwargs
    )
    residual = hidden_states if query_states is None else query_states
    tail = attention.output
    branch = tail.dropout(tail.dense(context))
    a = tail.LayerNorm(branch + residual if skip else branch)
    return (layer.output(layer.intermediate(a), a) if mlp else a), probs


def _distilbert(layer, hidden_states, attention_mask=None, *, skip, mlp, **kwargs):
    a = layer.attention(hidden_states, attention_mask=attention_mask, **kwargs)[0]
    a = layer.sa_layer_norm(a + hidden_states if skip else a)
    return layer.output_layer_norm(layer.ffn(a) + a) if mlp else a


def layer_implementation(model: nn.Module):
    """(path of the layer list, re-implementation) from ``model``'s entry in
    ``tests/reference/families.py`` (Llama's for a Llama-shaped layer of any model_type);
    :class:`NoReference` for a family without one, or whose layers ``reference/surgery.py``
    re-implements instead (BERT, GPT-2, ALBERT, XLNet)."""
    # Imported here: families.py imports this module for the functions it lists.
    from tests.reference.families import NoReference, entry_for

    entry = entry_for(model)
    if entry.layer is None:
        raise NoReference(
            f"the reference entry of model_type {model.config.model_type!r} has no layer "
            "re-implementation: its layers are in tests/reference/surgery.py"
        )
    return entry.layers, entry.layer


def _module(model: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def layer_list(model: nn.Module) -> nn.ModuleList:
    """``model``'s list of transformer layers, at the path its reference entry names."""
    from tests.reference.families import entry_for

    return _module(model, entry_for(model).layers)


def record_stream(model: nn.Module, layers: nn.ModuleList, inputs: dict) -> list[torch.Tensor]:
    """X_0 (the first layer's input) .. X_L (each layer's output) of ``model``'s own forward
    on ``inputs``, recorded by plain torch hooks on ``layers`` (removed again after)."""
    states: list[torch.Tensor] = []

    def record_input(module, args, kwargs):
        if not states:
            states.append(args[0] if args else kwargs["hidden_states"])

    def record_output(module, args, output):
        states.append(output[0] if isinstance(output, tuple) else output)

    handles = [layers[0].register_forward_pre_hook(record_input, with_kwargs=True)]
    handles += [layer.register_forward_hook(record_output) for layer in layers]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    if len(states) != len(layers) + 1:
        raise RuntimeError(f"collected {len(states)} hidden states, expected {len(layers) + 1}")
    return [s.detach() for s in states]


def _strip(model: nn.Module) -> None:
    """Remove instance-level forward overrides (an nnsight controller) and hooks from a copy."""
    for module in model.modules():
        module.__dict__.pop("forward", None)
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs"):
            getattr(module, hooks).clear()


def reference_hidden_states(
    model: nn.Module, inputs: dict, *, attn_skip: bool, mlp: bool
) -> list[torch.Tensor]:
    """X_0 .. X_L of ``model`` under the ablation, by surgery on a copy (see the docstring).

    ``inputs``: the keyword arguments of the model's forward (``input_ids`` and
    ``attention_mask``, or ``pixel_values``).
    """
    path, layer_forward = layer_implementation(model)
    work = copy.deepcopy(model)
    _strip(work)
    work.eval()
    layers = _module(work, path)
    for layer in layers:
        layer.forward = partial(layer_forward, layer, skip=attn_skip, mlp=mlp)
    return record_stream(work, layers, inputs)
