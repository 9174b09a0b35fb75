"""Running a model under an ablation and reducing each layer next to the model.

``layer_values(probed, input_ids, ablation, reduce)`` traces the model once per
batch, walks the residual stream X_0 .. X_L through the family adapter, and calls
``reduce(X_l, mask)`` on each layer *inside* the trace: only what ``reduce``
returns (small per-sequence tensors) leaves it.  Memory therefore stays flat in
the corpus length, and the same shape of computation is what nnsight's remote
execution needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from probe.errors import ProbeError
from probe.loading import ProbedModel
from probe.surgery.ablate import TRANSFORMER, Ablation

Reduce = Callable[[torch.Tensor, torch.Tensor], Any]
"""What [`layer_values`][probe.surgery.trace.layer_values] calls on every layer: `reduce(X_l, mask)`,
with X_l the (batch, token, hidden) hidden states and `mask` the bool (batch, token) real
tokens; only what it returns leaves the trace."""


def capture(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The trivial reduction: keep the hidden states themselves."""
    return x


def layer_values(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    ablation: Ablation = TRANSFORMER,
    reduce: Reduce = capture,
    attention_mask: torch.Tensor | None = None,
) -> list[Any]:
    """Run one batch under `ablation` and reduce every layer's hidden states inside the trace.

    The model is traced once; the family adapter walks the residual stream X_0 .. X_L and
    `reduce(X_l, mask)` runs on each layer inside the trace, so only what it returns
    leaves the model and memory stays flat in the corpus length.

    Parameters
    ----------
    probed
        The loaded model.
    input_ids
        (batch, token) integer token ids, or an image model's (batch, channel, height,
        width) float pixels.
    ablation
        Which sublayers the run keeps; default: the unablated transformer.
    reduce
        `reduce(X_l, mask)`, called with the (batch, token, hidden) hidden states of a
        layer and the bool mask of the real tokens; default: keep X_l itself.
    attention_mask
        (batch, token), 1 at real tokens and 0 at padding; None: every token is real.

    Returns
    -------
    list
        `[reduce(X_l, mask) for l in 0..L]`: L + 1 values, the first of the embeddings'
        output.

    Raises
    ------
    ProbeError
        `probed` is not a [`ProbedModel`][probe.loading.ProbedModel]; `input_ids` is not a
        batch this model reads (ids outside its vocabulary, more tokens than its position
        table, pixels of another shape) or `attention_mask` is not of its shape; a
        LayerNorm or removal variant, or branch scaling, asked of a family with its own
        adapter.
    """
    check_batch(probed, input_ids, attention_mask)
    check_norm_variant(probed, ablation)
    device = probed.device
    input_ids = input_ids.to(device)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    real = mask.bool()
    values: list[Any] = []  # outside the trace: nnsight keeps what the body appends
    root = probed.envoy  # where the walker starts (a remote model's base model)
    # The block names only what it needs: a remote request carries what the block refers to.
    adapter = probed.adapter
    with (
        torch.no_grad(),
        probed.tracer_root.trace(
            **adapter.model_inputs(input_ids, mask), **probed.trace_options
        ) as tracer,
    ):
        for x in adapter.stream(root, tracer, ablation):
            values.append(reduce(x, real))
    if len(values) != probed.n_layers + 1:
        raise RuntimeError(f"traced {len(values)} layers, expected {probed.n_layers + 1}")
    return values


def check_batch(probed, input_ids, attention_mask=None) -> None:
    """What a caller passes is a batch this model can read, said in one line before any
    trace (the model would fail inside it with an IndexError or a shape error): token ids
    inside the vocabulary and the position table, or pixels of the config's shape."""
    if not isinstance(probed, ProbedModel):
        raise ProbeError(
            f"`probed` must be a ProbedModel (probe.load or probe.wrap); got "
            f"{type(probed).__name__}"
        )
    if not isinstance(input_ids, torch.Tensor):
        raise ProbeError(f"`input_ids` must be a tensor; got {type(input_ids).__name__}")
    shape = tuple(input_ids.shape)
    if probed.adapter.inputs == "pixels":
        config = probed.config
        want = (config.num_channels, config.image_size, config.image_size)
        if len(shape) != 4 or shape[1:] != want or not input_ids.is_floating_point():
            raise ProbeError(
                f"{probed.name} reads float pixels of shape (batch, {', '.join(map(str, want))}); "
                f"`input_ids` is {str(input_ids.dtype).removeprefix('torch.')} of shape {shape}"
            )
    else:
        if (
            len(shape) != 2
            or 0 in shape
            or input_ids.is_floating_point()
            or (input_ids.dtype in (torch.bool, torch.complex64, torch.complex128))
        ):
            raise ProbeError(
                "`input_ids` must be integer token ids of shape (batch, token); got "
                f"{str(input_ids.dtype).removeprefix('torch.')} of shape {shape}"
            )
        vocab = probed.config.vocab_size
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            raise ProbeError(
                f"`input_ids` must lie in [0, {vocab}) for {probed.name}'s vocabulary; "
                f"got ids from {low} to {high}"
            )
        limit = probed.adapter.max_tokens(probed.config)
        if limit is not None and shape[1] > limit:
            raise ProbeError(
                f"{probed.name} takes at most {limit} tokens per sequence; `input_ids` has "
                f"{shape[1]}"
            )
        if attention_mask is not None and tuple(getattr(attention_mask, "shape", ())) != shape:
            got = tuple(getattr(attention_mask, "shape", ()))
            raise ProbeError(
                f"`attention_mask` must have the shape of `input_ids` {shape}; got {got}"
            )


def check_norm_variant(probed: ProbedModel, ablation: Ablation) -> None:
    """The LayerNorm and removal variants and branch scaling run as walker steps: a family
    outside the walker refuses them."""
    if ablation.norm != "kept" and not hasattr(probed.adapter, "norm_steps"):
        raise ProbeError(
            f"the LayerNorm variants (LN-affine, no-LN) need a family spec; the "
            f"{probed.adapter.family} family has its own adapter: leave them out"
        )
    if ablation.remove and not hasattr(probed.adapter, "sink_step"):  # no-sink, no-massive
        raise ProbeError(
            f"the removal variants (no-sink, no-massive) need a family spec; the "
            f"{probed.adapter.family} family has its own adapter: leave them out"
        )
    if ablation.branch_scale != 1 and not hasattr(probed.adapter, "scale_steps"):
        raise ProbeError(
            f"branch scaling runs as walker steps of a family spec; the "
            f"{probed.adapter.family} family has its own adapter: leave `branch_scale` out"
        )


def hidden_states(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    ablation: Ablation = TRANSFORMER,
    attention_mask: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The residual stream X_0 .. X_L of one batch, under `ablation`.

    Parameters
    ----------
    probed
        The loaded model.
    input_ids
        (batch, token) integer token ids, or an image model's (batch, channel, height,
        width) float pixels.
    ablation
        Which sublayers the run keeps; default: the unablated transformer.
    attention_mask
        (batch, token), 1 at real tokens and 0 at padding; None: every token is real.

    Returns
    -------
    list[Tensor]
        L + 1 tensors of shape (batch, token, hidden), the first the embeddings' output.

    Raises
    ------
    ProbeError
        As [`layer_values`][probe.surgery.trace.layer_values]: a model or batch it cannot run.
    """
    return layer_values(probed, input_ids, ablation, capture, attention_mask)
