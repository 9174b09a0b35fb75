"""Figures for the "collapse" analysis: pure functions from xarray.Dataset to matplotlib Figure.

`collapse` is the paper's figure (Dong, Cordonnier & Loukas 2021, fig. 2): the
relative residual r = ||res(X_l)|| / ||X_l|| against depth, one line per
ablation variant. `collapse_order` reads the *order* of the collapse off the
same numbers: a slope of 1 in log r(l+1) vs log r(l) is plain exponential decay,
a slope of 3 is the cubic per-layer contraction that makes pure attention lose
rank doubly exponentially. `metric` draws the other per-layer metrics,
`comparison` and `across_models` put several models side by side.  The numbers
behind the lines (means over sequences, the fitted order, the summaries the
reports turn into prose) come from ``probe.measures.stats``.

Nothing here does I/O or touches pyplot: figures are built from
matplotlib.figure.Figure (so pyplot's figure manager never holds them) and the
seaborn style is applied through context managers, which restore rcParams.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probe.figures.plot_style import (
    COLOURS,
    LINESTYLES,
    MODEL_COLOURS,
    MODEL_MARKERS,
    REFERENCE_COLOUR,
    STYLE,
    PlainLogFormatter,
    colour,
    log_axis,
    plain,
    styled,
)
from probe.measures.stats import (
    FIT_UPPER,
    eps,
    fit_quality,
    floor,
    has_data,
    order_fit,
    ordered,
    pick_init,
    short,
    stats,
)
from probe.names import PLAIN_METRICS as METRICS
from probe.names import VARIANTS

# The style and colour names live in probe.figures.plot_style; they are importable from here too.
__all__ = [
    "COLOURS",
    "LINESTYLES",
    "METRICS",
    "MODEL_COLOURS",
    "MODEL_MARKERS",
    "REFERENCE_COLOUR",
    "STYLE",
    "PlainLogFormatter",
    "across_models",
    "collapse",
    "collapse_order",
    "colour",
    "comparison",
    "describe_selection",
    "log_axis",
    "metric",
    "metric_label",
    "order_label",
    "plain",
    "styled",
]


_NORM_WORDS = {"l1inf": "1,∞", "fro": "Frobenius", "spectral": "spectral", "l1": "1", "linf": "∞"}
_FIT_WORDS = {"mean": "residual to the token mean", "svd": "residual to the best rank-one fit"}
_METRIC_WORDS = {
    "relative_residual": "relative residual",
    "effective_rank": "effective rank",
    "stable_rank": "stable rank",
    "cosine_similarity": "mean cosine similarity of tokens",
}


def metric_label(name: str, norm: str = "l1inf") -> str:
    """Axis label for a metric; the relative residual names its norm.  Plain text, no
    mathtext: matplotlib builds its mathtext parser on first use, a third of a second."""
    if name != "relative_residual":
        return _METRIC_WORDS.get(name, name.replace("_", " "))
    return f"relative residual ‖res(X)‖ / ‖X‖, {_NORM_WORDS.get(norm, norm)} norm"


def describe_selection(name: str, norm: str, fit: str) -> str:
    """Words for what was selected, e.g. for captions and figure titles."""
    if name != "relative_residual":
        return _METRIC_WORDS.get(name, name)
    return f"{_FIT_WORDS.get(fit, fit)}, {norm} norm"


def _model_title(ds: xr.Dataset) -> str:
    return plain(str(ds.attrs.get("model", "model")))


def _draw_variants(ax: Axes, st: xr.Dataset, log: bool, clip: float) -> None:
    """One mean line plus a one-sd band per variant that has data in `st` (one init)."""
    x = st.layer.values
    for variant in st.variant.values:
        m = st["mean"].sel(variant=variant).values.astype(float)
        if not has_data(m):
            continue
        s = np.nan_to_num(st["std"].sel(variant=variant).values.astype(float))
        lo, hi = m - s, m + s
        if log:
            # Clip at machine epsilon so exact zeros (full collapse) stay visible.
            m, lo, hi = (np.clip(a, clip, None) for a in (m, lo, hi))
        c = colour(str(variant))
        ok = np.isfinite(m)
        ax.fill_between(x, lo, hi, where=ok, color=c, alpha=0.18, linewidth=0, interpolate=False)
        style = LINESTYLES.get(str(variant), "-")
        ax.plot(
            x,
            m,
            color=c,
            linestyle=style,
            marker="o",
            markersize=3.5,
            linewidth=1.8,
            label=str(variant),
        )


def _finish_axes(ax: Axes, st: xr.Dataset, name: str, log: bool, clip: float) -> tuple | None:
    """Labels, x range and scale of one panel; returns the y range it wants, if any."""
    layers = st.layer.values
    ax.set_xlabel("layer")
    ax.set_xlim(layers.min(), max(layers.max(), layers.min() + 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if log:
        log_axis(ax)
    if name != "relative_residual":
        return None
    ys = [np.asarray(line.get_ydata(), float) for line in ax.get_lines()]
    if log:
        # Down to the lowest mean (at most the clip), up past 1 so lines at r ~ 1 show.
        return min([*(np.nanmin(y) for y in ys), 0.1]) / 3, 1.5
    return 0.0, max([1.0, *(np.nanmax(y) for y in ys)])


def _share_limits(axes: Sequence[Axes], wanted: Sequence, datasets: Sequence[xr.Dataset]) -> None:
    """Set the shared y range to the union of what the panels want; mark each panel's
    dataset's floors: machine epsilon (dotted, where lines are clipped) and, shaded below
    it, the precision floor under which a value is the dtype's rounding."""
    wanted = [w for w in wanted if w is not None]
    if not wanted:
        return
    bottom, top = min(w[0] for w in wanted), max(w[1] for w in wanted)
    axes[0].set_ylim(bottom, top)
    if axes[0].get_yscale() != "log":
        return
    for ax, ds in zip(axes, datasets, strict=True):
        if bottom < 100 * eps(ds):
            # Machine epsilon: lines that flatten on it have fully collapsed.
            ax.axhline(eps(ds), color=REFERENCE_COLOUR, linewidth=0.8, linestyle=":", label="_eps")
        if bottom < floor(ds):
            ax.axhspan(bottom, floor(ds), color=REFERENCE_COLOUR, alpha=0.12, linewidth=0)
            ax.annotate(
                f"below the {ds.attrs.get('dtype', 'float64')} floor ({short(floor(ds))})",
                (0.98, floor(ds)),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="top",
                fontsize="x-small",
                color=REFERENCE_COLOUR,
            )


