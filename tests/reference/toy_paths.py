"""Independent numpy oracle for probe.toy.model: the full forward, every path term, path chains.

Imports nothing from probe.  Works from a plain dict of float64 arrays (a
state_dict converted with ``.numpy()``), so it shares no code with the model.

Frozen normalisation: LN(z) = g * (z - mean z) / s + b with s = sqrt(var z + eps)
taken from the full forward.  Per layer the branches are: skip x -> N(x), head h
x -> N(P_h x Wv_h Wo_h); the constant K_l = N(1 c^T) + b (c = bv Wo + bo) is
added to the all-skip prefix.  Path terms are expanded prefix by prefix.

Chains (the paper's ``--no_sub_path``, read from its modeling_san.py): a path
skips a layer by passing its state on unchanged; at a head layer it computes
that head's attention from the queries and keys of its own state ("own") or
takes the full forward's ("full"), applies the head's value columns, the
matching rows of the output projection and the whole output bias, and
normalises with a LayerNorm without scale and shift ("paper") or the layer's
trained one ("trained").  The paths' outputs are summed, and under "paper" the
sum goes through one more LayerNorm without scale and shift.
"""

from __future__ import annotations

import itertools

import numpy as np


def _softmax(a: np.ndarray) -> np.ndarray:
    a = a - a.max(-1, keepdims=True)
    e = np.exp(a)
    return e / e.sum(-1, keepdims=True)


def _ln_stats(z: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(((z - z.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True) + eps)


def _plain_ln(z: np.ndarray, eps: float) -> np.ndarray:
    return (z - z.mean(-1, keepdims=True)) / _ln_stats(z, eps)


def embed_tokens(sd: dict, ids: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """X_0: token (+ position) embeddings, then the embedding LayerNorm when there is one."""
    x = sd["embed.weight"][ids]  # (B, T, D)
    if "position.weight" in sd:
        x = x + sd["position.weight"][: ids.shape[1]][None]
    if "embed_norm.weight" in sd:
        x = sd["embed_norm.weight"] * _plain_ln(x, eps) + sd["embed_norm.bias"]
    return x


def _head_attention(sd: dict, layer: int, x: np.ndarray, heads: int, h: int) -> np.ndarray:
    """Head h's attention (B, T, T) from the queries and keys of x."""
    g = lambda name: sd[f"layers.{layer}.{name}"]  # noqa: E731
    dh = x.shape[-1] // heads
    cols = slice(h * dh, (h + 1) * dh)
    q = x @ g("query.weight")[cols].T + g("query.bias")[cols]  # (B, T, dh)
    k = x @ g("key.weight")[cols].T + g("key.bias")[cols]
    return _softmax(np.einsum("bqd,bkd->bqk", q, k) / np.sqrt(dh))


def chain_sum(
    sd: dict,
    x0: np.ndarray,
    paths: list,
    depth: int,
    heads: int,
    attention: str,
    norm: str,
    eps: float = 1e-12,
) -> np.ndarray:
    """The state the read-out sees when the network is restricted to ``paths`` as chains."""
    per_layer, _ = full_forward(sd, x0, depth, heads, eps)
    d = x0.shape[-1]
    dh = d // heads
    total = np.zeros_like(x0)
    for path in paths:
        x = x0
        for layer, h in enumerate(path):
            if h is None:
                continue
            g = lambda name, layer=layer: sd[f"layers.{layer}.{name}"]  # noqa: E731
            if attention == "own":
                p = _head_attention(sd, layer, x, heads, h)
            else:
                p = per_layer[layer][1][:, h]
            cols = slice(h * dh, (h + 1) * dh)
            v = np.einsum("bqk,bkd->bqd", p, x @ g("value.weight")[cols].T + g("value.bias")[cols])
            z = v @ g("out.weight")[:, cols].T + g("out.bias")
            x = _plain_ln(z, eps)
            if norm == "trained":
                x = g("norm.weight") * x + g("norm.bias")
        total = total + x
    return _plain_ln(total, eps) if norm == "paper" else total


def full_forward(sd: dict, x0: np.ndarray, depth: int, heads: int, eps: float = 1e-12):
    """Per layer: (output, attention (B,H,T,T), scale s (B,T,1)); plus the final output."""
    per_layer = []
    x = x0
    for layer in range(depth):
        g = lambda name, layer=layer: sd[f"layers.{layer}.{name}"]  # noqa: E731
        b, t, d = x.shape
        dh = d // heads
        q = (x @ g("query.weight").T + g("query.bias")).reshape(b, t, heads, dh)
        k = (x @ g("key.weight").T + g("key.bias")).reshape(b, t, heads, dh)
        v = (x @ g("value.weight").T + g("value.bias")).reshape(b, t, heads, dh)
        p = _softmax(np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh))
        ctx = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, t, d)
        z = x + ctx @ g("out.weight").T + g("out.bias")
        s = _ln_stats(z, eps)
        x = g("norm.weight") * (z - z.mean(-1, keepdims=True)) / s + g("norm.bias")
        per_layer.append((x, p, s))
    return per_layer, x


def path_terms(sd: dict, x0: np.ndarray, depth: int, heads: int, eps: float = 1e-12) -> dict:
    """{path tuple (None = skip): its output (B, T, D)} for all (H+1)^depth paths."""
    per_layer, _ = full_forward(sd, x0, depth, heads, eps)
    d = x0.shape[-1]
    dh = d // heads
    terms = {(): x0}
    for layer in range(depth):
        g = lambda name, layer=layer: sd[f"layers.{layer}.{name}"]  # noqa: E731
        _, p, s = per_layer[layer]
        gain = g("norm.weight")

        def n(v, s=s, gain=gain):
            return gain * (v - v.mean(-1, keepdims=True)) / s

        const = g("value.bias") @ g("out.weight").T + g("out.bias")
        new = {}
        for prefix, t in terms.items():
            new[prefix + (None,)] = n(t)
            for h in range(heads):
                wv = g("value.weight")[h * dh : (h + 1) * dh].T  # (D, dh)
                wo = g("out.weight")[:, h * dh : (h + 1) * dh].T  # (dh, D)
                new[prefix + (h,)] = n(np.einsum("bqk,bkd->bqd", p[:, h], t) @ wv @ wo)
        skip_prefix = (None,) * (layer + 1)
        new[skip_prefix] = new[skip_prefix] + n(np.broadcast_to(const, x0.shape)) + g("norm.bias")
        terms = new
    assert set(terms) == set(itertools.product((None, *range(heads)), repeat=depth))
    return terms
