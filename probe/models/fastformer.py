"""Fastformer causal LM (additive attention; ``probe.fastformer``).

One layer computes, with ``pool`` the causal additive pooling (a_ij below)::

    h = attn_norm(x)                              # (conv block first, if convolve)
    r = skip(h) + pq * k                          # pq = attn_proj(pool(Wquery h, query_attn))
    a = mid_skip(r) + pk * v                      # pk = pool(mid_norm(r), key_attn)
    y = a + unboom(gelu(boom(boom_norm(a))))

``skip`` and ``mid_skip`` are parameterless identities that name the two
residual terms of the attention block, so the hooks reach the additions.

================  ===============================================  ==========================================
ablation          probe (hook)                                     paper's surgery
================  ===============================================  ==========================================
no skip           ``r = pq * k``: the output of ``attention.skip``  not in the paper (no Fastformer there);
                  (the identity path ``h +``) is replaced by        probe's definition: drop the identity term
                  zeros; ``a = r + pk * v`` stays                    of the attention block's residual sum
no skip (strict)  also ``a = pk * v``: ``attention.mid_skip``       a second reading, offered by
                  (the ``r +`` path) is zeroed as well;             :func:`strict_skip`: no path around
                  only with :func:`strict_skip`                     either pooling is left
no MLP            ``y = a``: ``unboom``'s output is replaced by     same definition: the MLP, its norm and
                  zeros, so the layer adds exactly nothing          its residual removed
================  ===============================================  ==========================================

The residual stream is each layer's output (the sum itself: this family is
pre-LN and has no final LayerNorm).  The pooling weights of both poolings
come from :meth:`FastformerAdapter.attention_probs` as (batch, head, token,
token) lower-triangular, row-stochastic matrices; the pooled vector of a head
is ``a @ x_head``.  The block's elementwise products (``pq * k``, ``pk * v``)
make a layer multilinear in its input, not affine in it for frozen weights,
so the path decomposition of an attention network does not apply exactly here.
"""

from __future__ import annotations

import dataclasses

import torch

from probe.surgery.ablate import Ablation

from .base import Adapter

MODEL_TYPE = "FastformerForCausalLM"


class FastformerAdapter(Adapter):
    family = "fastformer"
    model_types = (MODEL_TYPE,)
    table = (
        {
            "ablation": "no skip",
            "probe": "r = pq * k instead of h + pq * k (attention.skip, the identity path h +, "
            "set to zero); the mid residual r + pk * v stays",
            "paper": "not probed in the paper; same definition as for the other families",
        },
        {
            "ablation": "no skip (strict)",
            "probe": "also a = pk * v (attention.mid_skip, the r + path, set to zero); "
            "only through probe.models.fastformer.strict_skip",
            "paper": "not probed in the paper; a stricter second reading",
        },
        {
            "ablation": "no MLP",
            "probe": "layer output = attention block output (unboom's output set to zero)",
            "paper": "not probed in the paper; same definition as for the other families",
        },
    )

    causal = True
    not_decomposable = (
        "the Fastformer's additive attention multiplies pooled vectors elementwise with the "
        "tokens, so a layer is multilinear, not affine, in its input even with its poolings "
        "frozen; the exact path-length decomposition does not apply (`sample` works)"
    )

    def __init__(self, strict: bool = False):
        self.strict = strict

    def path_heads(self, config) -> int:
        """2H: a sampled path picks one of the H query-pooling or the H key-pooling matrices."""
        return 2 * self.n_heads(config)

    def paths_layer(self, layer, ablation: Ablation, norms: bool) -> dict:
        """Both poolings' matrices as heads (query pooling 0..H-1, key pooling H..2H-1)."""
        heads = layer.attention.query_pool._module.n_heads  # CausalPooling's own head count
        found = self._walk(layer, None if ablation.is_identity else ablation, heads)
        return {"attn": torch.cat([found["query"], found["key"]], dim=1), "norm_input": None}

    def layers(self, root):
        return root.fastformer_model.decoders

    def ablate(self, layer, ablation: Ablation) -> None:
        self._walk(layer, ablation)

    def attention_probs(
        self, layer, n_heads: int, ablation: Ablation | None = None
    ) -> dict[str, torch.Tensor]:
        """Inside a trace: {"query": a, "key": a}, each (batch, head, token, token).

        a_ij = exp(score_j) / sum_{j'<=i} exp(score_j'), j <= i, for the query
        pooling (over Wquery h) and the key pooling (over mid_norm(r)).  The
        layer's ablation is written in the same pass, since nnsight needs every
        read and write of a layer in forward order.
        """
        return self._walk(layer, ablation, n_heads)

    def _walk(self, layer, ablation: Ablation | None, n_heads: int | None = None) -> dict:
        """Probabilities (if ``n_heads``) and interventions, in the layer's forward order."""
        from ..fastformer.pooling import pooling_weights

        def probs(pool):
            (x, w, mask, _state), _ = pool.inputs  # CausalPooling.forward(x, w, mask, state)
            return pooling_weights(x, w, n_heads, mask)

        cut = ablation is not None and not ablation.attn_skip
        found = {}
        attention = layer.attention
        if n_heads is not None:
            found["query"] = probs(attention.query_pool)
        if cut:
            skip = attention.skip  # nn.Identity on h: the `h +` term
            skip.output = torch.zeros_like(skip.output)
        if n_heads is not None:
            found["key"] = probs(attention.key_pool)
        if cut and self.strict:
            mid = attention.mid_skip  # nn.Identity on r: the `r +` term
            mid.output = torch.zeros_like(mid.output)
        if ablation is not None and not ablation.mlp:
            unboom = layer.unboom  # (batch, token, hidden): the MLP branch before dropout
            unboom.output = torch.zeros_like(unboom.output)
        return found


def strict_skip(probed):
    """The same loaded model, with "no skip" read strictly (a = pk * v, no ``r +`` path)."""
    strict = dataclasses.replace(probed, adapter=FastformerAdapter(strict=True))
    strict.__dict__["envoy"] = probed.envoy  # one nnsight wrapper per model
    return strict


def attention_probs(probed, input_ids, attention_mask=None, ablation: Ablation | None = None):
    """Pooling matrices of every layer: a list of {"query", "key"} -> (batch, head, token, token).

    Runs one trace (under ``ablation``, default none) and returns the matrices
    as tensors on the model's device.
    """
    from probe.surgery.ablate import TRANSFORMER

    ablation = TRANSFORMER if ablation is None else ablation
    adapter = probed.adapter
    heads = adapter.n_heads(probed.config)
    input_ids = input_ids.to(probed.device)
    mask = (
        torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(probed.device)
    )
    values: list = []  # outside the trace: nnsight keeps what the body appends
    root = probed.envoy
    with torch.no_grad(), root.trace(input_ids, attention_mask=mask):
        for layer in adapter.layers(root):
            values.append(adapter.attention_probs(layer, heads, ablation))
    return values
