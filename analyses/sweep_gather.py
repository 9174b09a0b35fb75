"""Gathering a sweep's points into one Dataset, and the summaries each point carries.

:func:`summaries` reduces one point's collapse result (and its attention statistics) to the
numbers the sweep's figures draw (:data:`SUMMARIES` says what each is); :func:`gather` stacks
the points along the swept dimensions: the points' Datasets are concatenated along a
``point`` dimension (outer join: a point with fewer layers or sequences is NaN beyond them),
the swept values become coordinates along it, and ``point`` is unstacked into them.  Points
not finished are NaN, and ``done`` says which are there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import utc_now, versions
from probe.measures import stats

#: The threshold of ``first_below`` (as ``probe collapse``'s reports).
THRESHOLD = 1e-3
#: The summaries per point, and what each is.
SUMMARIES = {
    "final_residual": "relative residual after the last layer (fit mean, norm l1inf), "
    "median over sequences",
    "first_below": f"first layer whose mean relative residual (fit mean, norm l1inf) is below "
    f"{THRESHOLD:g}; -1 if none",
    "order": "fitted order of collapse (probe.measures.stats.fit_order, fit mean, norm l1inf); NaN "
    "where the fit is below quality (probe.measures.stats.fit_reason says why)",
    "order_pairs": "layer pairs the fitted order used (both ends in [the precision floor, 0.5])",
    "order_stderr": "standard error of the fitted order's slope (NaN with two pairs or fewer)",
    "order_spread": "decades of r(l) the fitted order's pairs span",
    "mu_rate": "fitted exponential rate per layer of mu(X) = ||X - 1 gamma_X^T||_F (Wu et al. "
    "2024), mean over sequences, over the layers above the precision floor "
    "(probe.measures.stats.rate_fit); NaN through fewer than 3 such layers",
    "mu_rate_r2": "R^2 of the rate's fit of log mu(X) against layer (NaN: mu constant)",
    "mu_rate_stderr": "standard error of the log of the fitted rate",
    "mu_rate_layers": "layers the rate's fit used (-1: the point holds no mu)",
    "final_effective_rank": "effective rank after the last layer, median over sequences",
    "sink_rate": "Sink_eps of probe attention (Gu et al. 2025) at the same point",
    "max_massive_ratio": "largest massive ratio of probe attention over layers 1..L "
    "(Sun et al. 2024)",
}


def summaries(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The summary variables of one point's collapse result (module docstring)."""
    residual = ds["relative_residual"].sel(fit="mean", norm="l1inf")
    final = residual.isel(layer=-1).median("sequence")
    mean = stats.stats(ds, "relative_residual", "l1inf", "mean")["mean"]
    below = (mean < THRESHOLD).values
    first = np.where(below.any(axis=-1), mean.layer.values[below.argmax(axis=-1)], -1)
    first_below = xr.DataArray(
        first.astype(np.int64),
        coords={"variant": mean.variant.values, "init": mean.init.values},
        dims=("variant", "init"),
    )
    fitted = stats.order_fit(ds, "l1inf", "mean")
    rate = stats.mu_rate(ds)
    if "effective_rank" in ds:
        rank = ds["effective_rank"].isel(layer=-1).median("sequence")
    else:
        rank = xr.full_like(final, np.nan)
    peak = ds["massive_ratio"].isel(layer=slice(1, None)).max("layer", skipna=True)
    out = {
        "final_residual": final.drop_vars(["fit", "norm", "layer"], errors="ignore"),
        "first_below": first_below,
        "order": fitted["order"].drop_attrs(),
        "order_pairs": fitted["pairs"],
        "order_stderr": fitted["stderr"],
        "order_spread": fitted["spread"],
        "mu_rate": rate["rate"],
        "mu_rate_r2": rate["r2"],
        "mu_rate_stderr": rate["stderr"],
        "mu_rate_layers": rate["layers"],
        "final_effective_rank": rank.drop_vars("layer", errors="ignore"),
        "max_massive_ratio": peak,
    }
    for name, value in out.items():
        out[name] = value.assign_attrs(long_name=SUMMARIES[name])
    return out


