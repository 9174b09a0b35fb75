"""Sweeps: how rank collapse moves with depth, width, residual scaling, context and training.

A sweep is a driver over the analyses, not a new measurement: every point of its grid
(``probe.analyses.sweep_points``) is one ``probe collapse`` run with that point's
settings, ``collapse.run(model, inputs, ...)`` with the point's config overrides, seed,
tokens, branch scale, revision or checkpoint folder, and its variables are that run's, bit
for bit.  Beside them each point holds ``probe attention``'s Gu et al. sink rate and Sun et
al. massive ratio of the same model on the same inputs
([probe.analyses.attention][probe.analyses.attention]),
and a summary of its collapse curve:

* ``final_residual`` (variant, init): the relative residual after the last layer, residual
  to the token mean in the composite l1,inf norm (the paper's), median over sequences;
* ``first_below`` (variant, init): the first layer whose mean relative residual (same fit
  and norm, mean over sequences, as ``probe collapse``'s reports) is below 1e-3; -1 if none;
* ``order`` (variant, init): the fitted order of collapse, ``probe.measures.stats.fit_order``,
  NaN below the fit's quality; ``order_pairs``, ``order_stderr`` and ``order_spread`` are
  that quality (``probe.measures.stats.slope_fit``), from which ``probe.measures.stats.fit_reason``
  says why an order is missing;
* ``mu_rate`` (variant, init): the exponential rate per layer of Wu et al. (2024)'s
  mu(X) = ||X - 1 gamma_X^T||_F (the collapse result's ``mu``), mean over sequences, fitted
  over the layers whose relative distance is above the precision floor
  (``probe.measures.stats.rate_fit``): mu(X_l) ~ C rate^l.  NaN through fewer than three
  such layers; ``mu_rate_r2``, ``mu_rate_stderr`` and ``mu_rate_layers`` are the fit's
  quality, from which ``probe.measures.stats.rate_text`` says why a rate is missing;
* ``final_effective_rank`` (variant, init): the effective rank after the last layer,
  median over sequences (NaN where the metrics left it out);
* ``sink_rate`` (init) and ``max_massive_ratio`` (init, the largest over layers 1..L), and
  ``massive_ratio`` (init, layer) itself; NaN where not measured (the Fastformer has no
  attention probabilities: its sink rate is NaN, and ``attention=False`` measures neither).

[`gather`][probe.analyses.sweep.gather] stacks the points along the swept dimensions
(coordinates: the swept values as given).  Points of different depth have different
``layer`` sizes: the per-layer variables are NaN beyond a point's last layer; points of
different token counts keep their own ``sequence`` sizes the same way.  Attributes every
point shares are kept; those that differ (its config, what it removed) become variables.

Each finished point is a file of its own in the store (``sweep_points.Store``), shared by
the grids that hold it; under torchrun the ranks take the points round robin (``part``)
and rank 0 gathers them, bit for bit what one process gives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import settings_id, versions
from probe.measures.attention_stats import check_epsilon
from probe.requests import checks
from probe.requests.preflight import check_models
from probe.requests.request import Inputs, Model, coerce
from probe.surgery.scaling import parse_branch_scale

from . import attention as attention_analysis
from . import collapse, sweep_axes, sweep_points
from .sweep_axes import Grid
from .sweep_gather import SUMMARIES, THRESHOLD, gather, summaries
from .sweep_points import FOLDER, Axis, Point, Store, grid

__all__ = [
    "SUMMARIES",
    "THRESHOLD",
    "Grid",
    "Sweep",
    "execute",
    "gather",
    "plan",
    "run",
    "summaries",
]

#: Points a sweep may hold unless told otherwise.
MAX_POINTS = 1000
Progress = Callable[[int, int, str], None]
"""A progress callback: called with (points done, points in all, a label)."""


@dataclass
class Sweep:
    """A checked sweep: the request, its grid, and the collapse options of every point.

    Made by [`sweep.plan`][probe.analyses.sweep.plan] and run by
    [`sweep.execute`][probe.analyses.sweep.execute].

    Parameters
    ----------
    model
        The request's model, with the settings given one value applied.
    inputs
        The request's inputs, likewise.
    axes
        The swept settings, each with its values.
    points
        Every combination of the swept values, in order.
    options
        The collapse options of every point (variants, surgery, metrics, ...).
    attention
        Whether each point also measures sinks and massive activations.
    epsilon
        The sink threshold of that measurement.
    fixed
        The settings every point shares, which identify the sweep's store.
    command
        The "reproduce with" line the result records.
    """

    model: Model
    inputs: Inputs
    axes: tuple[Axis, ...]
    points: list[Point]
    options: dict
    attention: bool
    epsilon: float
    fixed: dict
    command: str | None = None

    @property
    def settings_id(self) -> str:
        """The hash of the whole sweep: its fixed settings and its grid."""
        grid_ = [[a.name, [str(v) for v in a.values]] for a in self.axes]
        return settings_id({**self.fixed, "grid": grid_})

    def store(self, out_dir: str | Path) -> Store:
        """The store of every sweep written to ``out_dir`` (``sweep_points.FOLDER``)."""
        return Store(Path(out_dir) / FOLDER, self.fixed, SUMMARIES)


def plan(
    model: Model | str | Path,
    inputs: Inputs | None = None,
    *,
    variants: str | Sequence[str] = "all",
    surgery: str = "probe",
    metrics: str | Sequence[str] | None = None,
    effective_rank: str = "auto",
    attention: bool = True,
    epsilon: float = 0.3,
    max_points: int = MAX_POINTS,
    command: str | None = None,
    **settings,
) -> Sweep:
    """Check a sweep before any point runs: its grid, every point's request, its size.

    A setting given two values or more is swept, one given one value is fixed; the grid is
    every combination of the swept values.

    Parameters
    ----------
    model
        A [`probe.Model`][probe.requests.request.Model] or a model name or folder (every point loads it
        itself, so not a module).  A checkpoint series (`gpt2-tiny-steps`, or a folder one
        training run wrote) sweeps its checkpoints unless `steps` or `revisions` say otherwise.
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs] with a `text`, or None (each point makes its
        own inputs).
    variants
        As [`collapse.prepare`][probe.analyses.collapse.prepare] takes them.
    surgery
        As [`collapse.prepare`][probe.analyses.collapse.prepare] takes it.
    metrics
        As [`collapse.prepare`][probe.analyses.collapse.prepare] takes them.
    effective_rank
        As [`collapse.prepare`][probe.analyses.collapse.prepare] takes it.
    attention
        Also measure each point's sink rate and massive ratio
        ([`attention.run`][probe.analyses.attention.run]); False: neither.
    epsilon
        The sink threshold of the attention measurement.
    max_points
        The most points the grid may hold.
    command
        The "reproduce with" line the result records; None: a description of the call.
    **settings
        The grid's settings: `config` (`{field: values}` swept at random init, such as
        `{"n_layer": [2, 4, 8]}`), `branch_scale` (numbers or texts in L such as
        `"1/sqrt(L)"`), `revisions` (hub revisions), `steps` ((training step, folder) pairs of
        local checkpoints), `tokens` and `seeds` (numbers or texts like `"0-4"`); the rest are
        the request's keywords beside a model name.

    Returns
    -------
    Sweep
        The checked sweep, for [`execute`][probe.analyses.sweep.execute].

    Raises
    ------
    ProbeError
        A model passed as an object or inputs given as `ids`; nothing to sweep; both
        `revisions` and `steps`; a grid larger than `max_points`; a bad point (named).
    """
    wanted = Grid.take(settings)
    request, given = coerce(model, inputs, settings)
    if not isinstance(request.source, str | os.PathLike):
        raise ProbeError("a sweep loads every point itself: give the model by name or folder")
    if given.ids is not None:
        raise ProbeError("a sweep makes the inputs of each point: give `text`, or none")
    if wanted.steps is None and wanted.revisions is None:
        wanted = replace(wanted, steps=sweep_points.series(str(request.source)))
    axes, fixed_values = wanted.axes()
    if not axes:
        settings_ = [f"`{f.name}`" for f in dataclasses.fields(Grid) if f.name != "steps"]
        raise ProbeError(  # every axis a grid has, named from the grid itself
            f"nothing to sweep: give two values or more to {', '.join(settings_[:-1])} or "
            f"{settings_[-1]}, or several checkpoints with `steps`"
        )
    points = grid(axes)
    max_points = checks.integer("`max_points`", max_points, 1)
    epsilon = check_epsilon(epsilon)
    if len(points) > max_points:
        sizes = " x ".join(f"{len(a.values)} {a.name}" for a in axes)
        raise ProbeError(
            f"the grid holds {len(points)} points ({sizes}), more than `max_points` "
            f"{max_points}; raise it or sweep fewer values"
        )
    options = {"variants": variants, "surgery": surgery, "metrics": metrics,
               "effective_rank": effective_rank}  # fmt: skip
    base = _fixed_request(request, given, fixed_values, options)
    sweep = Sweep(base[0], base[1], tuple(axes), points, {**options, **base[2]}, bool(attention),
                  epsilon, {}, command)  # fmt: skip
    checked = set()  # every point's request and its model are checked before any runs
    for point in points:
        try:
            model, inputs, run_options = point_request(sweep, point)
            scale, mask = run_options.get("branch_scale"), run_options.get("mask")
            key = (repr(model), repr(inputs), repr(scale), mask)
            if key not in checked:
                checked.add(key)
                sized = inputs.with_defaults(**collapse.SIZES)  # the sizes the point runs
                check_models([model], sized, branch_scale=scale, tokenize=True,
                             variants=variants, mask=mask)  # fmt: skip
        except ProbeError as err:
            raise ProbeError(f"point {point.label()}: {err}") from None
    sweep_axes.check(sweep, point_request)
    sweep.fixed = _fixed_settings(sweep)
    return sweep


def _fixed_request(request: Model, given: Inputs, fixed: dict, options: dict):
    """The request with the settings given one value each applied (as in any point)."""
    extra = {}
    for (name, kind), value in fixed.items():
        if kind == "config":
            request = _with_config(request, {name: value})
        elif kind in ("branch_scale", "mask"):
            extra[kind] = value
        elif kind == "revision":
            request = replace(request, revision=value)
        elif kind == "tokens":
            given = replace(given, tokens=value)
        elif kind == "seed":
            request = replace(request, seed=value)
    if "branch_scale" in extra:
        parse_branch_scale(extra["branch_scale"])
    return request, given, extra


def _with_config(request: Model, overrides: dict) -> Model:
    return replace(request, config={**(request.config or {}), **overrides})


def point_request(sweep: Sweep, point: Point) -> tuple[Model, Inputs, dict]:
    """The point's request and collapse options: the sweep's, with the point's values."""
    model, inputs, options = sweep.model, sweep.inputs, dict(sweep.options)
    for axis, value in zip(point.axes, point.values, strict=True):
        if axis.kind == "config":
            model = _with_config(model, {axis.name: value})
        elif axis.kind == "branch_scale":
            parse_branch_scale(value)  # a scale it cannot read fails here, naming the point
            options["branch_scale"] = value
        elif axis.kind == "mask":
            options["mask"] = value
        elif axis.kind == "revision":
            model = replace(model, revision=value)
        elif axis.kind == "step":
            model = replace(model, source=point.folder())
        elif axis.kind == "tokens":
            inputs = replace(inputs, tokens=value)
        elif axis.kind == "seed":
            model = replace(model, seed=value)
    return model, inputs, options


