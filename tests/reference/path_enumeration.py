"""Brute-force sum over paths of a frozen SAN+skip network (no ``probe`` imports).

The oracle for ``probe.measures.frozen.path_terms``.  Given a HuggingFace base model of any
family probe decomposes, the embeddings X_0 and, per layer, the attention
probabilities and the input of each norm to freeze (from one real run of the SAN+skip
variant: :func:`reference_reads` makes that run itself, by module surgery), it

* reads every head's value and output projection straight from the family's own
  modules (:func:`layer_params`, by the family's reference entry in ``families.py``
  and the readers of ``path_families.py``, per *query* head: a grouped-query head
  reads the key/value head of its group, h // (H / KV));
* walks each of the (H+1)^L paths one layer at a time, applying either the skip
  branch or the one head the path chooses, with every bias and norm shift left out
  (those belong to the constant);
* sums the paths of each length k;
* computes the constant as the frozen network applied to zero embeddings.

The frozen norms, with s the per-token scale read from the norm's real input u:

==========  =====================================  ==================================
kind        s                                       N(z)
==========  =====================================  ==================================
layer       1 / sqrt(var(u) + eps)                  (z - mean(z)) s gamma [+ beta]
rms         1 / sqrt(mean(u^2) + eps)               z s gamma (Gemma: gamma = 1 + w)
none        (ModernBERT's first layer: Identity)    z
==========  =====================================  ==================================

s is computed in float64 also where HF computes the norm in float32 (its RMS norms,
Cohere's LayerNorm: ``Norm.float32``): the frozen network is float64 and linear, and
that norm's float32 rounding in the real run is a gap the tests bound, not reproduce.

Per layout (x the layer's input, heads_h the frozen head h, N the frozen norm):
post-LN (BERT, RoBERTa, ELECTRA, DeBERTa-v2, DistilBERT, ALBERT, XLNet, OPT-350m) a
layer is N(x + sum_h heads_h(x)); pre-LN (GPT-2, Llama, Mistral, Qwen2/3, Gemma, Phi3,
OPT-125m, ModernBERT, T5, ViT, StableLM, Granite with its residual multiplier folded
into W_o and b_o, and the parallel GPT-J, GPT-NeoX, Falcon, Cohere, whose MLP is
removed) is x + sum_h heads_h(N(x)); Gemma2's sandwich is x + P(sum_h heads_h(N(x)))
with its post-attention norm P frozen too.  A final norm (GPT-2's ln_f, Llama's norm,
T5's final_layer_norm, ...), frozen from the last layer's output, is applied to
every path.  Everything is float64.
"""

from __future__ import annotations

import copy
import itertools
from functools import partial

import torch

from tests.reference.path_families import Layer, Norm, f64, reference_for

F64 = torch.float64

__all__ = ["FrozenReference", "Layer", "Norm", "final_norm", "layer_params", "reference_reads"]


def layer_params(model, index: int) -> Layer:
    """The frozen-able parameters of layer ``index``, read from the family's own modules by
    its reference entry (``tests/reference/families.py``)."""
    return reference_for(model).params(model, index)


def final_norm(model) -> Norm | None:
    """The norm after the last layer that belongs to the output, if the family has one."""
    return reference_for(model).final(model)


def _scale(norm: Norm, norm_input: torch.Tensor) -> torch.Tensor:
    """Per-token 1/sigma (layer) or 1/rms (rms) of the norm's real input, as a column."""
    u = f64(norm_input)
    if norm.kind == "rms":
        return 1.0 / torch.sqrt((u * u).mean(-1, keepdim=True) + norm.eps)
    centred = u - u.mean(-1, keepdim=True)
    return 1.0 / torch.sqrt((centred * centred).mean(-1, keepdim=True) + norm.eps)


def _frozen(norm: Norm, z: torch.Tensor, norm_input, shift: bool) -> torch.Tensor:
    """The norm of z with its per-token scale taken from ``norm_input``; beta when ``shift``."""
    if norm.kind == "none":
        return z
    s = _scale(norm, norm_input)
    if norm.kind == "rms":
        return z * s * norm.gamma
    y = (z - z.mean(-1, keepdim=True)) * s * norm.gamma
    return y + norm.beta if shift else y


