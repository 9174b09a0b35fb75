"""The small post-LN self-attention network of the paper's trained experiments, and its paths.

The embedding maps the input to X_0 (T x D): token (+ position) embeddings, or a
linear map (convex hull: a two-layer MLP) of the point coordinates, followed by
a LayerNorm, as in the paper's code (``modeling_san.py``: ``BertEmbeddings``
and ``embed_ffn``/``embed_LN``).  Layer l (l = 1..L) maps X to

    A(X) = sum_h P_h X W_V^h W_O^h + 1 c^T,        c = sum_h b_V^h W_O^h + b_O       (1)
    Y    = LN(X + A(X))          (skip; the pure-attention variant drops the X)      (2)
    Y'   = LN2(Y + MLP(Y))       (only when asked for an MLP)                        (3)

P_h = softmax(X W_Q^h (X W_K^h)^T / sqrt(d_h)) is head h's attention, W_V^h the
columns of the value projection that belong to head h and W_O^h the matching
rows of the output projection (Dong, Cordonnier & Loukas 2021, eq. 1).  A
linear read-out maps each token of X_L to the outputs.

As in the paper's runs: weights start from BERT's initialisation (normal with
std 0.02 for embeddings, queries, keys, MLP and read-out, zero biases; the value
and output projections keep PyTorch's Kaiming-uniform draw, as the paper's
``value``/``dense`` parameters do), dropout 0.1 on the embedding output, the
attention probabilities, each sublayer's output and the read-out's input while
training (off in evaluation), and LayerNorm eps 1e-12 (BERT's).  The paper's
token embedding has one more linear map after the embedding sum; an embedding
followed by a linear map is again an embedding, so it is left out.

Paths (Section 2.2 of the paper).  With skip connections and no MLP, layer l
either passes its input through the skip or through one head, and the network
unrolls into (H+1)^L paths.  Two ways to evaluate a set of paths:

``sub_path=False`` (the paper's ``no_sub_path`` option, its path figures): each path
is a pure chain of single heads.  At a skip layer the path bypasses the layer
(x -> x); at a head layer

    x -> N(P_h x W_V^h W_O^h + 1 (b_V^h W_O^h + b_O)^T)

and the outputs of the given paths are summed.  Two rules choose P_h and N:

* ``attention="own"`` (the paper's): P_h = softmax of the queries and keys of
  the path's own state x, recomputed along the path; ``"full"``: P_h from the
  full model's forward on the same input.
* ``norm="paper"`` (the paper's): N is a LayerNorm without learned scale and
  shift, and one more such LayerNorm is applied to the summed paths before the
  read-out; ``"trained"``: N is the layer's trained LayerNorm and the sum goes
  to the read-out as it is.

``sub_path=True``: each path's term of the exact decomposition.  Freeze the
normalisation at the statistics of the full forward: LN(z) = N_l(z) + beta with
the linear map N_l(z) = gamma * (z - mean(z)) / s_l, s_l = sqrt(var + eps) read
per token from the full forward (the centring is linear and stays live; only
s_l is frozen).  With the attention P_h of the full forward every layer is then
affine and (1)-(2) expand into (H+1)^L paths: at layer l a path either takes the
skip, x -> N_l(x), or one head, x -> N_l(P_h x W_V^h W_O^h).  The constants a
layer adds, K_l = N_l(1 c^T) + beta, are carried by the paths that take the skip
at layers 1..l (the all-skip prefix), so the sum of all (H+1)^L path outputs
equals the full forward exactly (tests/reference/toy_paths.py checks it to
1e-10 in float64).  The read-out's bias is added once, after the sum.

Paths need the skip connection and no MLP (an MLP is not linear, and without
the skip there is no skip branch to take); the circle experiment, which uses
those variants, only runs the full forward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probe.errors import ProbeError
from probe.measures.path_vocabulary import SKIP
from probe.names import PATH_ATTENTIONS, PATH_NORMS

#: Weight initialisations: BERT's (the paper's SAN is a BertPreTrainedModel) or PyTorch's defaults.
INITS = ("bert", "torch")


@dataclass(frozen=True)
class ToyConfig:
    """Sizes of a toy network; ``vocab`` for token inputs, ``in_features`` for points."""

    hidden: int
    heads: int
    depth: int
    n_out: int
    vocab: int | None = None
    in_features: int | None = None
    max_len: int = 0  # learned position embeddings for token inputs when > 0
    skip: bool = True  # the attention sublayer's skip connection, eq. (2)
    mlp: bool = False
    embed_mlp: bool = True  # points: lift the coordinates with a small MLP, else one linear map
    embed_norm: bool = True  # a LayerNorm on the embedding output (the paper's)
    dropout: float = 0.1  # BERT's hidden and attention dropout, active in training only
    init: str = "bert"
    eps: float = 1e-12  # BERT's layer_norm_eps

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ProbeError(f"hidden {self.hidden} is not a multiple of width {self.heads}")
        if (self.vocab is None) == (self.in_features is None):
            raise ProbeError("give exactly one of vocab (tokens) or in_features (points)")
        if min(self.hidden, self.heads, self.depth, self.n_out) < 1:
            raise ProbeError("hidden, width, depth and outputs must be at least 1")
        if not 0 <= self.dropout < 1:
            raise ProbeError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.init not in INITS:
            raise ProbeError(f"unknown init {self.init!r}; choose from {', '.join(INITS)}")


def plain_norm(z: Tensor, eps: float) -> Tensor:
    """LayerNorm without learned scale and shift: (z - mean) / sqrt(var + eps) per token."""
    return nn.functional.layer_norm(z, z.shape[-1:], eps=eps)


class Layer(nn.Module):
    """One post-LN attention layer, eqs. (1)-(3)."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        d = cfg.hidden
        self.heads, self.d_head, self.skip = cfg.heads, d // cfg.heads, cfg.skip
        self.query, self.key = nn.Linear(d, d), nn.Linear(d, d)
        self.value, self.out = nn.Linear(d, d), nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.eps)
        self.drop_attn, self.drop = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.mlp = None
        if cfg.mlp:
            self.mlp = nn.Sequential(
                nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.Dropout(cfg.dropout)
            )
            self.norm2 = nn.LayerNorm(d, eps=cfg.eps)

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.d_head).transpose(1, 2)  # (B, H, T, d_h)

    def attention(self, x: Tensor) -> Tensor:
        """P (B, H, T, T) from the queries and keys of ``x``."""
        q, k = self._split(self.query(x)), self._split(self.key(x))
        return self.drop_attn(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d_head), -1))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(layer output, attention P, pre-LN sum z of eq. (2))."""
        p = self.attention(x)
        ctx = (p @ self._split(self.value(x))).transpose(1, 2).flatten(2)  # (B, T, D)
        z = self.drop(self.out(ctx)) + (x if self.skip else 0)
        y = self.norm(z)
        if self.mlp is not None:
            y = self.norm2(y + self.mlp(y))
        return y, p, z

    def head_maps(self, h: int) -> tuple[Tensor, Tensor, Tensor]:
        """(W_V^h W_O^h (D x D), b_V^h W_O^h (D,), b_O): head h's share of eq. (1)."""
        cols = slice(h * self.d_head, (h + 1) * self.d_head)
        w_v = self.value.weight[cols].T  # (D, d_h): x W_V^h
        w_o = self.out.weight[:, cols].T  # (d_h, D): the matching rows of W_O
        return w_v @ w_o, self.value.bias[cols] @ w_o, self.out.bias


