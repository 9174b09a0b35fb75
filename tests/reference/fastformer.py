"""Independent reference for the Fastformer causal LM (imports neither ``probe`` nor ``nnsight``).

Computes the forward pass of ``shared/fastformer-checkpoint.md`` straight from a
state dict and a config dict, with plain torch functions.  The causal pooling is
written the slow, obvious way: for every position i, a softmax over the scores
of positions 0..i and the weighted average of those x_j, O(T^2), so it shares no
code or trick (running maxima, blocks, cumulative sums) with the model.

The ablations are probe's, written as surgery on this forward:

* ``attn_skip=False``: r = pq * k (the ``h +`` identity path is dropped);
* ``strict=True`` (with attn_skip=False): also x = pk * v (the ``r +`` path);
* ``mlp=False``: the layer's output is the attention block's output.

``state_dict_for(config, seed)`` draws a hand-built checkpoint (every key and
shape of the format's table, both tied keys, LayerNorm gains away from 1) from a
seeded generator.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DEFAULTS = {
    "hidden_size": 256,
    "vocab_size": 32100,
    "n_heads": 4,
    "max_position_embeddings": 1024,
    "num_hidden_layers": 4,
    "convolve": False,
    "groups": 1,
    "kernel_size": 4,
}
EPS = 1e-5  # torch.nn.LayerNorm's default, used by the checkpoints' LayerNorms


def _cfg(config: dict) -> dict:
    return {**DEFAULTS, **config}


def state_dict_for(config: dict, seed: int = 0, dtype=torch.float64) -> dict[str, torch.Tensor]:
    """A checkpoint of the shared format, drawn by hand; word_embedding and proj_logits share values."""
    c = _cfg(config)
    d, V, P = c["hidden_size"], c["vocab_size"], c["max_position_embeddings"]
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape, std=0.3):
        return (std * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)

    def norm(prefix, sd):
        sd[f"{prefix}.weight"] = 1.0 + normal(d, std=0.2)
        sd[f"{prefix}.bias"] = normal(d, std=0.1)

    sd: dict[str, torch.Tensor] = {}
    embedding = normal(V, d)
    sd["word_embedding.weight"] = embedding
    sd["proj_logits.weight"] = embedding.clone()
    sd["proj_logits.bias"] = normal(V, std=0.1)
    sd["fastformer_model.position_embeddings.weight"] = normal(P, d)
    norm("fastformer_model.LayerNorm", sd)
    for i in range(c["num_hidden_layers"]):
        p = f"fastformer_model.decoders.{i}"
        if c["convolve"]:
            sd[f"{p}.convolutional_layer.convolutional_layer.weight"] = normal(
                d, d // c["groups"], c["kernel_size"], std=0.2
            )
            norm(f"{p}.convolutional_layer.conv_norm", sd)
        for name in ("Wquery", "Wkeys", "Wvalues", "attn_proj"):
            sd[f"{p}.attention.{name}.weight"] = normal(d, d, std=d**-0.5)
        sd[f"{p}.attention.query_attn"] = normal(d, std=1.0)
        sd[f"{p}.attention.key_attn"] = normal(d, std=1.0)
        norm(f"{p}.attention.attn_norm", sd)
        norm(f"{p}.attention.mid_norm", sd)
        sd[f"{p}.boom.weight"] = normal(4 * d, d, std=d**-0.5)
        sd[f"{p}.unboom.weight"] = normal(d, 4 * d, std=(4 * d) ** -0.5)
        norm(f"{p}.boom_norm", sd)
    return sd


def causal_average(x: torch.Tensor, w: torch.Tensor, n_heads: int, mask: torch.Tensor, rows=None):
    """For each i: softmax over j <= i of <x_j, w>/sqrt(s) + M_j, times x_j; O(T^2), per head.

    ``rows`` restricts the output to those positions: (batch, len(rows), hidden).
    """
    batch, tokens, d = x.shape
    s = d // n_heads
    rows = list(range(tokens)) if rows is None else list(rows)
    out = x.new_empty(batch, len(rows), d)
    penalty = (1.0 - mask.to(x.dtype)) * -10000.0  # (batch, token)
    for h in range(n_heads):
        cols = slice(h * s, (h + 1) * s)
        xh = x[:, :, cols]  # (batch, token, s)
        score = xh @ w[cols] / math.sqrt(s) + penalty  # (batch, token)
        for row, i in enumerate(rows):
            weights = torch.softmax(score[:, : i + 1], dim=-1)  # (batch, i+1)
            out[:, row, cols] = (weights[:, :, None] * xh[:, : i + 1]).sum(1)
    return out


def pooling_matrix(x: torch.Tensor, w: torch.Tensor, n_heads: int, mask: torch.Tensor):
    """a_ij for j <= i, zero above the diagonal: (batch, head, token, token), built row by row."""
    batch, tokens, d = x.shape
    s = d // n_heads
    penalty = (1.0 - mask.to(x.dtype)) * -10000.0
    a = torch.zeros(batch, n_heads, tokens, tokens, dtype=x.dtype)
    for h in range(n_heads):
        score = x[:, :, h * s : (h + 1) * s] @ w[h * s : (h + 1) * s] / math.sqrt(s) + penalty
        for i in range(tokens):
            a[:, h, i, : i + 1] = torch.softmax(score[:, : i + 1], dim=-1)
    return a


def _ln(x, sd, prefix):
    return F.layer_norm(x, x.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], EPS)


def forward(
    sd: dict,
    config: dict,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    attn_skip: bool = True,
    strict: bool = False,
    mlp: bool = True,
    pooling: list | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits, [X_0, ..., X_L]); ``pooling``, if a list, receives per layer (query, key) matrices."""
    c = _cfg(config)
    d, H = c["hidden_size"], c["n_heads"]
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    tokens = input_ids.shape[1]
    x = (
        sd["word_embedding.weight"][input_ids]
        + sd["fastformer_model.position_embeddings.weight"][:tokens]
    )
    x = _ln(x, sd, "fastformer_model.LayerNorm")
    states = [x]
    for i in range(c["num_hidden_layers"]):
        p = f"fastformer_model.decoders.{i}"
        if c["convolve"]:
            normed = _ln(x, sd, f"{p}.convolutional_layer.conv_norm").transpose(1, 2)
            padded = F.pad(normed, (c["kernel_size"] - 1, 0))
            weight = sd[f"{p}.convolutional_layer.convolutional_layer.weight"]
            x = x + F.conv1d(padded, weight, groups=c["groups"]).transpose(1, 2)
        a = f"{p}.attention"
        h = _ln(x, sd, f"{a}.attn_norm")
        q, k, v = (h @ sd[f"{a}.{n}.weight"].T for n in ("Wquery", "Wkeys", "Wvalues"))
        pq = causal_average(q, sd[f"{a}.query_attn"], H, mask) @ sd[f"{a}.attn_proj.weight"].T
        r = h + pq * k if attn_skip else pq * k
        mid = _ln(r, sd, f"{a}.mid_norm")
        pk = causal_average(mid, sd[f"{a}.key_attn"], H, mask)
        if pooling is not None:
            pooling.append(
                (
                    pooling_matrix(q, sd[f"{a}.query_attn"], H, mask),
                    pooling_matrix(mid, sd[f"{a}.key_attn"], H, mask),
                )
            )
        x = pk * v if (strict and not attn_skip) else r + pk * v
        if mlp:
            inner = F.gelu(_ln(x, sd, f"{p}.boom_norm") @ sd[f"{p}.boom.weight"].T)
            x = x + inner @ sd[f"{p}.unboom.weight"].T
        states.append(x)
    logits = (x @ sd["proj_logits.weight"].T + sd["proj_logits.bias"]) / math.sqrt(d)
    return logits, states
