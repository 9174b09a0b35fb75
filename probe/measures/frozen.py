"""The frozen SAN+skip network and its exact sum over paths (Dong et al. 2021, Section 2.2).

What makes a SAN+skip layer non-linear in its input is the attention
probabilities A_h and each LayerNorm's per-token scale 1/sigma.  Fixing both at
the values of one real forward pass makes every layer an affine map of the
token matrix x (token, hidden):

    post-LN (BERT, ALBERT, XLNet):  F(x) = N(x + sum_h A_h (x W_v^h + 1 b_v^h) W_o^h + 1 b_o)
    pre-LN  (GPT-2, Llama, ...):    F(x) = x + sum_h A_h (N(x) W_v^h + 1 b_v^h) W_o^h + 1 b_o
    sandwich (Gemma2):              F(x) = x + P(sum_h A_h (N(x) W_v^h + 1 b_v^h) W_o^h + 1 b_o)

with the frozen LayerNorm N(z) = diag(s) (z - mean_row(z)) diag(gamma) + 1 beta^T and
s = 1/sigma read from the real run; an RMS norm (Llama, T5; Gemma's scales by 1 + w)
does not centre and has no beta: N(z) = diag(s) z diag(gamma), s = 1/rms(z).  Grouped-query
attention enters only through W_v^h (each key/value head's weights repeated for its
query heads), Gemma2's norm P on the attention output is frozen like N.  Split each F into its skip branch, its head
branch (both linear) and the constant F(0).  Unrolling L layers, the output is
a sum over the (H+1)^L choices of skip or one head per layer, each a linear map
of the embeddings X_0, plus one constant that gathers every bias, beta and
their images through the later layers.  Grouping paths by length k (the number
of heads), the contribution V_l[k] of all C(l,k) H^k paths of length k after
l layers obeys

    V_l[k] = Skip_l(V_{l-1}[k]) + Heads_l(V_{l-1}[k-1]),     V_0[0] = X_0,
    K_l    = Skip_l(K_{l-1}) + Heads_l(K_{l-1}) + F_l(0),    K_0 = 0,

so the whole decomposition costs one skip and one head application per (layer,
length) pair, about L^2/2 layer applications, never an enumeration of paths.
Everything runs in float64: the programme is exact up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.models.base import LayerWeights

F64 = torch.float64


@dataclass(frozen=True)
class FrozenLayer:
    """One SAN+skip layer with its attention and norm scales fixed (all float64)."""

    weights: LayerWeights
    attn: torch.Tensor  # (batch, head, token, token)
    scale: torch.Tensor  # (batch, token): 1/sigma (1/rms) of the frozen norm
    branch_scale: torch.Tensor | None = None  # (batch, token): Gemma2's norm on the heads


@dataclass(frozen=True)
class FrozenNorm:
    """A final norm that belongs to the output (GPT-2's ln_f, Llama's norm), scale fixed."""

    gamma: torch.Tensor
    beta: torch.Tensor
    scale: torch.Tensor  # (batch, token)
    kind: str = "layernorm"


def inverse_sigma(norm_input: torch.Tensor, eps: float, kind: str = "layernorm") -> torch.Tensor:
    """1/sigma (LayerNorm) or 1/rms (RMS norms) per token of a norm's input (batch, token, hidden)."""
    z = norm_input.to(F64)
    if kind == "none":
        return torch.ones(z.shape[:-1], dtype=F64, device=z.device)
    if kind == "rms":
        return torch.rsqrt(z.square().mean(-1) + eps)
    return torch.rsqrt(z.var(-1, unbiased=False) + eps)


def freeze(
    weights: LayerWeights,
    attn: torch.Tensor,
    norm_input: torch.Tensor,
    branch_norm_input: torch.Tensor | None = None,
) -> FrozenLayer:
    w = LayerWeights(
        **{
            name: value.to(F64) if isinstance(value, torch.Tensor) else value
            for name, value in vars(weights).items()
        }
    )
    branch = None
    if w.branch_gamma is not None:
        branch = inverse_sigma(branch_norm_input, w.branch_eps, w.branch_kind)
    return FrozenLayer(w, attn.to(F64), inverse_sigma(norm_input, w.eps, w.kind), branch)


def _norm(x: torch.Tensor, gamma, beta, scale, bias: bool, kind: str = "layernorm"):
    """Frozen norm of x (..., batch, token, hidden): linear, plus beta when ``bias``."""
    if kind == "none":
        return x
    centred = x - x.mean(-1, keepdim=True) if kind == "layernorm" else x
    y = centred * scale[..., None] * gamma
    return y + beta if bias and kind == "layernorm" else y


