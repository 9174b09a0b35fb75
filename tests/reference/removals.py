"""Independent reference for the removal variants (no-sink, no-massive), by module surgery.

Imports neither ``probe`` nor ``nnsight``.  Each function deep-copies the model, changes the
copy, runs its ordinary forward and records X_0 .. X_L with torch hooks on its layers (the
first ``nn.ModuleList`` of the model as long as its number of layers); the model passed in
is left as it was.

* ``no_sink_hidden_states``: the copy's attention runs through an eager attention written
  here (registered with transformers under its own name) which forms the probabilities
  P = softmax(q k^T * scale + mask) in float64 and then, for the layer it is in (counted in
  call order: one call per layer), sets P[:, h, i, k] = 0 for each sink (h, k) of that layer
  and divides each row by its new sum: removed and renormalised.  A row left with nothing
  (its only keys were sinks) keeps its probabilities; a learned sink logit (GPT-OSS's
  ``s_aux``) is not added to the softmax at all: no-sink removes it in every head.  That is
  the definition; the walker
  gets there another way (the sink keys' mask entry at the dtype's minimum), so the two agree
  to rounding, not to the bit.
* ``no_massive_hidden_states``: a forward hook on layer l returns its output with
  X_l[:, t, d] set to the given value, for each (l, t, d, value).
* ``found``: what a clean run holds, from the model's own attentions and the clean hidden
  states, with plain loops: the (layer, head, key) whose mean received attention over the
  real query rows that saw it (``allowed``: the run's mask, or every row) and then over
  sequences exceeds eps, and the (layer, token, dim) whose mean |x| over the
  sequences where the token is real exceeds ``ratio`` times the mean per-sequence median
  |entry|, with the mean x there.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from tests.reference.layers import record_stream

NAME = "reference_no_sink"


def _layers(model: nn.Module) -> nn.ModuleList:
    config = model.config
    n = getattr(config, "num_hidden_layers", None) or config.num_layers
    return next(m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n)


def _record(work: nn.Module, inputs: dict) -> list[torch.Tensor]:
    return [s.clone() for s in record_stream(work, _layers(work), inputs)]


def no_sink_hidden_states(
    model: nn.Module, inputs: dict, sinks, allowed: np.ndarray | None = None
) -> list[torch.Tensor]:
    """X_0 .. X_L with the attention to each (layer 1..L, head, key) of ``sinks`` removed;
    ``allowed`` (layer, query, key): the keys each query sees instead of the model's own
    mask (a mask of the run's own), the padding keys of ``inputs["attention_mask"]`` shut."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    calls = [0]

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  softcap=None, **kwargs):  # fmt: skip
        calls[0] += 1
        layer = calls[0]
        heads, kv_heads = query.shape[1], key.shape[1]
        if kv_heads != heads:
            b, _, t, d = key.shape
            shape = (b, kv_heads, heads // kv_heads, t, d)
            key = key[:, :, None].expand(shape).reshape(b, heads, t, d)
            value = value[:, :, None].expand(shape).reshape(b, heads, t, d)
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        scores = torch.matmul(query, key.transpose(2, 3)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if kwargs.get("position_bias") is not None:  # T5's relative position bias
            scores = scores + kwargs["position_bias"]
        if allowed is not None:  # the run's mask, built here from its pattern and the padding
            keys = key.shape[-2]
            opened = torch.from_numpy(allowed[layer - 1][:keys, :keys]).clone()[None, None]
            padding = inputs.get("attention_mask")
            if padding is not None:
                opened = opened & padding.bool()[:, None, None, :keys]
            attention_mask = torch.zeros(opened.shape, dtype=scores.dtype)
            attention_mask[~opened.expand(attention_mask.shape)] = torch.finfo(scores.dtype).min
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : key.shape[-2]]
        probs = torch.softmax(scores.to(torch.float64), dim=-1)
        for h in sorted({h for sink_layer, h, _ in sinks if sink_layer == layer}):
            cut = probs.clone()
            for sink_layer, h_, k in sinks:
                if (sink_layer, h_) == (layer, h):
                    cut[:, h, :, k] = 0.0
            total = cut[:, h].sum(-1, keepdim=True)  # (batch, query, 1)
            renormed = cut[:, h] / torch.where(total > 0, total, 1.0)
            probs[:, h] = torch.where(total > 0, renormed, probs[:, h])
        probs = probs.to(query.dtype)
        return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, eager_mask)
    work = copy.deepcopy(model).eval()
    work.config._attn_implementation = NAME
    for module in work.modules():
        if hasattr(module, "config") and module.config is not work.config:
            module.config._attn_implementation = NAME
    states = _record(work, inputs)
    assert calls[0] == len(states) - 1, "one attention call per layer"
    return states


def no_massive_hidden_states(model: nn.Module, inputs: dict, massive) -> list[torch.Tensor]:
    """X_0 .. X_L with X_l[:, t, d] = value for each (layer 1..L, t, d, value) of ``massive``."""
    work = copy.deepcopy(model).eval()
    for index, layer in enumerate(_layers(work), start=1):
        entries = [(t, d, v) for l_, t, d, v in massive if l_ == index]

        def replace(module, args, output, entries=entries):
            x = output[0] if isinstance(output, tuple) else output
            x = x.clone()
            for t, d, v in entries:
                x[:, t, d] = v
            return (x, *output[1:]) if isinstance(output, tuple) else x

        if entries:
            layer.register_forward_hook(replace)
    return _record(work, inputs)


def clean_hidden_states(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    return _record(copy.deepcopy(model).eval(), inputs)


def found(
    attentions: np.ndarray,
    states: list,
    mask: np.ndarray,
    eps: float,
    ratio: float,
    allowed: np.ndarray | None = None,
):
    """(sinks, massive) of a clean run, by loops (module docstring).  ``attentions``: (layer,
    sequence, head, query, key); ``states``: X_0 .. X_L; ``mask``: (sequence, token);
    ``allowed``: (layer, query, key), the keys each query saw (``tests/reference/own_masks``):
    a key's attention is averaged over the real rows that saw it (in a causal model the rows
    i >= k, Gu et al.'s importance score); None: over every real row."""
    L, B, H, T, _ = attentions.shape
    sinks = []
    for layer in range(L):
        for h in range(H):
            for k in range(T):
                total = 0.0
                for s in range(B):
                    real = [t for t in range(T) if mask[s, t]]
                    if k in real:
                        rows = [i for i in real if allowed is None or allowed[layer, i, k]]
                        total += sum(attentions[layer, s, h, i, k] for i in rows) / len(rows)
                if total / B > eps:
                    sinks.append((layer + 1, h, k))
    massive = []
    for layer in range(1, L + 1):
        x = states[layer].numpy()
        medians = []
        for s in range(B):
            values = np.sort(np.abs(x[s][mask[s].astype(bool)]).ravel())
            medians.append(values[(len(values) - 1) // 2])  # the lower median, as torch's
        median = sum(medians) / B
        for t in range(T):
            seqs = [s for s in range(B) if mask[s, t]]
            for d in range(x.shape[-1]):
                mean_abs = sum(abs(x[s, t, d]) for s in seqs) / len(seqs) if seqs else 0.0
                if mean_abs > ratio * median:
                    massive.append((layer, t, d, sum(x[s, t, d] for s in seqs) / len(seqs)))
    return sinks, massive
