"""The collapse report's theory panel: the paper's bounds beside the measured residual.

The numbers come from the result's ``theory`` attribute (``probe.theory.panels``,
computed from the model's own weights when the run was made); this module only draws
them: one axis per init, the measured ||res(X_l)||_{1,inf} of SAN, SAN+MLP and SAN+skip
(median over the panel's sequences) as solid lines, the bound of Theorem 2.2 and of
Corollary 3.2 dashed in the colour of the variant each bounds, on a log axis.
"""

from __future__ import annotations

import json
import math

import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from probe.plot import colour, log_axis

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


def _figure(panels: list[dict]) -> Figure:
    fig = Figure(figsize=(5.2 * len(panels), 3.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, found in zip(axes, panels, strict=True):
        for name, values in found["measured"].items():
            ax.plot(range(len(values)), values, color=colour(name), label=f"{name}, measured")
        for name, bound in found["bounds"].items():
            # Past 1e100 a bound only flattens the measured lines: the dashed line ends there.
            values = [v if v <= 1e100 else float("nan") for v in bound["bound"]]
            ax.plot(
                range(len(values)),
                values,
                color=colour(bound["variant"]),
                linestyle="--",
                label=f"{name} bound",
            )
        log_axis(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer")
        ax.set_ylabel("‖res(X)‖₁,∞")
        ax.set_title(f"init: {found['init']}")
        ax.legend(fontsize=7)
    return fig


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "—" if math.isnan(value) else "∞"
    return f"{value:.3g}"


def _table(found: dict) -> str:
    L = len(found["beta"])
    bounds = found["bounds"]
    head = ["layer", "max‖W_QK‖₁", "max‖W_VO‖₁,∞", "β", "4βH/√d", "λ"]
    for name in bounds:
        head += [f"{name}: bound", "measured/bound", "vacuous"]
    rows = []
    for layer in range(L + 1):
        cells = [str(layer)]
        if layer == 0:
            cells += ["—"] * 5
        else:
            i = layer - 1
            cells += [
                _fmt(found["qk"][i]),
                _fmt(found["vo"][i]),
                _fmt(found["beta"][i]),
                _fmt(found["c"][i]),
                _fmt(found["lambda"][i]),
            ]
        for bound in bounds.values():
            cells += [
                _fmt(bound["bound"][layer]),
                _fmt(bound["ratio"][layer]),
                _fmt(bound["vacuous"][layer]),
            ]
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    header = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"
    return f"<table><thead>{header}</thead><tbody>{''.join(rows)}</tbody></table>"


def theory_section(ds: xr.Dataset, figure: Figures) -> str:
    """The report's "Theory beside measurement" section (one line where there is nothing)."""
    raw = ds.attrs.get("theory")
    head = '<section id="theory"><h2>Theory beside measurement</h2>'
    if not raw:
        return (
            head + "<p>This result was made before probe recorded the paper's bounds; "
            "run <code>probe collapse</code> again for the theory panel.</p></section>"
        )
    panels = json.loads(raw)
    missing = sorted({line for found in panels for line in found.get("missing", [])})
    notes = sorted({line for found in panels for line in found.get("notes", [])})
    parts = [head]
    parts += [f'<p class="note">{esc(line[0].upper() + line[1:])}.</p>' for line in missing]
    drawn = [found for found in panels if "bounds" in found]
    if drawn:
        parts.append(
            figure(
                _figure(drawn),
                "The paper's upper bounds from this model's weights (dashed; Theorem 2.2 for "
                "SAN, Corollary 3.2 for SAN+MLP), run layer by layer from the measured "
                "‖res(X_0)‖, beside the measured ‖res(X_l)‖₁,∞ (solid; token-mean fit, "
                "median over the first sequences); a dashed line ends where its bound passes "
                "1e100 (the table has every value, ∞ past float64's range). " + esc(CAVEATS),
                "measured residual and the paper's bounds against layer, log axis",
            )
        )
        for found in drawn:
            H, d = found["heads"], found["d_qk"]
            parts.append(
                numbers(
                    _table(found),
                    f"Constants and ratios per layer, init {found['init']} (H = {H}, "
                    f"d_qk = {d}, activation slope {_fmt(found['lipschitz_activation'])})",
                )
            )
        parts += [f'<p class="note">{esc(line[0].upper() + line[1:])}.</p>' for line in notes]
    parts.append("</section>")
    return "".join(parts)
