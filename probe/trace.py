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

from .ablate import TRANSFORMER, Ablation
from .errors import ProbeError
from .loading import ProbedModel

Reduce = Callable[[torch.Tensor, torch.Tensor], Any]


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
    """``[reduce(X_l, mask) for l in 0..L]`` for one batch, under ``ablation``."""
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


def check_norm_variant(probed: ProbedModel, ablation: Ablation) -> None:
    """The LayerNorm and removal variants run as walker steps: a family outside the walker
    refuses them."""
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


def hidden_states(
    probed: ProbedModel,
    input_ids: torch.Tensor,
    ablation: Ablation = TRANSFORMER,
    attention_mask: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The residual stream X_0 .. X_L, each (batch, token, hidden), under ``ablation``."""
    return layer_values(probed, input_ids, ablation, capture, attention_mask)