class ToySAN(nn.Module):
    """Embedding (+ LayerNorm) -> L layers -> linear read-out per token."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        if cfg.vocab is not None:
            self.embed = nn.Embedding(cfg.vocab, d)
            self.position = nn.Embedding(cfg.max_len, d) if cfg.max_len > 0 else None
        else:
            # Points: no positions (a point set has no order).
            if cfg.embed_mlp:
                self.embed = nn.Sequential(
                    nn.Linear(cfg.in_features, d), nn.GELU(), nn.Linear(d, d)
                )
            else:
                self.embed = nn.Linear(cfg.in_features, d)
            self.position = None
        self.embed_norm = nn.LayerNorm(d, eps=cfg.eps) if cfg.embed_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.depth))
        self.readout = nn.Linear(d, cfg.n_out)
        if cfg.init == "bert":
            self._bert_init()

    @torch.no_grad()
    def _bert_init(self) -> None:
        # BertPreTrainedModel._init_weights: every nn.Linear and nn.Embedding ~ N(0, 0.02),
        # zero biases.  The paper's value and output projections are plain Parameters that
        # this init does not reach: they keep the Kaiming-uniform draw (PyTorch's Linear
        # default, already in place) and start with zero biases.
        own = {id(m) for layer in self.layers for m in (layer.value, layer.out)}
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding) and id(module) not in own:
                module.weight.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()

    def embeddings(self, x: Tensor) -> Tensor:
        """X_0 (B, T, D): where every path starts."""
        e = self.embed(x)
        if self.position is not None:
            if x.shape[1] > self.cfg.max_len:
                raise ProbeError(f"sequence of {x.shape[1]} tokens > max_len {self.cfg.max_len}")
            e = e + self.position(torch.arange(x.shape[1], device=x.device))
        if self.embed_norm is not None:
            e = self.embed_norm(e)
        return self.drop(e)

    def trace(self, x: Tensor) -> dict[str, list[Tensor]]:
        """Full forward keeping per layer: X_l (l = 0..L), P_l and the pre-LN sums z_l."""
        states, probs, sums = [self.embeddings(x)], [], []
        for layer in self.layers:
            y, p, z = layer(states[-1])
            states.append(y)
            probs.append(p)
            sums.append(z)
        return {"states": states, "probs": probs, "sums": sums}

    def forward(self, x: Tensor) -> Tensor:
        return self.readout(self.drop(self.trace(x)["states"][-1]))

    # ---- paths -----------------------------------------------------------------

    def path_states(
        self,
        x: Tensor,
        paths: Sequence[Sequence[int | None]],
        sub_path: bool = True,
        full: dict | None = None,
        attention: str = "own",
        norm: str = "paper",
    ) -> Tensor:
        """The token matrix (B, T, D) the read-out sees when the network is restricted to ``paths``.

        ``sub_path=True``: the sum of the paths' exact terms.  ``sub_path=False``: the sum
        of the paths as chains of single heads under the ``attention`` and ``norm`` rules
        (module docstring), then, for ``norm="paper"``, one more plain LayerNorm.
        ``full`` is ``self.trace(x)`` when the caller already has it (it is reused
        across many path sets of the same inputs)."""
        if not self.cfg.skip or self.cfg.mlp:
            raise ProbeError("paths need the skip connection and no MLP (see probe.toy.model)")
        if attention not in PATH_ATTENTIONS:
            raise ProbeError(f"unknown path attention {attention!r}; choose own or full")
        if norm not in PATH_NORMS:
            raise ProbeError(f"unknown path norm {norm!r}; choose paper or trained")
        for path in paths:
            if len(path) != self.cfg.depth or any(
                h is not SKIP and not 0 <= h < self.cfg.heads for h in path
            ):
                raise ProbeError(
                    f"path {tuple(path)} does not fit depth {self.cfg.depth}, width {self.cfg.heads}"
                )
        full = full if full is not None else self.trace(x)
        x0 = full["states"][0]
        total = torch.zeros_like(x0)
        for path in paths:
            if sub_path:
                total = total + self._frozen_path(x0, path, full)
            else:
                total = total + self._chain_path(x0, path, full, attention, norm)
        if not sub_path and norm == "paper":
            total = plain_norm(total, self.cfg.eps)
        return total

    def forward_paths(
        self,
        x: Tensor,
        paths: Sequence[Sequence[int | None]],
        sub_path: bool = True,
        full: dict | None = None,
        attention: str = "own",
        norm: str = "paper",
    ) -> Tensor:
        """The read-out of :meth:`path_states` (its bias added once)."""
        return self.readout(self.path_states(x, paths, sub_path, full, attention, norm))

    def _frozen_path(self, x: Tensor, path: Sequence[int | None], full: dict) -> Tensor:
        leading_skips = True
        for layer, h, p, z in zip(self.layers, path, full["probs"], full["sums"], strict=True):
            norm = layer.norm
            scale = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + norm.eps)  # frozen s_l

            def frozen(v: Tensor, norm=norm, scale=scale) -> Tensor:
                return norm.weight * (v - v.mean(-1, keepdim=True)) / scale

            if h is SKIP:
                x = frozen(x)
            else:
                w, _, _ = layer.head_maps(h)
                x = frozen(p[:, h] @ x @ w)  # (B, T, T) @ (B, T, D) @ (D, D)
                leading_skips = False
            if leading_skips:  # K_l rides the all-skip prefix
                c = layer.value.bias @ layer.out.weight.T + layer.out.bias  # eq. (1)'s c
                x = x + frozen(c.expand_as(x)) + norm.bias
        return x

    def _chain_path(
        self, x: Tensor, path: Sequence[int | None], full: dict, attention: str, norm: str
    ) -> Tensor:
        for layer, h, p_full in zip(self.layers, path, full["probs"], strict=True):
            if h is SKIP:
                continue
            # The paper recomputes the head's attention from the path's own state.
            p = layer.attention(x)[:, h] if attention == "own" else p_full[:, h]
            w, b_v, b_o = layer.head_maps(h)
            z = p @ x @ w + b_v + b_o
            x = plain_norm(z, layer.norm.eps) if norm == "paper" else layer.norm(z)
        return x