def _fixed_settings(sweep: Sweep) -> dict:
    """What identifies the sweep's points beside their own values: the weights and inputs by
    their bytes (a folder's files, the text, the images), the rest by value."""
    from probe.loading.identity import folder_fingerprint

    model, inputs = sweep.model, sweep.inputs
    identity = {k: v for k, v in vars(model).items() if k not in ("source",)}
    identity = {k: (list(v) if isinstance(v, tuple) else v) for k, v in identity.items()}
    source = str(model.source)
    if Path(source).expanduser().is_dir() and not any(a.kind == "step" for a in sweep.axes):
        source = folder_fingerprint(Path(source).expanduser())
    text = None
    if inputs.text is not None:
        text = hashlib.sha256(Path(inputs.text).read_bytes()).hexdigest()
    device = str(model.device or "cpu").split(":")[0]
    return {
        "analysis": "sweep",
        "model": source,
        **identity,
        "device": device,
        "text": text,
        "images": folder_fingerprint(inputs.images) if inputs.images is not None else None,
        "sequences": inputs.sequences,
        "tokens": inputs.tokens,
        "batch_size": inputs.batch_size,
        "options": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sweep.options.items()},
        "attention": sweep.attention,
        "epsilon": sweep.epsilon,
        **versions(),
    }