def _figure_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for the whole figure, variants in canonical order."""
    handles: dict[str, object] = {}
    for ax in axes:
        for line in ax.get_lines():
            label = line.get_label()
            if not label.startswith("_"):
                handles.setdefault(label, line)
    labels = ordered(handles, VARIANTS)
    if labels:
        fig.legend(
            [handles[k] for k in labels], labels, loc="outside lower center", ncols=len(labels)
        )


def _panels(
    ds: xr.Dataset, name: str, norm: str, fit: str, log: bool, title: str
) -> tuple[Figure, list[Axes]]:
    st = stats(ds, name, norm, fit)
    inits = list(st.init.values)
    clip = eps(ds)
    with styled():
        fig = Figure(figsize=(1.0 + 4.6 * len(inits), 4.0), layout="constrained")
        axes = list(fig.subplots(1, len(inits), sharey=True, squeeze=False)[0])
        wanted = []
        for ax, init in zip(axes, inits, strict=True):
            one = st.sel(init=init)
            _draw_variants(ax, one, log, clip)
            wanted.append(_finish_axes(ax, one, name, log, clip))
            ax.set_title(f"init: {plain(str(init))}")
        _share_limits(axes, wanted, [ds] * len(axes))
        axes[0].set_ylabel(metric_label(name, norm))
        fig.suptitle(title)
        _figure_legend(fig, axes)
    return fig, axes


def collapse(
    ds: xr.Dataset,
    metric: str = "relative_residual",
    norm: str = "l1inf",
    fit: str = "mean",
    log: bool = False,
) -> Figure:
    """The paper's figure: `metric` against layer, one panel per init, one line per variant.

    Lines are the mean over sequences with a band of one standard deviation.

    Parameters
    ----------
    ds
        A collapse result.
    metric
        `relative_residual`, `effective_rank`, `stable_rank` or `cosine_similarity`.
    norm
        The relative residual's norm: `l1inf` (the paper's), `fro`, `spectral`, `l1`, `linf`.
    fit
        The relative residual's fit: `mean` (the token mean) or `svd` (the best rank-one fit).
    log
        Draw the relative residual on a log axis clipped at the dtype's epsilon, so exact
        zeros stay on the plot; False: on 0..1.

    Returns
    -------
    Figure
        A matplotlib figure, not shown and not held by pyplot.
    """
    where = describe_selection(metric, norm, fit)
    title = f"{_model_title(ds)}: {where}"
    return _panels(ds, metric, norm, fit, log, title)[0]


def metric(ds: xr.Dataset, name: str) -> Figure:
    """Effective rank, stable rank or cosine similarity against layer (layout of `collapse`)."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; expected one of {', '.join(METRICS)}")
    title = f"{_model_title(ds)}: {_METRIC_WORDS[name]}"
    return _panels(ds, name, "l1inf", "mean", False, title)[0]