class FrozenReference:
    """The frozen SAN+skip network of ``model`` for one batch, written branch by branch."""

    def __init__(self, model, x0, attn, norm_inputs, final_input=None, branch_inputs=None):
        self.model = model
        self.x0 = f64(x0)
        self.attn = [f64(a) for a in attn]
        self.norm_inputs = norm_inputs
        self.branch_inputs = branch_inputs or [None] * len(attn)
        self.layers = [layer_params(model, i) for i in range(len(attn))]
        self.final = None
        norm = final_norm(model)
        if norm is not None:
            self.final = (norm, final_input)

    def step(self, index: int, x, choice, biases: bool):
        """One layer on x: ``choice`` is None (skip), a head index, or "all" (the whole layer)."""
        layer = self.layers[index]
        A, z_in = self.attn[index], self.norm_inputs[index]

        def head(h, inp):
            w_v, b_v, w_o = layer.heads[h]
            v = inp @ w_v + (b_v if biases else 0)  # (batch, token, d)
            return (A[:, h] @ v) @ w_o

        def norm(z):
            return _frozen(layer.norm, z, z_in, biases)

        def branch(z):  # Gemma2's norm on the attention output: RMS, no shift
            if layer.branch is None:
                return z
            return _frozen(layer.branch, z, self.branch_inputs[index], biases)

        b_o = layer.b_o if biases else 0
        if layer.where == "post":
            if choice is None:
                return norm(x)
            if choice == "all":
                return norm(x + sum(head(h, x) for h in range(len(layer.heads))) + b_o)
            return norm(head(choice, x))
        if choice is None:
            return x
        inner = norm(x)
        if choice == "all":
            return x + branch(sum(head(h, inner) for h in range(len(layer.heads))) + b_o)
        return branch(head(choice, inner))

    def finish(self, y, biases: bool):
        if self.final is None:
            return y
        norm, final_input = self.final
        return _frozen(norm, y, final_input, biases)

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

    def outputs(self):
        """The frozen network on X_0, layer by layer: [X_0, X_1, ..., X_L]."""
        xs = [self.x0]
        for index in range(len(self.layers)):
            xs.append(self.step(index, xs[-1], "all", biases=True))
        return xs

    def output(self):
        """The frozen network's output (after the final norm, where the family has one)."""
        return self.finish(self.outputs()[-1], biases=True)

    def by_length(self):
        """Sum of the contributions of all paths of each length 0..L (enumerating (H+1)^L paths)."""
        L = len(self.layers)
        n_heads = len(self.layers[0].heads)
        sums = [torch.zeros_like(self.finish(self.x0, False)) for _ in range(L + 1)]
        count = 0
        for path in itertools.product([None, *range(n_heads)], repeat=L):
            sums[sum(c is not None for c in path)] += self.path(path)
            count += 1
        assert count == (n_heads + 1) ** L
        return sums


# --- the reads, from a SAN+skip run of the reference's own ------------------------


def _module(root, path: str):
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _surgery(work) -> None:
    """Replace each layer's forward on the copy by its SAN+skip re-implementation."""
    from tests.reference import layers as layer_reference
    from tests.reference import surgery as gpt2_bert_reference

    kind = work.config.model_type
    if kind in ("bert", "gpt2"):
        gpt2_bert_reference._SURGERY[kind](work, attn_skip=True, mlp=False)
        return
    path, forward = layer_reference.layer_implementation(work)
    for layer in _module(work, path):
        layer.forward = partial(forward, layer, skip=True, mlp=False)


def reference_reads(model, inputs: dict, attn_implementation: str | None = None) -> dict:
    """X_0..X_L of the SAN+skip variant, per layer the attention probabilities and the
    inputs of the norms to freeze, and the model's output, by module surgery on a copy
    with plain torch hooks.

    ``inputs``: the keyword arguments of the model's forward; ``attn_implementation``
    the attention the copy runs (``reference_eager`` where probe keeps the softmax in
    float64).  ``model`` is left as it was.
    """
    from tests.reference.surgery import _strip_overrides

    entry = reference_for(model)
    layers_path, attn_path, index = entry.layers, entry.attention, entry.probs
    norm_path, branch_path = entry.norm_of(model.config), entry.branch
    work = copy.deepcopy(model)
    _strip_overrides(work)
    if attn_implementation is not None:
        work.config._attn_implementation = attn_implementation
    work.eval()
    _surgery(work)
    reads: dict[str, list] = {"xs": [], "attn": [], "norm": [], "branch": []}

    def first_input(store, module, args, kwargs):
        store.append((args[0] if args else kwargs["hidden_states"]).detach())

    layers = list(_module(work, layers_path))
    layers[0].register_forward_pre_hook(
        lambda m, a, k: None if reads["xs"] else first_input(reads["xs"], m, a, k),
        with_kwargs=True,
    )
    for layer in layers:
        layer.register_forward_hook(
            lambda m, a, out: reads["xs"].append(
                (out[0] if isinstance(out, tuple) else out).detach()
            )
        )
        _module(layer, attn_path).register_forward_hook(
            lambda m, a, out: reads["attn"].append(out[index].detach())
        )
        # No norm before the heads (OLMo2): they read the layer's input, the attention's.
        _module(layer, norm_path or attn_path).register_forward_pre_hook(
            partial(first_input, reads["norm"]), with_kwargs=True
        )
        if branch_path is not None:
            _module(layer, branch_path).register_forward_pre_hook(
                partial(first_input, reads["branch"]), with_kwargs=True
            )
    extra = dict(entry.kwargs)
    if entry.decoder:  # a one-shot forward: no key/value cache (Llama's entry: any Llama shape)
        extra["use_cache"] = False
    with torch.no_grad():
        out = work(**inputs, **extra)
    L = len(layers)
    assert len(reads["xs"]) == L + 1 and len(reads["attn"]) == len(reads["norm"]) == L, {
        k: len(v) for k, v in reads.items()
    }
    return {
        "x0": reads["xs"][0],
        "xs": reads["xs"],
        "attn": reads["attn"],
        "norm_inputs": reads["norm"],
        "branch_inputs": reads["branch"] or None,
        "final_input": reads["xs"][-1],
        # The model's own output of X_L: after its final norm, where it has one.
        "output": (out[0] if isinstance(out, tuple) else out.last_hidden_state).detach(),
    }
