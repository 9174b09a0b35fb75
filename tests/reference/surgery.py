"""Independent reference for the skip/MLP ablations, built by plain module surgery.

This module imports neither ``probe`` nor ``nnsight``.  ``reference_hidden_states``
deep-copies the model, replaces the forward of the sublayers concerned on the copy
with the short re-implementations below, runs the copy's ordinary forward under
``torch.no_grad()`` and collects the residual stream with plain torch hooks on the
transformer layers.  The model passed in is never modified.

The project's ablation definitions (the same for every family; the paper's own
surgery differed in places).  ``attn_skip=False`` ("no skip") drops only the
identity term of the attention sublayer's residual sum, keeping every LayerNorm,
dropout and projection; ``mlp=False`` ("no MLP") makes a layer's output its
attention sublayer's output, removing the MLP, its residual and its norm.

========  ===============================================  ==================================================
family    attn_skip=False                                  mlp=False
========  ===============================================  ==================================================
BERT      BertSelfOutput: LN(drop(dense(ctx)) + x)         layer out = BertAttention out
          -> LN(drop(dense(ctx)))                          (intermediate and BertOutput skipped)
ALBERT    AlbertAttention: LN(x + drop(dense(ctx)))        layer out = AlbertAttention out (ffn, activation,
          -> LN(drop(dense(ctx))); the shared layer is     ffn_output, full_layer_layer_norm removed)
          ablated on every application
XLNet     post_attention(h, attn_vec, residual=True)       layer output_h = rel_attn's output_h
          -> residual=False: LN(drop(attn_out))            (XLNetFeedForward removed)
GPT-2     a = attn(ln_1(x)) + x  ->  a = attn(ln_1(x));    block out = a  (ln_2, mlp and their residual
          the MLP residual stays: out = a + mlp(ln_2(a))   removed)
========  ===============================================  ==================================================

Both flags True is the unablated model.  The attention sublayer's residual sum is
computed by this module's own code whatever the flags (``_bert_self_output``,
``_albert_attention``, ``_xlnet_post_attention``, ``_gpt2_block``), so the unablated
reference matching the model's own outputs also checks those re-implementations.

What is returned: L+1 batch-first ``(batch, token, hidden)`` tensors.  Entry 0 is
the input of the first transformer layer (BERT: embeddings after LayerNorm and
dropout; ALBERT: after ``embedding_hidden_mapping_in``; XLNet: word embeddings after
dropout, i.e. the first layer's ``output_h``; GPT-2: token + position embeddings
after dropout).  Entry l is layer l's output (XLNet: ``output_h``, transposed from
its sequence-first layout; GPT-2: the block output, so the last entry is BEFORE
``ln_f``).  ALBERT's entries are per application of an ``AlbertLayer`` (the
convention of HF's ``hidden_states``), so L = num_hidden_layers * inner_group_num.

The copy is put in eval mode (dropout is the identity), and before surgery every
instance-level ``forward`` override (e.g. an nnsight controller left on a wrapped
model) and every module hook is removed from the copy, so it runs the
transformers classes' own code plus the replacements below.
"""

from __future__ import annotations

import copy
from functools import partial

import torch
from torch import nn
from transformers import AlbertModel, BertModel, GPT2Model, XLNetModel

__all__ = ["model_family", "reference_hidden_states"]

_FAMILY_OF_CLASS = (
    (BertModel, "bert"),
    (AlbertModel, "albert"),
    (XLNetModel, "xlnet"),
    (GPT2Model, "gpt2"),
)


def model_family(model: nn.Module) -> str:
    """``"bert"``, ``"albert"``, ``"xlnet"`` or ``"gpt2"``; ValueError for any other model."""
    for cls, family in _FAMILY_OF_CLASS:
        if isinstance(model, cls):
            return family
    raise ValueError(
        f"unsupported model class {type(model).__name__}; expected a base model: "
        "BertModel, AlbertModel, XLNetModel or GPT2Model"
    )


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


# --- BERT -------------------------------------------------------------------------


def _bert_self_output(so, hidden_states, input_tensor, *, residual: bool):
    """BertSelfOutput: LayerNorm(dropout(dense(ctx)) [+ input_tensor])."""
    out = so.dropout(so.dense(hidden_states))
    return so.LayerNorm(out + input_tensor if residual else out)