def order_label(variant: str, found: xr.Dataset) -> str:
    """The legend entry of one variant's fitted order (one init of :func:`order_fit`):
    "SAN: slope 2.83 (± 0.12, 4 pairs)", or "SAN: slope n/a" where it is missing."""
    order = float(found["order"])
    if not np.isfinite(order):
        return f"{variant}: slope n/a"
    quality = fit_quality({"pairs": int(found["pairs"]), "stderr": float(found["stderr"])})
    return f"{variant}: slope {order:.2f} ({quality})"


def collapse_order(ds: xr.Dataset, norm: str = "l1inf", fit: str = "mean") -> Figure:
    """log r(l+1) against log r(l) per variant, with reference slopes 1 and 3.

    Each point is one layer transition of the mean r; the legend carries the
    slope from `fit_order`. Slope 1 (r(l+1) = r(l)) is exponential decay,
    slope 3 (r(l+1) = r(l)^3) the cubic contraction of pure attention.
    """
    st = stats(ds, "relative_residual", norm, fit)
    orders = order_fit(ds, norm, fit)
    clip, fit_low = eps(ds), floor(ds)
    inits = list(st.init.values)
    with styled():
        fig = Figure(figsize=(1.0 + 4.4 * len(inits), 4.8), layout="constrained")
        axes = list(fig.subplots(1, len(inits), squeeze=False)[0])
        for ax, init in zip(axes, inits, strict=True):
            lows = [0.1]
            for variant in st.variant.values:
                lows += _order_path(ax, st, orders, variant, init, (clip, fit_low))
            _order_axes(ax, min(lows) / 3, init)
        fig.suptitle(
            f"{_model_title(ds)}: order of collapse ({describe_selection('relative_residual', norm, fit)})"
        )
    return fig


def _order_path(ax: Axes, st: xr.Dataset, orders, variant, init, floors: tuple) -> list:
    """One variant's (r(l), r(l+1)) pairs on ``ax``; the smallest r of each axis, or none.

    ``floors``: (the clip for the log axes, the lowest r inside the fit window).
    """
    clip, fit_low = floors
    m = st["mean"].sel(variant=variant, init=init).values.astype(float)
    x, y = m[:-1], m[1:]
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return []
    with np.errstate(invalid="ignore"):
        fitted = ok & (np.minimum(x, y) >= fit_low) & (np.maximum(x, y) <= FIT_UPPER)
    x, y = np.clip(x, clip, None), np.clip(y, clip, None)
    lows = [x[ok].min(), y[ok].min()]
    c = colour(str(variant))
    label = order_label(str(variant), orders.sel(variant=variant, init=init))
    # The whole path faintly, hollow markers: pairs outside the fit window.
    ax.plot(
        x[ok],
        y[ok],
        color=c,
        alpha=0.45,
        linewidth=0.9,
        marker="o",
        markersize=4,
        markerfacecolor="none",
        label=label if not fitted.any() else "_path",
    )
    if fitted.any():
        ax.plot(
            x[fitted], y[fitted], color=c, marker="o", markersize=4.5, linewidth=1.6, label=label
        )
    return lows


def _order_axes(ax: Axes, low: float, init) -> None:
    """The reference slopes 1 and 3 from ``low`` up, and the square log axes around them."""
    ref = np.logspace(np.log10(low), 0, 64)
    ax.plot(
        ref,
        ref,
        color=REFERENCE_COLOUR,
        linestyle="--",
        linewidth=0.9,
        label="slope 1 (exponential)",
    )
    ax.plot(
        ref,
        ref**3,
        color=REFERENCE_COLOUR,
        linestyle=":",
        linewidth=1.1,
        label="slope 3 (doubly exponential)",
    )
    log_axis(ax, "x")
    log_axis(ax)
    ax.set_xlim(low, 1.5)
    ax.set_ylim(low, 1.5)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("r at layer l")
    ax.set_ylabel("r at layer l+1")
    ax.set_title(f"init: {plain(str(init))}")
    # Upper left is y > x at small r: empty unless r grows, so the legend hides nothing.
    ax.legend(loc="upper left", fontsize="small")