def gather(sweep, datasets: Sequence[xr.Dataset | None]) -> xr.Dataset:
    """The points' Datasets stacked along the swept dimensions.

    Per-layer variables of points with fewer layers (or sequences) are NaN beyond their
    last layer (sequence); the coordinates are the swept values as given.

    Parameters
    ----------
    sweep : Sweep
        What [`plan`][probe.analyses.sweep.plan] returned.
    datasets
        Every point's Dataset in the sweep's order, as
        [`execute`][probe.analyses.sweep.execute] returns them; None for a point not
        finished.

    Returns
    -------
    xarray.Dataset
        The sweep result: each point's variables and summaries over the swept dimensions,
        with its `command` and `point_id`.  Points without a Dataset are NaN; `done` says
        which are there, and the attributes `points_done` and `points` count them.

    Raises
    ------
    ProbeError
        No point has finished yet.
    """
    axes = sweep.axes
    present = [(p, ds) for p, ds in zip(sweep.points, datasets, strict=True) if ds is not None]
    if not present:
        raise ProbeError("no point of the sweep has finished yet")
    varying = _varying_attrs([ds for _, ds in present], {a.name for a in axes})
    parts = []
    for _, ds in present:
        ds = ds.assign(
            {name: kind(ds.attrs.get(name, empty)) for name, (kind, empty) in varying.items()}
        )
        ds = ds.assign(
            command=str(ds.attrs.get("command", "")),
            point_id=str(ds.attrs.get("settings_id", "")),
            point_created=str(ds.attrs.get("created", "")),
            seconds=float(ds.attrs.get("seconds", np.nan)),
            n_layers=int(ds.attrs.get("n_layers", -1)),
            # alpha at this point's depth (1: unscaled), as the collapse run recorded it
            branch_scale_value=float(ds.attrs.get("branch_scale_value", 1.0)),
        )
        parts.append(ds.expand_dims(point=[len(parts)]))
    stacked = xr.concat(parts, "point", join="outer", data_vars="all", coords="minimal",
                        compat="override", combine_attrs="drop_conflicts")  # fmt: skip
    for number, axis in enumerate(axes):
        stacked = stacked.assign_coords(
            {axis.name: ("point", [p.values[number] for p, _ in present])}
        )
    names = [a.name for a in axes]
    if len(axes) == 1:
        stacked = stacked.swap_dims(point=names[0]).drop_vars("point")
    else:
        stacked = stacked.set_index(point=names).unstack("point")
    stacked = stacked.reindex({a.name: list(a.values) for a in axes})
    # A point not finished is missing from the stack: reindexing left its id NaN.
    done = np.vectorize(lambda v: isinstance(v, str), otypes=[bool])(stacked["point_id"].values)
    stacked["done"] = (stacked["point_id"].dims, done)
    stacked = stacked.transpose(*names, ...)
    if "input_ids" in stacked:  # points of other lengths or unfinished ones: -1, not NaN
        stacked["input_ids"] = stacked["input_ids"].fillna(-1).astype(np.int64)
    for axis in axes:
        stacked[axis.name].attrs["sweep_kind"] = axis.kind
        if axis.kind == "step":
            stacked = stacked.assign_coords(folder=(axis.name, list(axis.folders)))
    stacked.attrs.update(_attrs(sweep, len(present)))
    return stacked


#: Attributes of a point that gather keeps as variables of their own (or the grid says).
_PER_POINT = {"command", "settings_id", "created", "seconds", "n_layers", "branch_scale_value",
              "sweep_point", "sweep_values"}  # fmt: skip


def _varying_attrs(datasets: Sequence[xr.Dataset], swept: set[str]) -> dict[str, tuple]:
    """The attributes whose values differ between points (what a point's removal variants
    removed, its config, its checkpoint), each kept as a variable along the swept dims
    instead of dropped: name -> (type, value where a point lacks it).  A number stays one
    where every point has a number of one type; anything else is text."""
    names = sorted({k for ds in datasets for k in ds.attrs} - _PER_POINT - swept)
    found = {}
    for name in names:
        values = [ds.attrs.get(name) for ds in datasets]
        if all(_same(v, values[0]) for v in values):
            continue
        kinds = {type(v) for v in values}
        if kinds <= {int, np.int64}:
            found[name] = (int, -1)
        elif kinds <= {float, np.float64}:
            found[name] = (float, np.nan)
        else:
            found[name] = (_text, "")
    return found


def _same(a, b) -> bool:
    return type(a) is type(b) and np.array_equal(np.asarray(a), np.asarray(b))


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(np.asarray(value).tolist())


def _attrs(sweep, done: int) -> dict:
    grid_ = {a.name: [str(v) for v in a.values] for a in sweep.axes}
    return {
        "analysis": "sweep",
        "model": str(sweep.model.name),
        "sweep_dims": json.dumps(grid_),
        "sweep_kinds": json.dumps({a.name: a.kind for a in sweep.axes}),
        "points": len(sweep.points),
        "points_done": done,
        "summaries_note": "; ".join(f"{k}: {v}" for k, v in SUMMARIES.items()),
        "padding_note": "per-layer variables of points with fewer layers (or sequences) "
        "are NaN beyond their last layer (sequence)",
        "sweep_settings": json.dumps(sweep.fixed, sort_keys=True, default=str),
        "settings_id": sweep.settings_id,
        "command": sweep.command or "probe.analyses.sweep.run(...)",
        "created": utc_now(),
        "world_size": 1,
        **versions(),
    }