# --- running -------------------------------------------------------------------------------


def run_point(sweep: Sweep, point: Point, warn: Callable[[str], None] | None = None) -> xr.Dataset:
    """One point: ``collapse.run`` with its settings, plus its attention and summaries.

    ``probe attention`` runs on the models the collapse run loaded (the same weights a load
    of its own would give, with the point's seed for its inputs): one load per point."""
    model, inputs, options = point_request(sweep, point)
    plan = collapse.prepare(model, inputs, warn=warn, **options)
    ds = collapse.execute(plan)
    inits = list(ds.init.values)
    rate = xr.DataArray(np.full(len(inits), np.nan), coords={"init": inits}, dims="init")
    massive = xr.DataArray(
        np.full((len(inits), ds.sizes["layer"]), np.nan),
        coords={"init": inits, "layer": ds.layer.values},
        dims=("init", "layer"),
    )
    note = "attention not measured (attention=False)"
    if sweep.attention:
        measured = xr.concat(
            [
                attention_analysis.run(
                    Model(probed, init=probed.init, seed=model.seed),
                    inputs,
                    epsilon=sweep.epsilon,
                    branch_scale=options.get("branch_scale", 1),
                    mask=options.get("mask", "model"),
                )
                for probed in plan.models
            ],
            "init",
            data_vars="all",
        )
        rate, massive = measured["sink_rate"], measured["massive_ratio"]
        note = str(measured.attrs.get("attention_note", ""))
    ds = ds.assign(sink_rate=rate, massive_ratio=massive)
    ds = ds.assign(summaries(ds))
    ds.attrs["attention_note"] = note
    return ds


