"""Independent numpy oracle for probe.toy.model: the full forward and every path term.

Imports nothing from probe.  Works from a plain dict of float64 arrays (a
state_dict converted with ``.numpy()``), so it shares no code with the model.

Frozen normalisation: LN(z) = g * (z - mean z) / s + b with s = sqrt(var z + eps)
taken from the full forward.  Per layer the branches are: skip x -> N(x), head h
x -> N(P_h x Wv_h Wo_h); the constant K_l = N(1 c^T) + b (c = bv Wo + bo) is
added to the all-skip prefix.  Path terms are expanded prefix by prefix.
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


def embed_tokens(sd: dict, ids: np.ndarray) -> np.ndarray:
    x = sd["embed.weight"][ids]  # (B, T, D)
    if "position.weight" in sd:
        x = x + sd["position.weight"][: ids.shape[1]][None]
    return x


def full_forward(sd: dict, x0: np.ndarray, depth: int, heads: int, eps: float = 1e-5):
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


def path_terms(sd: dict, x0: np.ndarray, depth: int, heads: int, eps: float = 1e-5) -> dict:
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