def _bert_surgery(model: BertModel, *, attn_skip: bool, mlp: bool) -> list[nn.Module]:
    if model.config.is_decoder or model.config.add_cross_attention:
        raise ValueError("the reference supports encoder-only BERT (no decoder/cross-attention)")
    for layer in model.encoder.layer:
        so = layer.attention.output
        so.forward = partial(_bert_self_output, so, residual=attn_skip)
        if not mlp:
            # BertLayer returns apply_chunking_to_forward(self.feed_forward_chunk, ...,
            # attention_output): the identity makes the layer output BertAttention's.
            layer.feed_forward_chunk = _identity
    return list(model.encoder.layer)


# --- ALBERT -----------------------------------------------------------------------


def _albert_attention(att, hidden_states, attention_mask=None, *, residual: bool, **kwargs):
    """AlbertAttention: LayerNorm([hidden_states +] output_dropout(dense(context)))."""
    batch, tokens, _ = hidden_states.shape
    n_heads, head_size = att.num_attention_heads, att.attention_head_size

    def heads(x):  # (batch, token, n*d) -> (batch, head, token, d)
        return x.view(batch, tokens, n_heads, head_size).transpose(1, 2)

    q, k, v = (heads(lin(hidden_states)) for lin in (att.query, att.key, att.value))
    scores = q @ k.transpose(-1, -2) * head_size**-0.5
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # True = may attend
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:  # additive float mask (0 or a very negative number)
            scores = scores + attention_mask
    probs = att.attention_dropout(scores.softmax(dim=-1))
    context = (probs @ v).transpose(1, 2).reshape(batch, tokens, n_heads * head_size)
    out = att.output_dropout(att.dense(context))
    return att.LayerNorm(hidden_states + out if residual else out), None


def _albert_layer_without_mlp(layer, hidden_states, attention_mask=None, **kwargs):
    """AlbertLayer with ffn/activation/ffn_output/full_layer_layer_norm removed."""
    return layer.attention(hidden_states, attention_mask, **kwargs)[0]


def _albert_surgery(
    model: AlbertModel, *, attn_skip: bool, mlp: bool, paper: bool = False
) -> list[nn.Module]:
    # With num_hidden_groups=1, inner_group_num=1 this is the one shared AlbertLayer;
    # patching the module ablates it on every application.
    layers = [layer for group in model.encoder.albert_layer_groups for layer in group.albert_layers]
    for layer in layers:
        layer.attention.forward = partial(_albert_attention, layer.attention, residual=attn_skip)
        if not mlp and paper:
            # The paper's code: ffn and ffn_output become identities; the activation,
            # the MLP's residual and full_layer_layer_norm keep running.
            layer.ffn.forward = _identity
            layer.ffn_output.forward = _identity
        elif not mlp:
            layer.forward = partial(_albert_layer_without_mlp, layer)
    return layers


# --- XLNet ------------------------------------------------------------------------


def _xlnet_post_attention(rel_attn, h, attn_vec, residual=True, *, attn_skip: bool):
    """XLNetRelativeAttention.post_attention: layer_norm(dropout(attn_vec . o) [+ h]).

    Both streams (h always; g only with target_mapping) go through this method.
    """
    out = rel_attn.dropout(torch.einsum("ibnd,hnd->ibh", attn_vec, rel_attn.o))
    return rel_attn.layer_norm(out + h if residual and attn_skip else out)


def _xlnet_surgery(model: XLNetModel, *, attn_skip: bool, mlp: bool) -> list[nn.Module]:
    for layer in model.layer:
        rel_attn = layer.rel_attn
        rel_attn.post_attention = partial(_xlnet_post_attention, rel_attn, attn_skip=attn_skip)
        if not mlp:
            # XLNetLayer applies self.ff_chunk (= self.ff) to rel_attn's output_h (and
            # output_g); the identity makes the layer output rel_attn's.
            layer.ff_chunk = _identity
    return list(model.layer)


# --- GPT-2 ------------------------------------------------------------------------


def _gpt2_block(
    block,
    hidden_states,
    cache=None,
    attention_mask=None,
    encoder_hidden_states=None,
    encoder_attention_mask=None,
    use_cache=False,
    *,
    attn_skip: bool,
    mlp: bool,
    **kwargs,
):
    """GPT2Block (pre-LN): a = attn(ln_1(x)) [+ x]; out = a [+ mlp(ln_2(a))]."""
    if encoder_hidden_states is not None:
        raise ValueError("the reference does not support GPT-2 cross-attention")
    attn_out, _ = block.attn(
        block.ln_1(hidden_states),
        cache,  # positional: named past_key_values before transformers 5.24, cache from it
        attention_mask=attention_mask,
        use_cache=use_cache,
        **kwargs,
    )
    a = attn_out + hidden_states if attn_skip else attn_out
    if not mlp:
        return a
    return a + block.mlp(block.ln_2(a))


