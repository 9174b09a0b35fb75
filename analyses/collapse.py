"""Rank collapse along depth (Dong, Cordonnier & Loukas 2021, Section 4 and Fig. 2).

For every variant (SAN, SAN+MLP, SAN+skip, transformer) and init (pretrained,
random), run the model under that ablation and measure, at every layer l = 0..L
and for every sequence, how close the token matrix X_l is to rank one:

    r_l = ||res(X_l)||_{1,inf} / ||X_l||_{1,inf},    res(X) = X - 1 x^T,

with x the token mean (the paper's notebook) or the best rank-one fit, in
several norms, together with effective rank, stable rank and token cosine
similarity.  The paper shows r_l falling doubly exponentially for a pure
attention network and staying away from 0 when skip connections are kept.
The LayerNorm variants (LN-affine, no-LN) and the removal variants (no-sink, no-massive:
``probe.surgery.removals`` finds the sinks and the massive entries in a clean run over the whole
corpus first, attrs ``removed`` and ``removal_note`` say what went) run beside them.

Metrics are computed inside the trace, layer by layer, so only per-sequence
numbers leave the model.  ``metrics=`` chooses which (``DEFAULT_METRICS``:
all four, the effective rank by the method ``effective_rank=`` names, see
``probe.measures.metrics``); the result holds those variables only and states their
method and accuracy in its attributes.  ``run`` returns an xarray.Dataset; see
``probe.files.results`` for saving it.

On CUDA the layer loop never waits for the device: it only keeps a copy of
each layer; once a batch's forwards are queued, a worker thread measures its
layers on a side stream (overlapping the next batch's forwards) and copies the
numbers to pinned host memory.  On a CPU each layer is measured at once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import ENGINE, settings_id, utc_now, versions
from probe.loading import ProbedModel
from probe.measures import bounds, metrics
from probe.measures.metrics import effective_rank_method
from probe.names import EFFECTIVE_RANK_METHODS, METRICS, SURGERIES, stored
from probe.requests.request import (
    Inputs,
    Model,
    checkpoint_of,
    dtype_name,
    provenance,
    record,
)
from probe.surgery import masks, removals
from probe.surgery.ablate import PRESETS, parse_variants
from probe.surgery.masks import Mask
from probe.surgery.scaling import BranchScale, parse_branch_scale
from probe.surgery.trace import check_norm_variant

from . import collapse_measure as measure
from .collapse_extras import (
    find_removals,
    ids_block,
    input_ids,
    metrics_note,
    panel_variables,
    parse_metrics,
    removal_attrs,
    surgery_note,
)
from .collapse_measure import Plan, Progress
from .preamble import begin

#: The sizes a run takes where its inputs give none: the paper's 32 sequences of 128 tokens.
SIZES = {"sequences": 32, "tokens": 128, "batch_size": 16}


def prepare(
    model: Model | str | Path | ProbedModel | torch.nn.Module,
    inputs: Inputs | None = None,
    *,
    variants: str | Sequence[str] = "all",
    surgery: str = "probe",
    metrics: str | Sequence[str] | None = None,
    effective_rank: str = "auto",
    branch_scale: str | float | BranchScale = 1,
    mask: str | Mask = "model",
    warn: Callable[[str], None] | None = None,
    command: str | None = None,
    **flat,
) -> Plan:
    """Check every setting, load the models and make the inputs; no forward pass yet.

    Everything that can be wrong with a request (an unknown model, weights that do not fit, a
    bad text, too many tokens, too little memory) raises here, so a command probing several
    models fails before it computes anything.

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model], or what one holds: a hub id, a local folder,
        `minilm`, an `nn.Module` or a loaded [`ProbedModel`][probe.loading.ProbedModel] (then
        only its own init is run).
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs]; unset sizes default to the paper's 32
        sequences of 128 tokens, in batches of 16.
    variants
        `"all"` (the paper's four: SAN, SAN+MLP, SAN+skip, transformer), a comma list or a
        sequence of variant names, the LayerNorm (`LN-affine`, `no-LN`) and removal
        (`no-sink`, `no-massive`) variants included.
    surgery
        `"probe"` (the uniform definitions) or `"paper"` (the paper's code, family by family):
        see [`Ablation`][probe.surgery.ablate.Ablation].
    metrics
        `"all"`/None, a comma list or a sequence of `relative_residual`, `effective_rank`,
        `stable_rank`, `cosine_similarity` (CLI spellings such as `stable-rank` too); the
        relative residual is always computed.
    effective_rank
        `"auto"`, `"exact"` or `"estimate"` (see
        [`collapse_metrics`][probe.measures.metrics.collapse_metrics]).
    branch_scale
        alpha of y = x + alpha f(x) in every layer (`probe.surgery.scaling`): a number or an expression
        of the depth L such as `"1/sqrt(L)"`; 1 runs the model as it is.
    mask
        The attention mask every layer runs with (`probe.surgery.masks`): `model` (its
        own), `bidirectional`, `causal`, `window:W` or `causal-window:W`.
    warn
        Called with one line when the text or image folder holds fewer sequences than asked
        (the run uses those); None: no warnings.
    command
        The command line the result records as what made it; None: a library call, whose
        request the result records as data, attribute `request` (`probe.reports.reproduce`
        renders its `probe collapse` command), or a model passed as an object, whose result
        records a description of the call.
    **flat
        The request's keywords beside a model name (`init=`, `tokens=`, ...): the same request
        as `Model(name, ...)` and `Inputs(...)`, and not together with them.

    Returns
    -------
    Plan
        The checked run, for [`execute`][probe.analyses.collapse.execute].

    Raises
    ------
    ProbeError
        A request that cannot run: an unknown model, variant, surgery, metric or method;
        weights that cannot be had; inputs the model cannot read, or more tokens than it takes;
        a variant or branch scale its family does not run; too little memory.
    """
    scale = parse_branch_scale(branch_scale)
    names, chosen = _checked_options(variants, surgery, metrics, effective_rank)
    asked = masks.parse_mask(mask)

    def check(models: list[ProbedModel], _) -> int:
        masks.check(models[0], asked)
        return _check_variants(models[0], names, _alpha(scale, models[0]))

    begun = begin(model, inputs, flat, sizes=SIZES, check=check, warn=warn, every_sequence=True)
    request, given, models, encoded = begun.request, begun.given, begun.models, begun.inputs
    first = begun.first
    batch_size = given.batch_size
    settings = _settings(request, models, names, surgery, encoded, batch_size, chosen)
    if not scale.is_one:  # the unscaled model's settings have no branch_scale
        settings["branch_scale"] = scale.text
    if not asked.is_model:  # nor has a run with the model's own mask a mask
        settings["mask"] = asked.text
    if "effective_rank" in chosen:  # what "auto" means at this size and device
        settings["effective_rank"] = effective_rank_method(
            effective_rank, encoded.tokens, first.adapter.hidden_size(first.config), first.device
        )
    recorded = _record(request, given, settings, effective_rank)
    if command is None:
        command = "" if recorded else _python_call(settings)
    # The method as resolved here, not "auto": what the result's attrs state is what runs.
    method = settings.get("effective_rank", "exact")
    return Plan(
        models, names, encoded, surgery, batch_size, command, settings, chosen, method,
        branch_scale=_alpha(scale, first), request=recorded, mask=asked,
    )  # fmt: skip


def _checked_options(variants, surgery, metrics, effective_rank) -> tuple[list, tuple]:
    """The variant and metric names of ``prepare``'s options, each option checked in turn."""
    if not isinstance(variants, str) and not (
        isinstance(variants, Sequence) and all(isinstance(v, str) for v in variants)
    ):
        raise ProbeError(f"`variants` takes all or a list of variant names; got {variants!r}")
    names = (
        parse_variants(variants)
        if isinstance(variants, str)
        else parse_variants(",".join(variants) if variants else "")
    )
    if surgery not in SURGERIES:
        raise ProbeError(f"unknown surgery {surgery!r}; choose {' or '.join(SURGERIES)}")
    chosen = parse_metrics(metrics)
    if effective_rank not in EFFECTIVE_RANK_METHODS:
        raise ProbeError(
            f"unknown effective-rank method {effective_rank!r}; "
            f"choose {', '.join(EFFECTIVE_RANK_METHODS)}"
        )
    return names, chosen


def _alpha(scale: BranchScale, first: ProbedModel) -> float:
    """The branch scale at the model's depth; 1: the model as it is."""
    return 1.0 if scale.is_one else scale.value(first.n_layers)


def _check_variants(first: ProbedModel, names, alpha: float) -> int:
    """Refuse a variant, or the branch scale, that the model's family does not run; the run
    holds no arrays beyond its batches (``preamble.Check``)."""
    for name in names:  # a family without the LayerNorm variants says so before any work
        check_norm_variant(first, PRESETS[name])
        removals.check_removal(first, name)
        if alpha != 1:  # and so does one (or a variant) that takes no branch scaling
            check_norm_variant(first, replace(PRESETS[name], branch_scale=alpha))
    return 0


def _settings(request, models, names, surgery, encoded, batch_size, chosen) -> dict:
    """The run's settings as the result records them, before its branch scale and method."""
    first = models[0]
    identity = checkpoint_of(models)
    return {
        # A local folder by what it holds, not by the path as typed (probe.loading.identity).
        "model": identity.get("checkpoint_path", first.name),
        "init": [m.init for m in models],
        "variants": names,
        "surgery": surgery,
        "seed": first.seed,
        "sequences": encoded.sequences,
        "tokens": encoded.tokens,
        "text": encoded.text_sha256 or encoded.text_source,
        "dtype": dtype_name(first.dtype),
        "device": first.device.type,
        "batch_size": batch_size,
        "allow_missing_weights": request.allow_missing_weights,
        "metrics": list(chosen),
        **{k: v for k, v in identity.items() if k != "checkpoint_path"},
    }


def execute(
    plan: Plan,
    progress: Progress | None = None,
    stream_to: str | Path | None = None,
    part: tuple[int, int] = (0, 1),
) -> xr.Dataset:
    """Run a prepared plan: every variant and init, batch by batch.

    Parameters
    ----------
    plan
        What [`prepare`][probe.analyses.collapse.prepare] returned.
    progress
        Called after each forward pass with (passes done, passes in all, a label naming the
        model, init and variant); None: silent.
    stream_to
        A netCDF path: each batch's results are appended to it as they come (`probe.files.stream`),
        so memory does not grow with the number of sequences, and the returned Dataset reads
        from that file lazily.  None: in memory.
    part
        `(rank, world_size)`: run only this rank's share of the batches
        (`probe.distributed.shard`, a contiguous run of whole batches), with the global
        sequence numbers; the shards of all ranks, concatenated along `sequence` in rank order,
        are the single-process result bit for bit (every batch is the same forward pass).
        `attrs["world_size"]` records the number of parts.

    Returns
    -------
    xarray.Dataset
        The collapse result (module docstring): the metrics asked for over (variant, init,
        layer, sequence), the relative residual also over (fit, norm); `input_ids` (sequence,
        token) for token inputs; the theory panel's variables; attributes that say how it was
        made.
    """
    with masks.applied(plan.models, plan.mask):
        return _execute(plan, progress, stream_to, part)


def _execute(plan: Plan, progress, stream_to, part) -> xr.Dataset:
    from probe.distributed import shard

    rank, world_size = part
    batches = plan.inputs.batches(plan.batch_size)
    find_removals(plan, batches)
    mine = batches[slice(*shard(len(batches), rank, world_size))]
    first = mine[0][0] if mine else min(plan.inputs.sequences, len(batches) * plan.batch_size)
    count = sum(ids.shape[0] for _, ids, _ in mine)
    blocks = measure.blocks(plan, mine, progress, part)
    ran = {start: input_ids(ids, mask) for start, ids, mask in mine}  # None: pixel inputs
    measured = None  # the theory panel's residuals, from the run's first batch
    if stream_to is not None:
        from probe.files.stream import SequenceWriter

        empty = measure.empty(plan, 0) | ids_block(plan, 0)
        skeleton = _dataset(empty, plan, world_size, theory_panel=False)
        with SequenceWriter(stream_to, skeleton, first=first) as writer:
            for start, block, panel in blocks:
                writer.append(block | ({} if ran[start] is None else {"input_ids": ran[start]}))
                measured = panel if start == 0 else measured
            writer.fill(panel_variables(plan, measured))
        return xr.open_dataset(stream_to, engine=ENGINE)
    data = measure.empty(plan, count) | ids_block(plan, count)
    for start, block, panel in blocks:
        measured = panel if start == 0 else measured
        for name, values in block.items():
            data[name][:, :, :, start - first : start - first + values.shape[3]] = values
        if ran[start] is not None:
            data["input_ids"][start - first : start - first + len(ran[start])] = ran[start]
    ds = _dataset(data, plan, world_size, measured)
    return ds.assign_coords(sequence=first + np.arange(count))


def run(
    model: Model | str | Path | ProbedModel | torch.nn.Module,
    inputs: Inputs | None = None,
    *,
    progress: Progress | None = None,
    stream_to: str | Path | None = None,
    **options,
) -> xr.Dataset:
    """Probe `model` on `inputs` and return the collapse Dataset (module docstring).

    [`prepare`][probe.analyses.collapse.prepare], then
    [`execute`][probe.analyses.collapse.execute].

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model], or what one holds: a hub id, a local folder,
        `minilm`, an `nn.Module` or a loaded [`ProbedModel`][probe.loading.ProbedModel] (then
        only its own init is run).
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs]; None: the defaults (32 sequences of 128
        tokens of the sample text).
    progress
        Called after each forward pass, as in [`execute`][probe.analyses.collapse.execute].
    stream_to
        A netCDF path to append each batch's results to, as in
        [`execute`][probe.analyses.collapse.execute].
    **options
        [`prepare`][probe.analyses.collapse.prepare]'s options (`variants`, `surgery`,
        `metrics`, `effective_rank`, `branch_scale`, `warn`, `command`) and the request's
        keywords beside a model name.

    Returns
    -------
    xarray.Dataset
        The collapse result, as [`execute`][probe.analyses.collapse.execute] returns it.

    Raises
    ------
    ProbeError
        A request that cannot run (see [`prepare`][probe.analyses.collapse.prepare]).
    """
    return execute(prepare(model, inputs, **options), progress, stream_to)


def _record(request: Model, given: Inputs, settings: dict, method: str) -> str:
    """The request as the result keeps it (``probe.requests.request.record``): the options not at
    their defaults; "" for a model passed as an object, which no command can name."""
    if not isinstance(request.source, str | os.PathLike):
        return ""
    own = {"variants": ",".join(settings["variants"])}
    if settings["surgery"] != "probe":
        own["surgery"] = settings["surgery"]
    if tuple(settings["metrics"]) != METRICS:
        own["metrics"] = ",".join(settings["metrics"])
    if method != "auto" and "effective_rank" in settings:
        own["effective_rank"] = method
    for name in ("branch_scale", "mask"):
        if name in settings:
            own[name] = settings[name]
    sizes = {"sequences": settings["sequences"], "tokens": settings["tokens"]}
    return record("collapse", request, given, own, dtype=settings["dtype"], **sizes)


def _python_call(settings: dict) -> str:
    """What a result of a model passed as an object records: the call, described."""
    described = ", ".join(f"{k}={v!r}" for k, v in settings.items() if k != "model")
    return f"probe.analyses.collapse.run(<a model passed by the caller>, {described})"


def _dataset(
    data, plan: Plan, world_size: int = 1, measured=None, theory_panel: bool = True
) -> xr.Dataset:
    """The result Dataset; ``theory_panel=False`` leaves the panel's variables NaN (a
    streamed result fills them in once its first batch has run)."""
    models, variants, inputs = plan.models, plan.variants, plan.inputs
    first = models[0]
    dims = ("variant", "init", "layer", "sequence")
    coords = {
        "variant": list(variants),
        "init": [m.init for m in models],
        "layer": np.arange(first.n_layers + 1),
        "sequence": np.arange(data[plan.metrics[0]].shape[3]),
        "fit": list(metrics.FITS),
        "norm": list(metrics.NORMS),
    }
    long_names = {
        "relative_residual": "relative residual ||res(X)|| / ||X||",
        "mu": "mu(X) = ||X - 1 gamma_X^T||_F, gamma_X the token mean: the distance to rank "
        "one of Wu et al. (2024), in the hidden states' units",
        "effective_rank": "effective rank (Roy & Vetterli 2007)",
        "stable_rank": "stable rank sum s_i^2 / s_1^2",
        "cosine_similarity": "mean pairwise cosine similarity of tokens",
    }
    extra = {"relative_residual": ("fit", "norm")}
    ds = xr.Dataset(
        {name: (dims + extra.get(name, ()), data[name]) for name in stored(plan.metrics)},
        coords=coords,
    )
    for name in stored(plan.metrics):
        ds[name].attrs["long_name"] = long_names[name]
    if "input_ids" in data:  # what ran, so a result can be checked without rebuilding it
        ds["input_ids"] = (("sequence", "token"), data["input_ids"])
        ds["input_ids"].attrs["long_name"] = "token ids that ran (-1: padding)"
        ds = ds.assign_coords(token=np.arange(data["input_ids"].shape[1]))
    ds["layer"].attrs["long_name"] = "layer (0 = embeddings' output)"
    adapter, config = first.adapter, first.config
    ds.attrs = {
        "analysis": "collapse",
        **provenance(models, inputs),
        "weights_warning": "; ".join(
            f"{m.init} weights come from an incomplete checkpoint (missing weights allowed): "
            "some tensors are at random init, see 'weights'"
            for m in models
            if m.incomplete
        ),
        # accelerate's placement where `device_map` spread the model ({} when it did not).
        "device_map": json.dumps({k: str(v) for k, v in (first.device_map or {}).items()}),
        **versions(),
        "command": plan.command,
        "request": plan.request,
        "created": utc_now(),
        "surgery": plan.surgery,
        "metrics": ",".join(plan.metrics),
        "metrics_note": metrics_note(plan.metrics, plan.settings.get("effective_rank", "exact")),
        "surgery_note": surgery_note(plan.surgery, adapter),
        "ablation_table": json.dumps(list(adapter.table)),
        "residual_stream": adapter.stream_note,
        **masks.attrs(first, plan.mask, inputs.tokens),
        "spec": adapter.describe(config) if hasattr(adapter, "describe") else "",
        # alpha of y = x + alpha f(x) as given (an expression of L) and at this depth.
        "branch_scale": plan.settings.get("branch_scale", "1"),
        "branch_scale_value": float(plan.branch_scale),
        "settings": json.dumps(plan.settings, sort_keys=True),
        "settings_id": settings_id(plan.settings),
        # Processes the run was split over (torchrun); the numbers do not depend on it.
        "world_size": int(world_size),
        **removal_attrs(plan),
    }
    # The paper's bounds from the model's own weights beside measured residuals
    # (probe.measures.theory: Theorem 2.2, Corollaries 3.1 and 3.2), for the report's panel.
    if theory_panel:
        panel = panel_variables(plan, measured)
    else:
        panel = bounds.empty(coords["init"], coords["layer"])
    ds = ds.assign(panel.data_vars)
    ds.attrs.update(panel.attrs)
    return ds
