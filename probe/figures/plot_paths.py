"""Figures of the path analyses: pure functions from an xarray.Dataset to a matplotlib Figure.

* :func:`count_shares` — share of paths against path length, one line per
  architecture (``paths.count``);
* :func:`sample_ratios` — distance from rank one of attention products along
  sampled paths against depth, a box per depth and init, with the fitted decay
  and a doubly exponential reference (``paths.sample``); by default the
  paper's quantity: the distance to the best rank-one (SVD) fit of the product
  multiplied with the earliest layer on the left;
* :func:`decompose_shares`, :func:`decompose_error` — how the residual stream
  splits over path lengths, and what keeping only short paths costs
  (``paths.decompose``).

Like ``probe.figures.plot`` nothing here does I/O or touches pyplot.
"""

from __future__ import annotations

import warnings

import numpy as np
import seaborn as sns
import xarray as xr
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from probe.figures.plot import log_axis, plain, styled
from probe.measures.stats import eps, fit_text, floor, line, ordered, slope_fit
from probe.names import INITS

_INIT_COLOURS = {"pretrained": to_hex(sns.color_palette("colorblind")[0]), "random": "#d55e00"}
_REFERENCE = "#555555"


def init_colour(init: str) -> str:
    return _INIT_COLOURS.get(init, "#7f7f7f")


#: The longest path length whose axis labels every length.
EVERY_LENGTH = 8


