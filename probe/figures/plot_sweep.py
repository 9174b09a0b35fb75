"""Figures of a sweep (:mod:`probe.analyses.sweep`): pure functions of its Dataset.

* :func:`curves` — each summary against one swept value, a line per variant (and init), mean
  over seeds with their range where ``seed`` is swept; log axes where the values span a
  decade or more; checkpoints (``step``, ``revision``) against the training step on a log
  axis (step 0 drawn at the left edge, symlog);
* :func:`phase` — two swept values: a heatmap of one summary per variant, the phase diagram
  (log colour scale for the relative residual).

Swept dimensions past the first two (besides ``seed``) are shown at their first value, and
the figure's title says so.  Like ``probe.figures.plot`` nothing here does I/O or touches pyplot;
``ds.probe.plot()`` of a sweep is :func:`curves` or :func:`phase`, whichever fits.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import xarray as xr
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from probe.figures.plot import colour, log_axis, plain, styled
from probe.measures.stats import ordered
from probe.names import INITS, VARIANTS

#: The summaries drawn, their axis labels, and whether they are per variant.
DRAWN = {
    "final_residual": ("relative residual after the last layer", True),
    "first_below": ("first layer with r < 1e-3", True),
    "order": ("fitted order of collapse", True),
    "mu_rate": ("fitted rate of mu(X) per layer", True),
    "final_effective_rank": ("effective rank after the last layer", True),
    "sink_rate": ("sink rate (attention)", False),
    "max_massive_ratio": ("largest massive ratio", False),
}
#: Summaries drawn on a log axis where their values span a decade or more.
_LOG_WHEN_SPANNING = ("final_residual", "mu_rate", "max_massive_ratio")
#: What a panel says where no point has a value.
_NONE = {
    "first_below": "never reached at any point",
    "mu_rate": "no fit: under 3 layers above the floor",
}
_INIT_STYLES = {"pretrained": "-", "random": ":"}
_STYLES = ("-", "--", ":", "-.")


def swept(ds: xr.Dataset) -> list[str]:
    """The swept dimensions, in the sweep's order."""
    return [d for d in json.loads(ds.attrs.get("sweep_dims", "{}")) if d in ds.dims]


def _kinds(ds: xr.Dataset) -> dict[str, str]:
    return json.loads(ds.attrs.get("sweep_kinds", "{}"))


def _shown(ds: xr.Dataset) -> tuple[xr.Dataset, list[str], str]:
    """The summaries with seeds kept and swept dims past the first two at their first value;
    (data, the dims drawn, a note of what was fixed)."""
    dims = [d for d in swept(ds) if d != "seed"]
    data = ds[[name for name in DRAWN if name in ds]]
    fixed = {d: ds[d].values[0] for d in dims[2:]}
    data = data.isel({d: 0 for d in fixed})
    note = ", ".join(f"{d} = {v}" for d, v in fixed.items())
    return data, dims[:2], (f" (at {note})" if note else "")


def _numeric(values) -> np.ndarray | None:
    try:
        numbers = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        return None
    return numbers if np.isfinite(numbers).all() else None


def _spans_decades(values: np.ndarray) -> bool:
    positive = values[np.isfinite(values) & (values > 0)]
    return positive.size > 1 and positive.max() / positive.min() >= 10


def _x(ds: xr.Dataset, dim: str) -> tuple[np.ndarray, list[str] | None, str]:
    """Positions on the x axis, tick labels where the values are not numbers, the scale."""
    numbers = _numeric(ds[dim].values)
    if numbers is None:
        return np.arange(ds.sizes[dim], dtype=float), [str(v) for v in ds[dim].values], "linear"
    if _kinds(ds).get(dim) == "step":  # training steps: a log axis, step 0 at its left edge
        return numbers, None, "symlog" if (numbers == 0).any() else "log"
    return numbers, None, "log" if (numbers > 0).all() and _spans_decades(numbers) else "linear"