def execute(
    sweep: Sweep,
    store: Store | None = None,
    part: tuple[int, int] = (0, 1),
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[xr.Dataset | None]:
    """Run this process's share of the points; each is a `probe collapse` run.

    Parameters
    ----------
    sweep
        What [`plan`][probe.analyses.sweep.plan] returned.
    store
        Where finished points are kept: those it holds already are read, not run again,
        and each point run here is written to it as it finishes.  None: nothing is kept.
    part
        `(rank, size)`: this process runs every size-th point, from the rank-th.
    progress
        Called after each point with (points done, points of this process, a label
        naming the point); None: silent.
    warn
        Called with one line when a point's text holds fewer sequences than asked (the
        point uses those); None: no warnings.

    Returns
    -------
    list[xarray.Dataset | None]
        Every point's Dataset this process has, in the sweep's order; None for the points
        of other processes.

    Raises
    ------
    ProbeError
        A point that cannot run.
    """
    rank, size = part
    results: list[xr.Dataset | None] = [None] * len(sweep.points)
    mine = list(range(rank, len(sweep.points), size))
    for done, index in enumerate(mine):
        point = sweep.points[index]
        if store is not None:
            ds, kept = store.keep(point, lambda p=point: _timed(sweep, p, warn))
        else:
            ds, kept = _timed(sweep, point, warn), False
        label = f"point {point.label()}" + (" (kept from an earlier run)" if kept else "")
        results[index] = ds
        if progress is not None:
            progress(done + 1, len(mine), label)
    return results


def _timed(sweep: Sweep, point: Point, warn) -> xr.Dataset:
    start = time.perf_counter()
    try:
        ds = run_point(sweep, point, warn)
    except ProbeError as err:  # what only the run finds (an overflow), named by its point
        raise ProbeError(f"point {point.label()}: {err}") from None
    ds.attrs["seconds"] = round(time.perf_counter() - start, 3)
    return ds


def run(model, inputs: Inputs | None = None, *, store: str | Path | None = None,
        progress: Progress | None = None, **options) -> xr.Dataset:  # fmt: skip
    """Plan and run a sweep in this process; the gathered Dataset (module docstring).

    Parameters
    ----------
    model : Model | str | Path
        A [`probe.Model`][probe.requests.request.Model] or a model name or folder.
    inputs
        A [`probe.Inputs`][probe.requests.request.Inputs] with a `text`, or None.
    store
        A folder to keep each finished point in, as `point-<id>.nc`; a sweep run again
        resumes from it.  None: nothing is kept.
    progress
        Called after each point, as in [`execute`][probe.analyses.sweep.execute].
    **options
        [`plan`][probe.analyses.sweep.plan]'s options, the grid's settings among them.

    Returns
    -------
    xarray.Dataset
        The points stacked along the swept dimensions, as
        [`gather`][probe.analyses.sweep.gather] returns them.

    Raises
    ------
    ProbeError
        A sweep or point that cannot run (see [`plan`][probe.analyses.sweep.plan]); a
        `store` that is a file, or a folder that cannot be written.
    """
    if store is not None:  # a folder, or one that can be made: checked before the plan
        store = checks.writable_folder(store, "`store`")
    sweep = plan(model, inputs, **options)
    if store is None:
        return gather(sweep, execute(sweep, progress=progress))
    with Store(store, sweep.fixed, SUMMARIES).using() as kept:
        return gather(sweep, execute(sweep, kept, progress=progress))