def _heads(layer: FrozenLayer, x: torch.Tensor, bias: bool) -> torch.Tensor:
    """sum_h A_h (x W_v^h [+ b_v^h]) W_o^h [+ b_o] for x (..., batch, token, hidden)."""
    w = layer.weights
    x4 = x.reshape(-1, *x.shape[-3:])  # (n, batch, token, hidden): n stacked terms
    v = torch.einsum("nbtd,hde->bhtne", x4, w.w_v)  # (batch, head, token, n, head_dim)
    if bias:
        v = v + w.b_v[:, None, None, :]  # (head, 1, 1, head_dim)
    b, h, t, n, e = v.shape
    # One matmul per (batch, head) for all n terms: A is never expanded n times.
    ctx = (layer.attn @ v.reshape(b, h, t, n * e)).reshape(b, h, t, n, e)
    out = torch.einsum("bhtne,hed->nbtd", ctx, w.w_o).reshape(x.shape)
    return out + w.b_o if bias else out


def apply(
    layer: FrozenLayer, x: torch.Tensor, *, skip: bool = True, heads: bool = True, bias: bool = True
) -> torch.Tensor:
    """The frozen layer on x (..., batch, token, hidden), with chosen branches and biases.

    ``bias=False`` gives the linear part (no b_v, b_o, beta); ``skip``/``heads``
    select the branches, so Skip + Heads + F(0) = F for the full layer.
    """
    w = layer.weights
    if w.norm == "post":
        z = torch.zeros_like(x)
        if skip:
            z = z + x
        if heads:
            z = z + _heads(layer, x, bias)
        return _norm(z, w.gamma, w.beta, layer.scale, bias, w.kind)
    out = x if skip else torch.zeros_like(x)
    if heads:
        h = _heads(layer, _norm(x, w.gamma, w.beta, layer.scale, bias, w.kind), bias)
        if layer.branch_scale is not None:  # Gemma2: a norm on the attention output
            h = _norm(h, w.branch_gamma, None, layer.branch_scale, False, w.branch_kind)
        out = out + h
    return out


def forward(
    layers: list[FrozenLayer], x0: torch.Tensor, final: FrozenNorm | None = None
) -> list[torch.Tensor]:
    """The frozen network run layer by layer: [X_0, X_1, ..., X_L] (+ the final norm's output)."""
    xs = [x0.to(F64)]
    for layer in layers:
        xs.append(apply(layer, xs[-1]))
    if final is not None:
        xs.append(_norm(xs[-1], final.gamma, final.beta, final.scale, True, final.kind))
    return xs


def iter_path_terms(layers: list[FrozenLayer], x0: torch.Tensor, final: FrozenNorm | None = None):
    """The programme, one layer at a time: yields (V_l, K_l) for l = 0..L (see path_terms).

    Only the current layer's terms are held, so memory stays at O(L) terms.
    """
    terms = x0.to(F64)[None]  # (1, batch, token, hidden): the one path of length 0
    const = torch.zeros_like(terms[0])
    yield terms, const
    for layer in layers:
        stacked = torch.cat([terms, const[None]])  # the constant rides along the linear maps
        skip = apply(layer, stacked, heads=False, bias=False)
        head = apply(layer, stacked, skip=False, bias=False)
        n = terms.shape[0]
        new = torch.zeros((n + 1, *terms.shape[1:]), dtype=F64, device=terms.device)
        new[:n] += skip[:n]  # paths that take the skip keep their length
        new[1:] += head[:n]  # paths that take a head grow by one
        const = skip[n] + head[n] + apply(layer, torch.zeros_like(const))
        terms = new
        yield terms, const
    if final is not None:
        yield (
            _norm(terms, final.gamma, final.beta, final.scale, False, final.kind),
            _norm(const, final.gamma, final.beta, final.scale, True, final.kind),
        )


def path_terms(
    layers: list[FrozenLayer], x0: torch.Tensor, final: FrozenNorm | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The programme: per layer l, the terms V_l (l+1, batch, token, hidden) and constant K_l.

    ``V_l[k]`` is the summed contribution of all paths of length k through the
    first l layers; ``sum_k V_l[k] + K_l`` equals the frozen network's X_l.  With
    a ``final`` norm one more entry holds the decomposition of its output.
    """
    all_terms, all_const = [], []
    for terms, const in iter_path_terms(layers, x0, final):
        all_terms.append(terms)
        all_const.append(const)
    return all_terms, all_const
