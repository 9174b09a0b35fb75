"""The collapse report's theory panel: the paper's bounds beside the measured residual.

The numbers are the result's theory variables (``probe.measures.bounds``: ``bound``, ``beta``,
``lambda_mlp``, ..., computed by ``probe.measures.theory.panels`` from the model's own weights when
the run was made; a result written before them has them converted from its old ``theory``
attribute); this module only draws them: one axis per init, the measured
||res(X_l)||_{1,inf} of SAN, SAN+MLP and SAN+skip (median over the panel's sequences) as
solid lines, the bound of Theorem 2.2 and of Corollary 3.2 dashed in the colour of the
variant each bounds, on a log axis.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probe.figures.plot import colour, log_axis, styled
from probe.measures.bounds import MISSING, NOTES, from_attribute, lines

from .figures import Figures, numbers
from .page import esc

CAVEATS = (
    "γ, the paper's term that depends on the attention entries, is taken as 1. "
    "The theorems cover neither norms (Section 3.3: LayerNorm rescales each token; a "
    "post-LN SAN's measured residual can exceed the bound), nor biases. Corollary 3.1 "
    "(skip connections) gives no upper bound: the residual need not fall at all, so "
    "SAN+skip is drawn measured only. A bound is vacuous at a layer where it is not "
    "below the input's own residual ‖res(X_0)‖."
)
#: How far the theory panel's y axis reaches past the measured values: a decade.
RANGE_MARGIN = 10.0
#: The per-layer constants of the table, in its column order.
_CONSTANTS = ("qk_norm", "vo_norm", "beta", "contraction", "lambda_mlp")


def _figure(ds: xr.Dataset, inits: list[str]) -> Figure:
    with styled():
        fig = Figure(figsize=(5.2 * len(inits), 3.6), layout="constrained")
        axes = fig.subplots(1, len(inits), squeeze=False)[0]
        layers = ds["layer"].values
        for ax, init in zip(axes, inits, strict=True):
            one = ds.sel(init=init)
            measured = one["panel_residual"].values
            for name in ds["panel_variant"].values:
                values = one["panel_residual"].sel(panel_variant=name).values
                ax.plot(layers, values, color=colour(name), label=f"{name}, measured")
            for name, label in _bounded(one):
                bound = one["bound"].sel(panel_variant=name).values
                ax.plot(layers, bound, color=colour(name), linestyle="--", label=f"{label} bound")
            log_axis(ax)
            ax.set_ylim(*_measured_range(measured))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("layer")
            ax.set_ylabel("‖res(X)‖₁,∞")
            ax.set_title(f"init: {init}")
            ax.legend(fontsize=7)
    return fig


def _measured_range(measured) -> tuple[float, float]:
    """The y range of a theory panel: the measured residuals' positive values and a decade
    past them either way, so a bound tens of decades up leaves the axis rather than flatten
    what was measured."""
    values = measured[np.isfinite(measured) & (measured > 0)]
    if not values.size:
        return 1e-1, 1e1
    return float(values.min()) / RANGE_MARGIN, float(values.max()) * RANGE_MARGIN


def _bounded(one: xr.Dataset) -> list[tuple[str, str]]:
    """(variant, "Theorem 2.2 (SAN)"-style label) of each variant a theorem bounds, for one
    init (a bound is NaN throughout where none does)."""
    return [
        (str(variant), f"{theorem} ({variant})")
        for variant, theorem in zip(one["panel_variant"].values, one["theorem"].values, strict=True)
        if bool(one["bound"].sel(panel_variant=variant).notnull().any())
    ]


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "—" if math.isnan(value) else "∞"
    return f"{value:.3g}"


def _table(one: xr.Dataset) -> str:
    """Constants and ratios per layer of one init."""
    bounded = _bounded(one)
    head = ["layer", "max‖W_QK‖₁", "max‖W_VO‖₁,∞", "β", "4βH/√d", "λ"]
    for _, label in bounded:
        head += [f"{label}: bound", "measured/bound", "vacuous"]
    rows = []
    for layer in one["layer"].values:
        cells = [str(layer)]
        at = one.sel(layer=layer)
        if layer == 0:
            cells += ["—"] * 5
        else:
            cells += [_fmt(float(at[name])) for name in _CONSTANTS]
        for variant, _ in bounded:
            bound = at.sel(panel_variant=variant)
            # Layer 0 is the input itself (bound = measured): vacuity is a question from 1 on.
            vacuous = None if layer == 0 else bool(bound["bound_vacuous"])
            cells += [_fmt(float(bound["bound"])), _fmt(float(bound["bound_ratio"])), _fmt(vacuous)]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
    return (
        f'<div class="table-scroll"><table class="theory"><thead>{header}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def theory_section(ds: xr.Dataset, figure: Figures) -> str:
    """The report's "Theory beside measurement" section (one line where there is nothing)."""
    ds = from_attribute(ds)  # a result written before the variables: its JSON attribute
    head = '<section id="theory"><h2>Theory beside measurement</h2>'
    if "beta" not in ds.data_vars:
        return (
            head + "<p>This result was made before probe recorded the paper's bounds; "
            "run <code>probe collapse</code> again for the theory panel.</p></section>"
        )
    missing = sorted(set(lines(ds, MISSING)))
    notes = sorted(set(lines(ds, NOTES)))
    parts = [head]
    parts += [f'<p class="note">{esc(line[0].upper() + line[1:])}.</p>' for line in missing]
    # An init has constants (and so a panel) where the family gives them: heads is NaN else.
    drawn = [str(init) for init in ds["init"].values if bool(ds["heads"].sel(init=init).notnull())]
    if drawn:
        parts.append(
            figure(
                _figure(ds, drawn),
                "The paper's upper bounds from this model's weights (dashed; Theorem 2.2 for "
                "SAN, Corollary 3.2 for SAN+MLP), run layer by layer from the measured "
                "‖res(X_0)‖, beside the measured ‖res(X_l)‖₁,∞ (solid; token-mean fit, "
                "median over the first sequences).  The y axis spans the measured values and "
                "a decade either side: a bound above it runs off the top (the table has "
                "every value, ∞ past float64's range). " + esc(CAVEATS),
                "measured residual and the paper's bounds against layer, log axis",
            )
        )
        for init in drawn:
            one = ds.sel(init=init)
            H, d = int(one["heads"]), int(one["d_qk"])
            parts.append(
                numbers(
                    _table(one),
                    f"Constants and ratios per layer, init {init} (H = {H}, "
                    f"d_qk = {d}, activation slope {_fmt(float(one['activation_lipschitz']))})",
                )
            )
        parts += [f'<p class="note">{esc(line[0].upper() + line[1:])}.</p>' for line in notes]
    parts.append("</section>")
    return "".join(parts)