def comparison(
    datasets: Sequence[xr.Dataset],
    metric: str = "relative_residual",
    log: bool = True,
    init: str | None = None,
    norm: str = "l1inf",
    fit: str = "mean",
) -> Figure:
    """One panel per model on shared axes, one line per variant.

    `init=None` picks "pretrained" where a model has it and its first init
    otherwise; a named init missing from a dataset is an error.
    """
    if not datasets:
        raise ValueError("comparison needs at least one dataset")
    with styled():
        # At most three panels a row, so many models wrap instead of making a strip whose
        # labels a page would shrink past reading.
        cols = min(len(datasets), 3)
        rows = -(-len(datasets) // cols)
        fig = Figure(figsize=(1.0 + 3.8 * cols, 0.5 + 3.5 * rows), layout="constrained")
        grid = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
        axes = list(grid.flat[: len(datasets)])
        for spare in grid.flat[len(datasets) :]:
            spare.set_visible(False)
        wanted = []
        for ax, ds in zip(axes, datasets, strict=True):
            st = stats(ds, metric, norm, fit)
            chosen = pick_init(ds, init)
            one = st.sel(init=chosen)
            # Each model is clipped at its own dtype's floor (float32 and float64 may mix).
            _draw_variants(ax, one, log, eps(ds))
            wanted.append(_finish_axes(ax, one, metric, log, eps(ds)))
            ax.set_title(f"{_model_title(ds)}\ninit: {plain(chosen)}", fontsize="medium")
        _share_limits(axes, wanted, datasets)
        axes[0].set_xlim(0, max(int(ds.layer.max()) for ds in datasets))
        axes[0].set_ylabel(metric_label(metric, norm))
        _figure_legend(fig, axes)
    return fig


def across_models(
    datasets: Sequence[xr.Dataset],
    init: str | None = None,
    norm: str = "l1inf",
    fit: str = "mean",
) -> Figure:
    """One panel per variant, one line per model (mean r over sequences), log axis.

    The view for many models at once (`comparison` gives each model its own panel): encoders
    solid, causal decoders dashed, each model's line clipped at its dtype's floor.

    Parameters
    ----------
    datasets
        Collapse results, one per model.
    init
        The init each model shows; None: `pretrained` where a model has it, its first init
        otherwise.
    norm
        The relative residual's norm.
    fit
        The relative residual's fit (`mean` or `svd`).

    Returns
    -------
    Figure
        A matplotlib figure, not shown and not held by pyplot.

    Raises
    ------
    ValueError
        No dataset, or a named `init` missing from one of them.
    """
    if not datasets:
        raise ValueError("across_models needs at least one dataset")
    present = ordered(dict.fromkeys(v for ds in datasets for v in ds.variant.values), VARIANTS)
    with styled():
        cols = 2 if len(present) == 4 else len(present)  # four variants: a 2 x 2 grid
        rows = -(-len(present) // cols)
        fig = Figure(figsize=(3.0 + 4.2 * cols, 0.6 + 3.4 * rows), layout="constrained")
        axes = list(fig.subplots(rows, cols, sharey=True, squeeze=False).flat)
        lowest = 0.1
        for i, ds in enumerate(datasets):
            st = stats(ds, "relative_residual", norm, fit).sel(init=pick_init(ds, init))
            clip = eps(ds)
            for ax, variant in zip(axes, present, strict=True):
                if variant not in st.variant.values:
                    continue
                m = st["mean"].sel(variant=variant).values.astype(float)
                if not has_data(m):
                    continue
                m = np.clip(m, clip, None)
                lowest = min(lowest, float(np.nanmin(m)))
                ax.plot(
                    st.layer.values,
                    m,
                    color=MODEL_COLOURS[i % len(MODEL_COLOURS)],
                    marker=MODEL_MARKERS[i // len(MODEL_COLOURS) % len(MODEL_MARKERS)],
                    markersize=4,
                    linestyle="--" if ds.attrs.get("causal") else "-",
                    linewidth=1.5,
                    label=str(ds.attrs.get("model", "?")),
                )
        for ax, variant in zip(axes, present, strict=True):
            log_axis(ax)
            ax.set_title(variant)
            ax.set_xlabel("layer")
            ax.set_ylabel(metric_label("relative_residual", norm))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[0].set_ylim(lowest / 3, 1.5)
        handles = {}
        for ax in axes:
            for line in ax.get_lines():
                handles.setdefault(line.get_label(), line)
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside right center",
            title="dashed: causal",
        )
    return fig