def _shifted_log_axis(ax, longest: int) -> None:
    """x = k + 1 on a log axis, labelled k, so that length 0 is drawn (at 1)."""
    ax.set_xscale("log")  # its own labels below: log_axis's formatters would be replaced
    # Every length while they fit; past EVERY_LENGTH, steps a log axis spaces evenly.
    steps = range(longest + 1) if longest <= EVERY_LENGTH else (0, 1, 2, 3, 5, 10, 20, 30, 50, 100)
    ticks = [k for k in steps if k <= longest]
    ax.xaxis.set_major_locator(FixedLocator([k + 1 for k in ticks]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{round(x - 1):d}"))
    ax.set_xlim(0.9, longest + 1.5)


# --- counting ---------------------------------------------------------------------


def count_shares(ds: xr.Dataset) -> Figure:
    """Share C(L,k) H^k / (H+1)^L against k, one line per distinct (L, H).

    The counts depend on (L, H) alone, so architectures of one shape (a dozen of the
    shipped 12-layer, 12-head configs) share one line, labelled by the first and how
    many more; the report's table lists every name.  The x-axis is logarithmic in
    k + 1 and labelled with k, so the single path of length 0 (all skips) stays on
    the plot.
    """
    shapes: dict[tuple[int, int], list[str]] = {}
    for name in ds.architecture.values:
        one = ds.sel(architecture=name)
        shapes.setdefault((int(one.layers), int(one.heads)), []).append(str(name))
    palette = sns.color_palette("husl", len(shapes))
    with styled():
        fig = Figure(figsize=(8.0, 4.6), layout="constrained")
        ax = fig.subplots()
        for i, ((layers, heads), names) in enumerate(shapes.items()):
            one = ds.sel(architecture=names[0])
            share = one["share"].values
            k = ds.path_length.values[np.isfinite(share)]
            groups = {str(ds.sel(architecture=n)["group"].values) for n in names}
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            ax.plot(
                k + 1,
                share[np.isfinite(share)],
                color=to_hex(palette[i]),
                linestyle="--" if groups == {"today"} else "-",
                linewidth=1.5,
                label=f"{plain(names[0])}{more} (L={layers}, H={heads})",
            )
        _shifted_log_axis(ax, int(ds.path_length.max()))
        ax.set_xlabel("path length k (log axis at k + 1)")
        ax.set_ylabel(r"share of paths $\binom{L}{k} H^k / (H+1)^L$")
        ax.set_ylim(0, None)
        fig.legend(loc="outside right center", fontsize="small")
    return fig


# --- sampling ---------------------------------------------------------------------


def _ratio(ds: xr.Dataset, fit: str, norm: str, order: str) -> xr.DataArray:
    """The ratio of one fit, norm and multiplication order (results written before the
    order coordinate existed hold the latest-left product only)."""
    ratio = ds["ratio"].sel(fit=fit, norm=norm)
    if "order" in ratio.dims:
        # drop: fit_decay's own "order" (the fitted order of the decay) is another quantity.
        return ratio.sel(order=order, drop=True)
    if order != "latest-left":
        raise ValueError(f"this result holds the latest-left product only, not {order!r}")
    return ratio


def fit_decay(
    ds: xr.Dataset, fit: str = "svd", norm: str = "l1inf", order: str = "earliest-left"
) -> xr.Dataset:
    """Per init: the median ratio per depth and two fits of it, each with its quality.

    ``rate``: slope of log10(median) against depth over the depths whose median is above
    the precision floor (exponential decay: a straight line on the log axis), with
    ``rate_points`` and ``rate_stderr`` (NaN from two points).  ``order``: slope of log
    median(d+1) against log median(d) over the pairs whose both ends lie in [the precision
    floor, 0.5], with ``order_pairs``, ``order_stderr`` and ``order_spread``, NaN below the
    quality of :func:`probe.measures.stats.slope_fit`; an order of 3 is the cubic contraction whose
    iterates fall doubly exponentially (the paper's bound), 1 is exponential decay.
    """
    ratio = _ratio(ds, fit, norm, order)
    low = floor(ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median = ratio.median("sample")
    found = {key: [] for key in ("rate", "rate_points", "rate_stderr", "order", "order_pairs",
                                 "order_stderr", "order_spread")}  # fmt: skip
    depth = ds.depth.values.astype(float)
    for init in ds.init.values:
        m = median.sel(init=init).values
        ok = np.isfinite(m) & (m > low)
        rate, stderr = line(depth[ok], np.log10(m[ok])) if ok.sum() >= 2 else (np.nan, np.nan)
        one = slope_fit(m[:-1], m[1:], low)
        for key, value in (("rate", rate), ("rate_points", int(ok.sum())), ("rate_stderr", stderr),
                           ("order", one["slope"]), ("order_pairs", one["pairs"]),
                           ("order_stderr", one["stderr"]), ("order_spread", one["spread"])):  # fmt: skip
            found[key].append(value)
    return xr.Dataset(
        {
            "median": median,
            **{
                key: (
                    "init",
                    np.asarray(values, np.int64 if key.endswith(("points", "pairs")) else float),
                )
                for key, values in found.items()
            },
        },
        attrs={"floor": low},
    )


def fit_texts(fits: xr.Dataset, init: str, dtype: str, missing: str = "–") -> tuple[str, str]:
    """One init's decay rate and order of :func:`fit_decay` for reading, each with its quality
    or why it is missing: ("-0.52 (± 0.013, 5 depths)", "2.91 (2 pairs)")."""
    one = fits.sel(init=init)
    rate, points, stderr = float(one["rate"]), int(one["rate_points"]), float(one["rate_stderr"])
    if not np.isfinite(rate):
        rate_text = f"{missing} ({points} depth{'s' * (points != 1)} above the floor; 2 needed)"
    elif points > 2:
        rate_text = f"{rate:.3g} (± {stderr:.2g}, {points} depths)"
    else:
        rate_text = f"{rate:.3g} ({points} depths)"
    found = {
        "slope": float(one["order"]),
        "pairs": int(one["order_pairs"]),
        "stderr": float(one["order_stderr"]),
        "spread": float(one["order_spread"]),
    }
    return rate_text, fit_text(found, fits.attrs["floor"], dtype, missing=missing)


def sample_ratios(
    ds: xr.Dataset, fit: str = "svd", norm: str = "l1inf", order: str = "earliest-left"
) -> Figure:
    """Box plot of the ratio against depth (log y), one colour per init.

    Beside the boxes: the fitted exponential decay of the median (solid) and the
    doubly exponential reference r(d) = r(1)^(3^(d-1)) from the depth-1 median
    (dotted), the shape of the paper's bound.
    """
    inits = ordered(ds.init.values, INITS)
    fits = fit_decay(ds, fit, norm, order)
    ratio = _ratio(ds, fit, norm, order)
    depth = ds.depth.values
    clip, low = eps(ds), floor(ds)
    width = 0.8 / len(inits)
    with styled():
        fig = Figure(figsize=(max(6.0, 0.45 * len(depth) + 3), 4.4), layout="constrained")
        ax = fig.subplots()
        for i, init in enumerate(inits):
            c = init_colour(init)
            values = ratio.sel(init=init).values  # (depth, sample)
            data = [np.clip(v[np.isfinite(v)], clip, None) for v in values]
            offset = (i - (len(inits) - 1) / 2) * width
            ax.boxplot(
                data,
                positions=depth + offset,
                widths=width * 0.9,
                patch_artist=True,
                manage_ticks=False,
                boxprops={"facecolor": c, "alpha": 0.35, "edgecolor": c},
                medianprops={"color": c},
                whiskerprops={"color": c},
                capprops={"color": c},
                flierprops={"markeredgecolor": c, "markersize": 2},
            )
            m = fits["median"].sel(init=init).values
            rate = float(fits["rate"].sel(init=init))
            if np.isfinite(rate) and np.isfinite(m[0]):
                ok = np.isfinite(m) & (m > low)
                d0 = depth[ok]
                intercept = np.mean(np.log10(m[ok]) - rate * d0)
                ax.plot(
                    depth,
                    np.clip(10 ** (intercept + rate * depth), clip, None),
                    color=c,
                    linewidth=1.2,
                    label=f"{init}: fitted decay, ×10^{rate:.2f} per layer "
                    f"({int(fits['rate_points'].sel(init=init))} depths)",
                )
            if np.isfinite(m[0]) and 0 < m[0] < 1:
                reference = np.clip(m[0] ** (3.0 ** (depth - depth[0])), clip, None)
                ax.plot(
                    depth,
                    reference,
                    color=c,
                    linestyle=":",
                    linewidth=1.2,
                    label=f"{init}: doubly exponential r(1)^(3^(d-1))",
                )
        log_axis(ax)
        ax.set_xticks(depth)
        ax.set_xlabel("depth d (heads along the path)")
        fitted = r"\mathrm{rank1}_{SVD}(P)" if fit == "svd" else r"\mathbf{1}p^T"
        ax.set_ylabel(rf"$\|P - {fitted}\|$ / $\|P\|$ ({norm})")
        ax.set_ylim(clip / 3, 3)
        ax.axhline(clip, color=_REFERENCE, linewidth=0.8, linestyle=":")
        # Below the precision floor the ratio is the dtype's rounding, not a measurement.
        ax.axhspan(clip / 3, low, color=_REFERENCE, alpha=0.12, linewidth=0)
        product = (
            r"$P = A_{l_1} \cdots A_{l_d}$"
            if order == "earliest-left"
            else r"$P = A_{l_d} \cdots A_{l_1}$"
        )
        ax.set_title(
            f"{plain(str(ds.attrs.get('model', '')))}: attention products along paths, {product}"
        )
        fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    return fig


# --- decomposition ----------------------------------------------------------------


def decompose_shares(ds: xr.Dataset, init: str, norm: str = "fro") -> Figure:
    """Norm share of each path length at the last layer, against the uniform count share."""
    one = ds.sel(init=init, norm=norm)
    last = int(ds.layer.max())
    share = one["output_share"].mean("sequence").values
    k = ds.path_length.values
    with styled():
        fig = Figure(figsize=(7.0, 4.2), layout="constrained")
        ax = fig.subplots()
        ax.plot(k + 1, share, marker="o", color=init_colour(init), label="norm share (this model)")
        ax.plot(
            k + 1,
            ds["uniform_share"].sel(layer=last).values,
            marker="s",
            linestyle="--",
            color=_REFERENCE,
            label=r"count share $\binom{L}{k}H^k/(H+1)^L$",
        )
        _shifted_log_axis(ax, int(k.max()))
        log_axis(ax)
        ax.set_xlabel("path length k (log axis at k + 1)")
        ax.set_ylabel(f"share of the output ({norm} norm)")
        ax.set_title(f"{plain(str(ds.attrs.get('model', '')))} ({init}): where the output lives")
        ax.legend(fontsize="small")
    return fig


def decompose_error(ds: xr.Dataset, norm: str = "fro") -> Figure:
    """Relative error of the output with paths up to length k kept, and the task measure."""
    inits = ordered(ds.init.values, INITS)
    k = ds.path_length.values
    task = "loss" if "loss" in ds else "cosine"
    with styled():
        fig = Figure(figsize=(10.0, 4.0), layout="constrained")
        left, right = fig.subplots(1, 2)
        for init in inits:
            c = init_colour(init)
            err = ds["output_error"].sel(init=init, norm=norm)
            mean_err = err.mean("sequence").values
            # Keeping every path leaves no error (0 up to rounding): nothing to draw on a log axis.
            mean_err = np.where(mean_err > 0, mean_err, np.nan)
            left.plot(k, mean_err, marker="o", color=c, label=init)
            measure = ds[task].sel(init=init).mean("sequence").values
            right.plot(k, measure, marker="o", color=c, label=init)
            if task == "loss":
                full = float(ds["loss_full"].sel(init=init).mean("sequence"))
                right.axhline(full, color=c, linestyle=":", linewidth=1)
        log_axis(left)
        left.set_xlabel("paths kept: lengths 0..k")
        left.set_ylabel(f"relative error of the output ({norm})")
        right.set_xlabel("paths kept: lengths 0..k")
        right.set_ylabel(
            "LM loss (nats/token)" if task == "loss" else "cosine to the full mean-pooled output"
        )
        for ax in (left, right):
            ax.set_xticks(k)
            ax.legend(fontsize="small")
    return fig


def decompose_layers(ds: xr.Dataset, norm: str = "fro") -> Figure:
    """Effective path length of the residual stream after each layer, against the count mean."""
    inits = ordered(ds.init.values, INITS)
    layers = ds.layer.values
    with styled():
        fig = Figure(figsize=(7.0, 4.0), layout="constrained")
        ax = fig.subplots()
        for init in inits:
            eff = ds["effective_length"].sel(init=init, norm=norm)
            mean, sd = eff.mean("sequence").values, eff.std("sequence").values
            c = init_colour(init)
            ax.fill_between(layers, mean - sd, mean + sd, color=c, alpha=0.18, linewidth=0)
            ax.plot(layers, mean, marker="o", color=c, label=f"{init}: norm-weighted")
        ax.plot(
            layers,
            ds["uniform_mean_length"].values,
            linestyle="--",
            color=_REFERENCE,
            label="by count: l H / (H+1)",
        )
        ax.set_xticks(layers)
        ax.set_xlabel("layer l")
        ax.set_ylabel("mean path length")
        ax.legend(fontsize="small")
    return fig