def _gpt2_surgery(model: GPT2Model, *, attn_skip: bool, mlp: bool) -> list[nn.Module]:
    if model.config.add_cross_attention:
        raise ValueError("the reference does not support GPT-2 cross-attention")
    for block in model.h:
        block.forward = partial(_gpt2_block, block, attn_skip=attn_skip, mlp=mlp)
    return list(model.h)


_SURGERY = {
    "bert": _bert_surgery,
    "albert": _albert_surgery,
    "xlnet": _xlnet_surgery,
    "gpt2": _gpt2_surgery,
}


# --- driver -----------------------------------------------------------------------


def _strip_overrides(model: nn.Module) -> None:
    """Remove instance-level forwards and all module hooks (on the copy only)."""
    for module in model.modules():
        module.__dict__.pop("forward", None)
        for name in (
            "_forward_hooks",
            "_forward_hooks_with_kwargs",
            "_forward_hooks_always_called",
            "_forward_pre_hooks",
            "_forward_pre_hooks_with_kwargs",
        ):
            hooks = module.__dict__.get(name)
            if hooks is not None:
                hooks.clear()
    # transformers' output-capturing hooks were just removed; let it reinstall them.
    model.__dict__.pop("_output_capturing_hooks_installed", None)


def _check_inputs(input_ids, attention_mask) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("input_ids must be a 2-D (batch, token) tensor")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be non-empty, got shape {tuple(input_ids.shape)}")
    if attention_mask is not None and (
        not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape
    ):
        raise ValueError("attention_mask must be a tensor with the shape of input_ids")


def _num_layer_calls(model: nn.Module, family: str) -> int:
    config = model.config
    if family == "albert":
        return config.num_hidden_layers * config.inner_group_num
    return config.num_hidden_layers


def reference_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    attn_skip: bool = True,
    mlp: bool = True,
    surgery: str = "probe",
) -> list[torch.Tensor]:
    """The residual stream of ``model`` under the ablation, one (batch, token, hidden) tensor per layer.

    Returns ``[layer-0 input, layer-1 output, ..., layer-L output]`` (see the module
    docstring for what each entry is per family).  ``model`` is left untouched.
    ``surgery="paper"`` applies the paper's own surgery where it differs from the
    project's definition (ALBERT without MLP: ``ffn`` and ``ffn_output`` identities);
    the other families have no such difference.  Raises ValueError for a model that is
    not one of the four base models or for a malformed batch.
    """
    if surgery not in ("probe", "paper"):
        raise ValueError(f"surgery must be 'probe' or 'paper', got {surgery!r}")
    family = model_family(model)
    _check_inputs(input_ids, attention_mask)

    work = copy.deepcopy(model)
    _strip_overrides(work)
    work.eval()
    extra = {"paper": True} if family == "albert" and surgery == "paper" else {}
    layers = _SURGERY[family](work, attn_skip=bool(attn_skip), mlp=bool(mlp), **extra)

    states: list[torch.Tensor] = []

    def record_input(module, args, kwargs):
        if not states:  # only the first layer call's input (ALBERT reuses its layer)
            states.append(args[0])

    def record_output(module, args, output):
        states.append(output[0] if isinstance(output, tuple) else output)

    for layer in layers:
        layer.register_forward_pre_hook(record_input, with_kwargs=True)
        layer.register_forward_hook(record_output)

    device = next(work.parameters()).device
    with torch.no_grad():
        work(
            input_ids=input_ids.to(device),
            attention_mask=None if attention_mask is None else attention_mask.to(device),
            # A decoder builds no key/value cache for a one-shot forward (as probe runs it).
            **({"use_cache": False} if family == "gpt2" else {}),
        )

    expected = _num_layer_calls(work, family) + 1
    if len(states) != expected:
        raise RuntimeError(f"collected {len(states)} hidden states, expected {expected}")
    if family == "xlnet":  # XLNet runs sequence-first: (token, batch, hidden)
        states = [s.transpose(0, 1) for s in states]
    return [s.detach().contiguous() for s in states]
