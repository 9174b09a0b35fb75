"""Independent reference for the LayerNorm variants (LN-affine, no-LN), by module surgery.

Imports neither ``probe`` nor ``nnsight``.  ``norm_variant_hidden_states`` deep-copies
the model, replaces each named norm module inside every layer with a plain module
(``x * gamma + beta`` for "affine", the identity for "removed"), runs the copy's
ordinary forward and records X_0 .. X_L with torch hooks.  The norm modules of each
family are listed here by hand, from the transformers source of each layer.

"Normalisation removed, affine kept": LayerNorm (x - mean)/sigma * w + b becomes
w * x + b; RMSNorm x / rms * w becomes w * x; Gemma's x / rms * (1 + w) becomes
(1 + w) * x.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tests.reference.layers import record_stream

#: family -> (path of the layer list, the norm modules of one layer, how its scale is read)
NORMS = {
    "bert": ("encoder.layer", ("attention.output.LayerNorm", "output.LayerNorm"), "w"),
    "gpt2": ("h", ("ln_1", "ln_2"), "w"),
    "llama": ("layers", ("input_layernorm", "post_attention_layernorm"), "w"),
    "gemma": ("layers", ("input_layernorm", "post_attention_layernorm"), "1+w"),
    "gemma2": (
        "layers",
        (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        "1+w",
    ),
    "opt": ("decoder.layers", ("self_attn_layer_norm", "final_layer_norm"), "w"),
    "olmo2": ("layers", ("post_attention_layernorm", "post_feedforward_layernorm"), "w"),
    "bloom": ("h", ("input_layernorm", "post_attention_layernorm"), "w"),
    # ModernBERT's first layer has an Identity where the others have attn_norm.
    "modernbert": ("layers", ("attn_norm", "mlp_norm"), "w"),
    # Falcon's norms by config: one or two before the branches, or a second after attention.
    "falcon": ("h", ("input_layernorm", "ln_attn", "ln_mlp", "post_attention_layernorm"), "w"),
    # StableLM's per-head q/k LayerNorms are inside the attention: they stay.
    "stablelm": ("layers", ("input_layernorm", "post_attention_layernorm"), "w"),
    "cohere": ("layers", ("input_layernorm",), "w"),
    "granite": ("layers", ("input_layernorm", "post_attention_layernorm"), "w"),
    "distilbert": ("transformer.layer", ("sa_layer_norm", "output_layer_norm"), "w"),
    # T5's RMS norms (no bias), one before each sublayer.
    "t5": ("encoder.block", ("layer.0.layer_norm", "layer.1.layer_norm"), "w"),
}


class _Affine(nn.Module):
    def __init__(self, norm: nn.Module, scale: str) -> None:
        super().__init__()
        w = norm.weight.detach()
        self.gamma = (1.0 + w.to(torch.float64)) if scale == "1+w" else w
        b = getattr(norm, "bias", None)
        self.beta = b.detach() if isinstance(b, torch.Tensor) else None

    def forward(self, x):
        y = x * self.gamma.to(x.dtype)
        return y if self.beta is None else y + self.beta.to(x.dtype)


def _get(root: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(_get(root, parent) if parent else root, name, module)


def norm_variant_hidden_states(
    model: nn.Module, family: str, inputs: dict, mode: str
) -> list[torch.Tensor]:
    """X_0 .. X_L with every layer's norms made ``affine`` or ``removed``; model untouched."""
    work = with_norms(model, family, mode)
    return record_stream(work, _get(work, NORMS[family][0]), inputs)


def with_norms(model: nn.Module, family: str, mode: str) -> nn.Module:
    """A copy of ``model`` with every layer's norms made ``affine`` or ``removed``."""
    layers_path, names, scale = NORMS[family]
    work = copy.deepcopy(model).eval()
    layers = _get(work, layers_path)
    for layer in layers:
        for name in names:
            try:
                norm = _get(layer, name)
            except AttributeError:  # a norm this config's layer does not have
                continue
            if norm is None or isinstance(norm, nn.Identity):
                continue
            _set(layer, name, _Affine(norm, scale) if mode == "affine" else nn.Identity())
    return work
