"""Independent numpy reference for the paper's constants (probe/measures/theory.py), reading the
HuggingFace weights by their own names.  Imports neither probe nor nnsight.

Row convention (tokens are rows): a head's scores are X A_q A_k^T X^T, its output
P X A_v A_o, with A = W^T for an nn.Linear weight W and A = W for GPT-2's Conv1D.
"""

from __future__ import annotations

import math

import numpy as np


def n1(a: np.ndarray) -> float:
    return float(np.abs(a).sum(axis=0).max())


def ninf(a: np.ndarray) -> float:
    return float(np.abs(a).sum(axis=1).max())


def n1inf(a: np.ndarray) -> float:
    return math.sqrt(n1(a) * ninf(a))


def _np(t) -> np.ndarray:
    return t.detach().double().numpy()


def _heads(a_q, a_k, a_v, a_o, H, kv):
    """(qk, vo) per query head from full projections in the row convention."""
    d = a_q.shape[1] // H
    qk, vo = [], []
    for h in range(H):
        g = h // (H // kv)  # the key/value head of query head h
        q = a_q[:, h * d : (h + 1) * d]
        k = a_k[:, g * d : (g + 1) * d]
        v = a_v[:, g * d : (g + 1) * d]
        o = a_o[h * d : (h + 1) * d, :]
        qk.append(n1(q @ k.T))
        vo.append(n1inf(v @ o))
    return qk, vo, d


def constants(model, family: str, lip: float) -> dict:
    """Per layer: max qk, max vo, beta, c = 4 beta H / sqrt(d), lambda (NaN when gated)."""
    config = model.config
    H = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or H
    out = {"qk": [], "vo": [], "beta": [], "c": [], "lambda": []}
    if family == "bert":
        layers = model.encoder.layer
    elif family in ("gpt2", "bloom"):
        layers = model.h
    else:
        layers = model.layers
    for layer in layers:
        if family == "bert":
            s = layer.attention.self
            a_q, a_k, a_v = (_np(m.weight).T for m in (s.query, s.key, s.value))
            a_o = _np(layer.attention.output.dense.weight).T
            m1 = _np(layer.intermediate.dense.weight).T
            m2 = _np(layer.output.dense.weight).T
        elif family == "gpt2":
            w = _np(layer.attn.c_attn.weight)  # (hidden, 3 hidden), columns [q | k | v]
            n = w.shape[0]
            a_q, a_k, a_v = w[:, :n], w[:, n : 2 * n], w[:, 2 * n :]
            a_o = _np(layer.attn.c_proj.weight)
            m1, m2 = _np(layer.mlp.c_fc.weight), _np(layer.mlp.c_proj.weight)
        elif family == "gpt-neox":  # fused, per head h rows [q_h | k_h | v_h]
            a = layer.attention
            w = _np(a.query_key_value.weight)
            n = w.shape[1]
            per = w.reshape(H, 3, n // H, n)
            a_q, a_k, a_v = (per[:, i].reshape(n, n).T for i in range(3))
            a_o = _np(a.dense.weight).T
            m1, m2 = _np(layer.mlp.dense_h_to_4h.weight).T, _np(layer.mlp.dense_4h_to_h.weight).T
        elif family == "bloom":  # BloomAttention._reshape: per head h rows [q_h | k_h | v_h]
            a = layer.self_attention
            w = _np(a.query_key_value.weight)
            n = w.shape[1]
            per = w.reshape(H, 3, n // H, n)
            a_q, a_k, a_v = (per[:, i].reshape(n, n).T for i in range(3))
            a_o = _np(a.dense.weight).T
            m1, m2 = _np(layer.mlp.dense_h_to_4h.weight).T, _np(layer.mlp.dense_4h_to_h.weight).T
        elif family == "phi3":  # fused rows [q (H d) | k (KV d) | v (KV d)], gated MLP
            w = _np(layer.self_attn.qkv_proj.weight)
            d = config.hidden_size // H
            a_q = w[: H * d].T
            a_k = w[H * d : (H + kv) * d].T
            a_v = w[(H + kv) * d :].T
            a_o = _np(layer.self_attn.o_proj.weight).T
            m1 = m2 = None
        else:  # Llama-style
            a = layer.self_attn
            a_q, a_k, a_v, a_o = (_np(m.weight).T for m in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
            m1 = m2 = None
        qk, vo, d = _heads(a_q, a_k, a_v, a_o, H, kv)
        beta = max(x * y for x, y in zip(qk, vo, strict=True))
        out["qk"].append(max(qk))
        out["vo"].append(max(vo))
        out["beta"].append(beta)
        out["c"].append(4 * beta * H / math.sqrt(d))
        out["lambda"].append(float("nan") if m1 is None else lip * n1inf(m1) * n1inf(m2))
    return out


def residual_1inf(x: np.ndarray) -> float:
    """||X - 1 mean^T||_{1,inf} of one (tokens, hidden) matrix."""
    return n1inf(x - x.mean(axis=0, keepdims=True))
