"""Independent reference for residual branch scaling, by module surgery.

Imports neither ``probe`` nor ``nnsight``.  ``scaled_copy(model, alpha)`` deep-copies the
model and replaces, in every layer, the module that produces the attention branch and the
one that produces the MLP branch with a wrapper whose output is the module's output times
alpha (the first element of a tuple output), so the layer's own code adds alpha f(x):
y = x + alpha f(x) (Noci et al. 2022).  The modules are listed here by hand, from the
transformers source of each layer; where a dropout follows the module (the identity in
eval mode) the module before it is wrapped, so the sites differ from the walker's where
they can.  ``layer_stream(model, inputs)`` runs a model's own forward and records
X_0 .. X_L with plain torch hooks on its layers.

The ablations (SAN, SAN+MLP, SAN+skip) compose with the wrappers: the hand-written layers
of ``reference/layers.py`` and ``reference/surgery.py`` call these same submodules.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

_LLAMA = ("layers", "self_attn", "mlp")

#: model_type -> (path of the layer list, attention branch module, MLP branch module).
BRANCHES = {
    "bert": ("encoder.layer", "attention.output.dense", "output.dense"),
    "roberta": ("encoder.layer", "attention.output.dense", "output.dense"),
    "electra": ("encoder.layer", "attention.output.dense", "output.dense"),
    "deberta-v2": ("encoder.layer", "attention.output.dense", "output.dense"),
    "distilbert": ("transformer.layer", "attention", "ffn"),
    "gpt2": ("h", "attn", "mlp"),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "mixtral": _LLAMA,
    "starcoder2": _LLAMA,
    "phi3": _LLAMA,  # resid_attn_dropout / resid_mlp_dropout follow: the identity in eval
    "gemma2": ("layers", "post_attention_layernorm", "post_feedforward_layernorm"),
    "olmo2": ("layers", "post_attention_layernorm", "post_feedforward_layernorm"),
    "opt": ("decoder.layers", "self_attn", "fc2"),
    "gptj": ("h", "attn", "mlp"),
    "falcon": ("h", "self_attention", "mlp"),
    "gpt_neox": ("layers", "post_attention_dropout", "post_mlp_dropout"),
    "bloom": ("h", "self_attention.dense", "mlp.dense_4h_to_h"),
    "modernbert": ("layers", "attn", "mlp"),
    "t5": ("encoder.block", "layer.0.SelfAttention", "layer.1.DenseReluDense"),
    "vit": ("layers", "attention", "mlp"),
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


def layers_of(model: nn.Module) -> nn.ModuleList:
    return _get(model, BRANCHES[model.config.model_type][0])


def scaled_copy(model: nn.Module, alpha: float) -> nn.Module:
    """A copy of ``model`` whose layers add alpha times each branch (see the docstring)."""
    _, attention, mlp = BRANCHES[model.config.model_type]
    work = copy.deepcopy(model).eval()
    for layer in layers_of(work):
        _wrap(layer, attention, alpha)
        _wrap(layer, mlp, alpha)
    return work


def layer_stream(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """X_0 (the first layer's input) .. X_L (each layer's output) of the model's own forward."""
    layers = layers_of(model)
    states: list[torch.Tensor] = []

    def record_input(module, args, kwargs):
        if not states:
            states.append(args[0] if args else kwargs["hidden_states"])

    def record_output(module, args, output):
        states.append(output[0] if isinstance(output, tuple) else output)

    handles = [layers[0].register_forward_pre_hook(record_input, with_kwargs=True)]
    handles += [layer.register_forward_hook(record_output) for layer in layers]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    if len(states) != len(layers) + 1:
        raise RuntimeError(f"collected {len(states)} hidden states, expected {len(layers) + 1}")
    return [s.detach() for s in states]