def _mean_range(values: xr.DataArray, dim: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, least and largest over seeds where they are swept (and not the x axis)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if "seed" in values.dims and dim != "seed":
            return (values.mean("seed").values, values.min("seed").values,
                    values.max("seed").values)  # fmt: skip
    v = values.values.astype(float)
    return v, v, v


def _series(ds: xr.Dataset, dims: list[str], inits: list[str]) -> list[tuple[str, dict, str, str]]:
    """The lines of each panel besides the variants: (init, selection, label, line style).
    A second swept value takes the line styles (at the first init); else the inits do."""
    if len(dims) < 2:
        return [(init, {}, init if len(inits) > 1 else "", _INIT_STYLES.get(init, "-"))
                for init in inits]  # fmt: skip
    second = dims[1]
    return [
        (inits[0], {second: k}, f"{second} {value}", _STYLES[k % len(_STYLES)])
        for k, value in enumerate(ds[second].values)
    ]


def curves(ds: xr.Dataset) -> Figure:
    """Each summary against the first swept value (module docstring), a line per variant
    and per value of the second swept value (or per init where there is none)."""
    data, dims, note = _shown(ds)
    dim = dims[0] if dims else "seed"
    x, labels, scale = _x(ds, dim)
    inits = ordered(ds.init.values, INITS)
    variants = ordered(ds.variant.values, VARIANTS)
    series = _series(ds, dims, inits)
    if len(dims) > 1 and len(inits) > 1:
        note += f" ({inits[0]} init)"
    with styled():
        fig = Figure(figsize=(14.0, 6.6), layout="constrained")
        axes = fig.subplots(2, 4).ravel()
        for ax, (name, (label, per_variant)) in zip(axes, DRAWN.items(), strict=False):
            if name not in data:
                ax.set_visible(False)
                continue
            for init, chosen, text, style in series:
                for variant in variants if per_variant else [None]:
                    one = data[name].sel(init=init).isel(chosen)
                    if variant is not None:
                        one = one.sel(variant=variant)
                    if name == "first_below":  # -1: never below; not a layer
                        one = one.where(one >= 0)
                    mean, low, high = _mean_range(one.astype(float), dim)
                    c = colour(variant) if variant else "#333333"
                    words = " · ".join(filter(None, [variant or "transformer", text]))
                    ax.plot(x, mean, marker="o", color=c, linestyle=style, label=words)
                    if "seed" in one.dims and dim != "seed":
                        ax.fill_between(x, low, high, color=c, alpha=0.15, linewidth=0)
            if scale == "log":
                log_axis(ax, "x")
            elif scale == "symlog":
                positive = x[x > 0]
                ax.set_xscale("symlog", linthresh=float(positive.min()) if positive.size else 1.0)
            if labels is not None:
                ax.set_xticks(x, labels)
            values = np.asarray(data[name].values, dtype=float)
            if name in _LOG_WHEN_SPANNING and _spans_decades(values.ravel()):
                log_axis(ax, "y")
            drawn = values[values >= 0] if name == "first_below" else values
            if not np.isfinite(drawn).any():  # say so, rather than an empty panel with ticks
                ax.set_xticks([])
                ax.set_yticks([])
                text = _NONE.get(name, "not measured")
                ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center",
                        color="#666666")  # fmt: skip
            ax.set_xlabel("training step" if _kinds(ds).get(dim) == "step" else dim)
            ax.set_ylabel(label)
        for ax in axes[len(DRAWN) :]:
            ax.set_visible(False)
        # One x range for every panel: a summary with few finite points still reads against
        # the whole sweep.
        for ax in axes[1:]:
            if ax.get_visible() and len(ax.get_xticks()):
                ax.set_xlim(axes[0].get_xlim())
        handles, texts = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, texts, loc="outside lower center", ncol=min(len(texts), 4))
        fig.suptitle(plain(f"{ds.attrs.get('model', '')} · sweep over {dim}{note}"))
    return fig


def phase(ds: xr.Dataset, name: str = "final_residual", init: str | None = None) -> Figure:
    """A heatmap of ``name`` over the first two swept values, one panel per variant (mean
    over seeds where swept): the phase diagram."""
    data, dims, note = _shown(ds)
    if len(dims) < 2:
        raise ValueError("a phase diagram needs two swept values besides the seed")
    init = init or ordered(ds.init.values, INITS)[0]
    values = data[name].sel(init=init)
    if "seed" in values.dims:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            values = values.mean("seed")
    variants = ordered(ds.variant.values, VARIANTS) if "variant" in values.dims else [None]
    finite = np.asarray(values.values, dtype=float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    log = name in ("final_residual", "max_massive_ratio") and finite.size > 1 and _spans_decades(finite)  # fmt: skip
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if log else None
    with styled():
        fig = Figure(figsize=(3.6 * len(variants) + 1.0, 3.6), layout="constrained")
        axes = np.atleast_1d(fig.subplots(1, len(variants), squeeze=False).ravel())
        for ax, variant in zip(axes, variants, strict=True):
            one = values.sel(variant=variant) if variant is not None else values
            grid = np.asarray(one.transpose(dims[0], dims[1]).values, dtype=float)
            image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", norm=norm)
            ax.set_yticks(range(ds.sizes[dims[0]]), [str(v) for v in ds[dims[0]].values])
            ax.set_xticks(range(ds.sizes[dims[1]]), [str(v) for v in ds[dims[1]].values])
            ax.set_ylabel(dims[0])
            ax.set_xlabel(dims[1])
            ax.set_title(variant or "")
            ax.grid(False)
            for (i, j), number in np.ndenumerate(grid):
                if np.isfinite(number):
                    ax.text(j, i, f"{number:.2g}", ha="center", va="center", fontsize=7,
                            color="white")  # fmt: skip
        fig.colorbar(image, ax=list(axes), label=DRAWN.get(name, (name,))[0])
        fig.suptitle(plain(f"{ds.attrs.get('model', '')} · {init} · {name}{note}"))
    return fig


def figure(ds: xr.Dataset) -> Figure:
    """The sweep's main figure: the phase diagram of two swept values, else the curves."""
    return phase(ds) if len(_shown(ds)[1]) >= 2 else curves(ds)
