"""Independent reference for residual branch scaling, by module surgery.

Imports neither ``probe`` nor ``nnsight``.  ``scaled_copy(model, alpha)`` deep-copies the
model and gives, in every layer, the module that produces the attention branch and the
one that produces the MLP branch a class whose output is the module's own times alpha (the
first element of a tuple output; the module keeps its place, name and submodules), so the
layer's own code adds alpha f(x):
y = x + alpha f(x) (Noci et al. 2022).  The modules are listed by hand, from the
transformers source of each layer, as the ``branches`` of each family's entry in
``ENTRIES`` of ``tests/reference/families.py`` (where a new family's go; a Llama-shaped
layer of any model_type gets Llama's, ``self_attn`` and ``mlp``); where a dropout follows
the module (the identity in eval mode) the module before it is scaled, so the sites
differ from the walker's where they can; the layers are found, and
``layer_stream(model, inputs)`` records X_0 .. X_L of a model's own forward, as
``reference/layers.py`` does it (``layer_list``, ``record_stream``).

The ablations (SAN, SAN+MLP, SAN+skip) compose with the scaled modules: the hand-written layers
of ``reference/layers.py`` and ``reference/surgery.py`` call these same submodules.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tests.reference.families import NoReference, entry_for
from tests.reference.layers import layer_list, record_stream


class _Scaled:
    """Mixed into a module's own class: its output times alpha (a tuple's first element).

    The module stays where it is, with its own name, class name and submodules (only its
    class gains this base), so the copy is the same model to anything that reads it.  The
    factor's attribute has a name no transformers module uses (a mixture-of-experts block
    has an ``alpha`` of its own, which a plain ``alpha`` would shadow)."""

    _reference_branch_scale: float = 1.0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] * self._reference_branch_scale, *out[1:])
        return out * self._reference_branch_scale


def _get(root: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _wrap(layer: nn.Module, path: str, alpha: float) -> None:
    module = _get(layer, path)
    cls = type(module)
    module.__class__ = type(cls.__name__, (_Scaled, cls), {"_reference_branch_scale": alpha})


def scaled_copy(model: nn.Module, alpha: float) -> nn.Module:
    """A copy of ``model`` whose layers add alpha times each branch (see the docstring);
    :class:`NoReference` for a family whose entry names no branches."""
    branches = entry_for(model).branches
    if branches is None:
        raise NoReference(
            f"the reference entry of model_type {model.config.model_type!r} names no branches "
            "to scale: add them to its entry in ENTRIES of tests/reference/families.py"
        )
    work = copy.deepcopy(model).eval()
    for layer in layer_list(work):
        for branch in branches:
            _wrap(layer, branch, alpha)
    return work


def layer_stream(model: nn.Module, inputs: dict) -> list[torch.Tensor]:
    """X_0 (the first layer's input) .. X_L (each layer's output) of the model's own forward."""
    return record_stream(model, layer_list(model), inputs)
