"""Independent reference for residual branch scaling, by module surgery.

Imports neither ``probe`` nor ``nnsight``.  ``scaled_copy(model, alpha)`` deep-copies the
model and replaces, in every layer, the module that produces the attention branch and the
one that produces the MLP branch with a wrapper whose output is the module's output times
alpha (the first element of a tuple output), so the layer's own code adds alpha f(x):
y = x + alpha f(x) (Noci et al. 2022).  The modules are listed here by hand, from the
transformers source of each layer; where a dropout follows the module (the identity in
eval mode) the module before it is wrapped, so the sites differ from the walker's where
they can; the layers are found, and ``layer_stream(model, inputs)`` records X_0 .. X_L of
a model's own forward, as ``reference/layers.py`` does it (``layer_list``,
``record_stream``).

The ablations (SAN, SAN+MLP, SAN+skip) compose with the wrappers: the hand-written layers
of ``reference/layers.py`` and ``reference/surgery.py`` call these same submodules.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tests.reference.layers import layer_list, record_stream

_LLAMA = ("self_attn", "mlp")
_BERT = ("attention.output.dense", "output.dense")  # dropout(dense(x)) before the residual
_SANDWICH = ("post_attention_layernorm", "post_feedforward_layernorm")  # the branch's last norm

#: model_type -> (attention branch module, MLP branch module), in a layer of
#: ``reference/layers.py``'s ``layer_list``.
BRANCHES = {
    "bert": _BERT,
    "roberta": _BERT,
    "electra": _BERT,
    "deberta-v2": _BERT,
    "distilbert": ("attention", "ffn"),
    "gpt2": ("attn", "mlp"),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "mixtral": _LLAMA,
    "starcoder2": _LLAMA,
    "phi3": _LLAMA,  # resid_attn_dropout / resid_mlp_dropout follow: the identity in eval
    "gemma2": _SANDWICH,
    "olmo2": _SANDWICH,
    "opt": ("self_attn", "fc2"),
    "gptj": ("attn", "mlp"),
    "falcon": ("self_attention", "mlp"),
    "gpt_neox": ("post_attention_dropout", "post_mlp_dropout"),
    "bloom": ("self_attention.dense", "mlp.dense_4h_to_h"),
    "modernbert": ("attn", "mlp"),
    "t5": ("layer.0.SelfAttention", "layer.1.DenseReluDense"),
    "vit": ("attention", "mlp"),
}


class _Scaled(nn.Module):
    """``module``'s output times ``alpha`` (a tuple's first element)."""

    def __init__(self, module: nn.Module, alpha: float) -> None:
        super().__init__()
        self.module, self.alpha = module, alpha

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] * self.alpha, *out[1:])
        return out * self.alpha


def _get(root: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _wrap(layer: nn.Module, path: str, alpha: float) -> None:
    parent, _, name = path.rpartition(".")
    owner = _get(layer, parent) if parent else layer
    setattr(owner, name, _Scaled(getattr(owner, name), alpha))


def scaled_copy(model: nn.Module, alpha: float) -> nn.Module:
    """A copy of ``model`` whose layers add alpha times each branch (see the docstring)."""
    work = copy.deepcopy(model).eval()
    for layer in layer_list(work):
        for branch in BRANCHES[model.config.model_type]:
            _wrap(layer, branch, alpha)
    return work


def layer_stream(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """X_0 (the first layer's input) .. X_L (each layer's output) of the model's own forward."""
    return record_stream(model, layer_list(model), inputs)
