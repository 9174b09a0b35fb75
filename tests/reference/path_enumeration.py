"""Brute-force sum over paths of a frozen SAN+skip network (no ``probe`` imports).

The oracle for ``probe.frozen.path_terms``.  Given a HuggingFace base model, the
embeddings X_0 and, per layer, the attention probabilities and the input of the
LayerNorm to freeze (both from one real run of the SAN+skip variant), it

* reads every head's value and output projection straight from the model's own
  modules (``value``/``dense``, XLNet's ``v``/``o``, GPT-2's ``c_attn``/``c_proj``);
* walks each of the (H+1)^L paths one layer at a time, applying either the skip
  branch or the one head the path chooses, with every bias and LayerNorm shift
  left out (those belong to the constant);
* sums the paths of each length k;
* computes the constant as the frozen network applied to zero embeddings.

Per family, with N the frozen LayerNorm (per-token 1/sigma from the given input):
post-LN (BERT, ALBERT, XLNet) a layer is N(x + sum_h heads_h(x)); pre-LN GPT-2
is x + sum_h heads_h(N(x)), and its final ln_f (frozen from the last output) is
applied to every path.  Everything is float64.
"""

from __future__ import annotations

import itertools

import torch
from transformers import AlbertModel, BertModel, GPT2Model, XLNetModel

F64 = torch.float64


def _d(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(F64)


def _heads_of(model, index: int):
    """Per head h: (W_v (hidden, d), b_v (d,), W_o (d, hidden)); b_o; (gamma, beta, eps); 'post'/'pre'."""
    if isinstance(model, BertModel | AlbertModel):
        if isinstance(model, BertModel):
            att = model.encoder.layer[index].attention
            value, dense, ln = att.self.value, att.output.dense, att.output.LayerNorm
        else:
            att = model.encoder.albert_layer_groups[0].albert_layers[0].attention
            value, dense, ln = att.value, att.dense, att.LayerNorm
        n = model.config.num_attention_heads
        d = value.weight.shape[0] // n
        heads = [
            (
                _d(value.weight[h * d : (h + 1) * d, :]).T,
                _d(value.bias[h * d : (h + 1) * d]),
                _d(dense.weight[:, h * d : (h + 1) * d]).T,
            )
            for h in range(n)
        ]
        return heads, _d(dense.bias), (_d(ln.weight), _d(ln.bias), ln.eps), "post"
    if isinstance(model, XLNetModel):
        rel = model.layer[index].rel_attn
        heads = [
            (_d(rel.v[:, h, :]), torch.zeros(rel.v.shape[2], dtype=F64), _d(rel.o[:, h, :]).T)
            for h in range(rel.v.shape[1])
        ]
        zeros = torch.zeros(rel.v.shape[0], dtype=F64)
        ln = rel.layer_norm
        return heads, zeros, (_d(ln.weight), _d(ln.bias), ln.eps), "post"
    if isinstance(model, GPT2Model):
        block = model.h[index]
        hidden, n = model.config.n_embd, model.config.n_head
        d = hidden // n
        w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
        proj = block.attn.c_proj
        heads = [
            (
                _d(w[:, 2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
                _d(b[2 * hidden + h * d : 2 * hidden + (h + 1) * d]),
                _d(proj.weight[h * d : (h + 1) * d, :]),
            )
            for h in range(n)
        ]
        ln = block.ln_1
        return heads, _d(proj.bias), (_d(ln.weight), _d(ln.bias), ln.eps), "pre"
    raise ValueError(f"unsupported model {type(model).__name__}")


def _frozen_norm(z, norm_input, gamma, beta, eps, shift: bool):
    """LayerNorm of z with sigma taken from norm_input (per token), beta only when ``shift``."""
    x = _d(norm_input)
    sigma = torch.sqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, keepdim=True) + eps)
    y = (z - z.mean(-1, keepdim=True)) / sigma * gamma
    return y + beta if shift else y


class FrozenReference:
    """The frozen SAN+skip network of ``model`` for one batch, written branch by branch."""

    def __init__(self, model, x0, attn, norm_inputs, final_input=None):
        self.model = model
        self.x0 = _d(x0)
        self.attn = [_d(a) for a in attn]
        self.norm_inputs = norm_inputs
        self.layers = [_heads_of(model, i) for i in range(len(attn))]
        self.final = None
        if isinstance(model, GPT2Model):
            ln = model.ln_f
            self.final = (_d(ln.weight), _d(ln.bias), ln.eps, final_input)

    def step(self, index: int, x, choice, biases: bool):
        """One layer on x: ``choice`` is None (skip), a head index, or "all" (the whole layer)."""
        heads, b_o, (gamma, beta, eps), where = self.layers[index]
        A, z_in = self.attn[index], self.norm_inputs[index]

        def head(h, inp):
            w_v, b_v, w_o = heads[h]
            v = inp @ w_v + (b_v if biases else 0)  # (batch, token, d)
            return (A[:, h] @ v) @ w_o

        def norm(z):
            return _frozen_norm(z, z_in, gamma, beta, eps, biases)

        if where == "post":
            if choice is None:
                return norm(x)
            if choice == "all":
                total = x + sum(head(h, x) for h in range(len(heads)))
                return norm(total + (b_o if biases else 0))
            return norm(head(choice, x))
        if choice is None:
            return x
        if choice == "all":
            inner = norm(x)
            return x + sum(head(h, inner) for h in range(len(heads))) + (b_o if biases else 0)
        return head(choice, norm(x))

    def finish(self, y, biases: bool):
        if self.final is None:
            return y
        gamma, beta, eps, final_input = self.final
        return _frozen_norm(y, final_input, gamma, beta, eps, biases)

    def path(self, path):
        """Contribution of one path (a tuple: None = skip, else a head index per layer)."""
        x = self.x0
        for index, choice in enumerate(path):
            x = self.step(index, x, choice, biases=False)
        return self.finish(x, biases=False)

    def constant(self):
        """The frozen network on zero embeddings: every bias and shift, propagated."""
        x = torch.zeros_like(self.x0)
        for index in range(len(self.layers)):
            x = self.step(index, x, "all", biases=True)
        return self.finish(x, biases=True)

    def output(self):
        """The frozen network on X_0, layer by layer (the whole affine map)."""
        x = self.x0
        for index in range(len(self.layers)):
            x = self.step(index, x, "all", biases=True)
        return self.finish(x, biases=True)

    def by_length(self):
        """Sum of the contributions of all paths of each length 0..L (enumerating (H+1)^L paths)."""
        L = len(self.layers)
        n_heads = len(self.layers[0][0])
        sums = [torch.zeros_like(self.finish(self.x0, False)) for _ in range(L + 1)]
        count = 0
        for path in itertools.product([None, *range(n_heads)], repeat=L):
            sums[sum(c is not None for c in path)] += self.path(path)
            count += 1
        assert count == (n_heads + 1) ** L
        return sums
