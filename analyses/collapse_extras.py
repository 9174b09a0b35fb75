"""What a collapse result holds beside its metrics, and the run's steps that make it.

The token ids that ran (``input_ids``, -1 at padding; none for pixels); what the removal
variants (no-sink, no-massive) remove, found by a clean run over the whole corpus first
(``probe.surgery.removals``), and the attrs that say so; the theory panel's variables (the paper's
bounds from the model's own weights, ``probe.measures.theory``); the note on the surgery;
and the metrics a run asks for, with the note on their method and accuracy.
``probe.analyses.collapse`` assembles the result from them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.measures import bounds, metrics, theory
from probe.models.attention import learned_sinks
from probe.names import METRICS
from probe.surgery import masks, removals
from probe.surgery.ablate import PRESETS

from . import path_checks
from .collapse_measure import DEFAULT_METRICS, Plan

#: Why a run with scaled residual branches has no theory panel.
SCALED_PANEL = (
    "no theory panel with the residual branches scaled by {alpha}: the paper's bounds are "
    "of the unscaled layers"
)


def input_ids(ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray | None:
    """A batch's token ids as they ran, (sequence, token), -1 at padding; None for pixels."""
    if ids.dim() != 2:
        return None
    return np.where(mask.bool().cpu().numpy(), ids.cpu().numpy(), -1).astype(np.int64)


def ids_block(plan: Plan, sequences: int) -> dict[str, np.ndarray]:
    """The ``input_ids`` array of ``sequences`` sequences, or nothing for pixel inputs."""
    if plan.models[0].adapter.inputs != "ids":
        return {}
    return {"input_ids": np.full((sequences, plan.inputs.tokens), -1, dtype=np.int64)}


def find_removals(plan: Plan, batches) -> None:
    """no-sink and no-massive: a clean run of every model over the whole corpus (every
    batch, whatever this process' share) finds what they remove (:mod:`probe.surgery.removals`)."""
    wanted = [name for name in plan.variants if PRESETS[name].remove]
    if not wanted or plan.removals:
        return
    clean = plan.ablation("transformer")  # with the run's branch scale
    for j, probed in enumerate(plan.models):
        run_mask = masks.effective(probed, plan.mask)  # what the clean run attends under
        found = removals.find(
            probed, batches, "no-sink" in wanted, "no-massive" in wanted, clean=clean,
            run_mask=run_mask,
        )  # fmt: skip
        for name in wanted:
            removed = removals.ablation(name, found, plan.surgery)
            if plan.branch_scale != 1:
                removed = replace(removed, branch_scale=plan.branch_scale)
            plan.removals[(name, j)] = removed


def removal_attrs(plan: Plan) -> dict:
    """What the removal variants removed, per variant and init, and one line for each."""
    if not plan.removals:
        return {}
    removed, lines = {}, []
    for (name, j), ablation in plan.removals.items():
        init = plan.models[j].init
        found = removals.Found(ablation.sinks, ablation.massive)
        entries = ablation.sinks if ablation.remove == "sinks" else ablation.massive
        removed.setdefault(name, {})[init] = [list(e) for e in entries]
        learned = learned_sinks(plan.models[j].model)
        lines.append(removals.note(name, found, init, learned))
    return {
        # no-sink: [layer, head, key]; no-massive: [layer, token, dim, corpus mean]
        "removed": json.dumps(removed),
        "removal_note": "; ".join(lines),
        "sink_epsilon": removals.EPSILON,
        "massive_ratio_threshold": removals.MASSIVE_RATIO,
    }


def panel_variables(plan: Plan, measured: list[dict[str, np.ndarray]] | None) -> xr.Dataset:
    """The theory panel (result variables), from the residuals the run's first batch measured
    (``measured``) where it holds them, else from traces of its own (a shard of a torchrun
    run without the first batch, or a run without SAN, SAN+MLP or SAN+skip)."""
    if plan.branch_scale != 1:  # the bounds know nothing of alpha: none is drawn
        missing = [SCALED_PANEL.format(alpha=plan.settings.get("branch_scale"))]
        layers = np.arange(plan.models[0].n_layers + 1)
        return bounds.variables([{"init": m.init, "missing": missing} for m in plan.models], layers)
    return theory.panels(
        plan.models,
        plan.inputs,
        plan.batch_size,
        measured=measured,
        unread=lambda probed: path_checks.problem(probed, "heads"),
    )


def surgery_note(surgery: str, adapter) -> str:
    """What the run's surgery does to the layers, in words (the ``surgery_note`` attr)."""
    if surgery == "probe":
        return "probe's definitions: no skip drops the identity term of the attention residual sum; no MLP makes the layer output its attention sublayer's output"
    return f"the paper's surgery as its code applied it: {adapter.paper_surgery}"


def parse_metrics(metrics: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"all"``/None, a comma list or a sequence of names -> names in the order of METRICS.

    CLI spellings (``stable-rank``) and library ones (``stable_rank``) are both accepted.  The
    relative residual is always computed: it is the paper's measure, the report is built on it,
    and it needs no spectrum."""
    if metrics is None:
        return DEFAULT_METRICS
    if not isinstance(metrics, str | Sequence):
        raise ProbeError(f"`metrics` takes all or a comma list; got {type(metrics).__name__}")
    given = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    names = [str(name).strip().replace("-", "_") for name in given if str(name).strip()]
    if names == ["all"]:
        return METRICS
    unknown = [name.replace("_", "-") for name in names if name not in METRICS]
    if unknown or not names:
        choices = ", ".join(name.replace("_", "-") for name in METRICS)
        what = f"unknown metric {', '.join(unknown)}" if unknown else "no metric given"
        raise ProbeError(f"{what}; `metrics` takes all or a comma list of {choices}")
    return tuple(name for name in METRICS if name in names or name == "relative_residual")


def metrics_note(names: Sequence[str], method: str) -> str:
    """One sentence per computed metric: how it is computed and how accurate it is."""
    notes = {
        "relative_residual": "relative residual (both fits, every norm): exact, relative error "
        "<= 1e-10 against the float64 SVD (absolute <= 1e-14 below 1e-6)",
        "stable_rank": "stable rank: exact, relative error <= 1e-8",
        "cosine_similarity": "cosine similarity: exact, absolute error <= 1e-13",
        "effective_rank": (
            "effective rank: exact from the full spectrum, relative error <= 1e-8"
            if method == "exact"
            else "effective rank: estimated by stochastic Lanczos quadrature "
            f"({metrics.PROBES} probes x {metrics.QUADRATURE_STEPS} steps, top of the "
            "spectrum deflated), relative error within 2% per sequence, typically 0.1-0.5%"
        ),
    }
    return "; ".join(notes[name] for name in METRICS if name in names)
