"""Figures of a "toy" Dataset: accuracy against path length, circle trajectories, losses.

Pure functions Dataset -> matplotlib Figure (no pyplot state), drawn from the
numbers in the Dataset only.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from probe.figures.plot import colour, log_axis

_STYLES = ("-", "--", ":", "-.")  # one per hidden size of the circle

_BASELINES = {
    "full_accuracy": ("full model", "#222222", "-"),
    "baseline_position": ("per-position majority", "#7f7f7f", "--"),
    "baseline_majority": ("majority label", "#aaaaaa", ":"),
}


def path_accuracy(ds: xr.Dataset) -> Figure:
    """Mean ± std over repeats of the accuracy of n random paths of each length."""
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    mean, std = ds.accuracy.mean("repeat"), ds.accuracy.std("repeat")
    k = ds.path_length.values
    ax.errorbar(k, mean, yerr=std, marker="o", capsize=3, color=colour("SAN+skip"),
                label=f"{ds.attrs.get('n_paths', '?')} random paths of each length")  # fmt: skip
    for name, (label, col, style) in _BASELINES.items():
        if name in ds:
            value = float(ds[name])
            ax.axhline(value, color=col, linestyle=style, label=f"{label} ({value:.3f})")
    ax.set_xlabel("path length")
    ax.set_ylabel("accuracy")
    ax.set_xticks(k)
    ax.set_ylim(0, 1.02)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def training_loss(ds: xr.Dataset) -> Figure:
    fig = Figure(figsize=(6.4, 3.2))
    ax = fig.add_subplot()
    loss = ds.train_loss
    if "variant" in loss.dims:
        for i, h in enumerate(loss.hidden.values):
            for v in loss.variant.values:
                ax.plot(loss.epoch, loss.sel(hidden=h, variant=v), color=colour(str(v)),
                        linestyle=_STYLES[i % len(_STYLES)], label=f"{v}, hidden {int(h)}")  # fmt: skip
        ax.legend(fontsize="small")
    else:
        ax.plot(loss.epoch, loss, marker=".", color=colour("transformer"))
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss")
    log_axis(ax)
    ax.grid(alpha=0.3)
    return fig


def trajectories(ds: xr.Dataset) -> Figure:
    """One row per hidden size, one panel per variant: the circle and the two points' paths."""
    variants, sizes = list(ds.variant.values), list(ds.hidden.values)
    fig = Figure(figsize=(3.3 * len(variants), 3.5 * len(sizes)), layout="constrained")
    grid = fig.subplots(len(sizes), len(variants), sharex=True, sharey=True, squeeze=False)
    circle = ds.circle.values
    lim = 1.8 * float(np.abs(circle).max())
    for row, h in zip(grid, sizes, strict=True):
        for ax, v in zip(row, variants, strict=True):
            ax.plot(circle[:, 0], circle[:, 1], color="#dddddd", linewidth=3, zorder=0)
            for token, col in zip(ds.token.values, ("#0072b2", "#d55e00"), strict=True):
                xy = ds.trajectory.sel(hidden=h, variant=v, token=token).values  # (step, coord)
                ax.plot(xy[:, 0], xy[:, 1], color=col, linewidth=0.8, marker=".",
                        markersize=2, label=f"point {token}")  # fmt: skip
                ax.plot(*xy[0], marker="o", color=col, markersize=6, markeredgecolor="black")
                ax.plot(*xy[-1], marker="X", color=col, markersize=7, markeredgecolor="black")
            ax.set_title(f"{v}, hidden {int(h)}")
            ax.set_aspect("equal")
            ax.set_xlim(-lim, lim)
            ax.set_ylim(-lim, lim)
        row[0].set_ylabel("y")
    for ax in grid[-1]:
        ax.set_xlabel("x")
    grid[0][0].legend(fontsize="small", loc="lower left")
    return fig


def circle_residual(ds: xr.Dataset) -> Figure:
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    # The networks run in float32: below its epsilon the two points differ by rounding only.
    floor = float(np.finfo(np.float32).eps)
    for i, h in enumerate(ds.hidden.values):
        for v in ds.variant.values:
            r = ds.relative_residual.sel(hidden=h, variant=v).values
            ax.plot(ds.step, np.clip(r, floor, None), label=f"{v}, hidden {int(h)}",
                    color=colour(str(v)), linestyle=_STYLES[i % len(_STYLES)])  # fmt: skip
    log_axis(ax)
    ax.set_xlabel("recurrent step")
    ax.set_ylabel("relative residual of the 2 points")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig
