"""The numbers behind the figures, as HTML tables.

Cells show rounded numbers for reading and carry the exact values in
data-mean / data-std attributes, so a table can be checked (or scraped)
without parsing the rounded text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from probe.figures.plot import colour
from probe.measures.stats import fit_text, ordered, shown, stats
from probe.names import VARIANTS

from .page import esc


def html_table(head: list[str], rows: list[list[str]], cls: str) -> str:
    """A scrollable table of class ``cls``; cells are HTML already (callers escape)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<div class="table-scroll"><table class="{cls}"><thead><tr>{th}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def fmt(value: float, digits: int = 3) -> str:
    """Rounded for reading; NaN (not run, or no data) shows as an en dash."""
    return "–" if not np.isfinite(value) else f"{value:.{digits}g}"


def stat_cell(mean: float, std: float, floor_of: xr.Dataset | None = None) -> str:
    """Mean ± std; with ``floor_of`` (the result a distance to rank one comes from), a mean
    under its precision floor shows as below the floor, without its std."""
    text = fmt(mean) if floor_of is None else shown(mean, floor_of)
    if np.isfinite(std) and text == fmt(mean):
        text = f"{text} ± {fmt(std, 2)}"
    return f'<td class="num" data-mean="{mean!r}" data-std="{std!r}">{esc(text)}</td>'


def variant_label(variant: str) -> str:
    """A variant's name with its figure colour, so tables read like legends."""
    return (
        f'<span class="variant"><span class="swatch" style="background:{colour(variant)}">'
        f"</span>{esc(variant)}</span>"
    )


def _wrap(table: str) -> str:
    return f'<div class="table-scroll">{table}</div>'


def stats_table(st: xr.Dataset, floor_of: xr.Dataset | None = None) -> str:
    """Mean ± std over sequences: one row per layer, columns grouped by init then variant
    (``floor_of``: as :func:`stat_cell`'s)."""
    inits, variants = list(st.init.values), list(st.variant.values)
    head_init = "".join(f'<th colspan="{len(variants)}">init: {esc(init)}</th>' for init in inits)
    head_variant = "".join(
        f'<th class="num">{variant_label(str(v))}</th>' for _ in inits for v in variants
    )
    # Read once as arrays (layer, init, variant): a selection per cell took most of the time.
    mean, std = (st[name].transpose("layer", "init", "variant").values for name in ("mean", "std"))
    rows = []
    for row, layer in enumerate(st.layer.values):
        cells = "".join(
            stat_cell(float(mean[row, i, v]), float(std[row, i, v]), floor_of)
            for i in range(len(inits))
            for v in range(len(variants))
        )
        rows.append(f'<tr><th class="num">{int(layer)}</th>{cells}</tr>')
    return _wrap(
        '<table class="stats"><thead>'
        f'<tr><th rowspan="2">layer</th>{head_init}</tr><tr>{head_variant}</tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table>"
    )


def order_cell(found: xr.Dataset, low: float, dtype: str) -> str:
    """One fitted order (one variant and init of :func:`probe.measures.stats.order_fit`) with its
    quality, or a dash and why it is missing."""
    order = float(found["order"])
    one = {key: found[key].item() for key in ("pairs", "stderr", "spread")} | {"slope": order}
    return f'<td class="num" data-order="{order!r}">{esc(fit_text(one, low, dtype))}</td>'


def orders_table(orders: xr.Dataset, dtype: str) -> str:
    """Fitted order of collapse (slope of log r(l+1) vs log r(l)) per variant and init,
    from :func:`probe.measures.stats.order_fit` of a result run in ``dtype``."""
    inits = list(orders.init.values)
    head = "".join(f'<th class="num">init: {esc(i)}</th>' for i in inits)
    rows = []
    for variant in orders.variant.values:
        cells = "".join(
            order_cell(orders.sel(variant=variant, init=i), orders.attrs["floor"], dtype)
            for i in inits
        )
        rows.append(f"<tr><td>{variant_label(str(variant))}</td>{cells}</tr>")
    return _wrap(
        f'<table class="orders"><thead><tr><th>variant</th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def norms_table(ds: xr.Dataset) -> str:
    """Final-layer mean r in every norm and fit: does the picture depend on the norm?

    Means only (the std is in the per-layer tables): ten columns must fit the page.
    """
    fits = [str(f) for f in ds.fit.values]
    norms = [str(n) for n in ds.norm.values]
    per = {(f, n): stats(ds, "relative_residual", n, f) for f in fits for n in norms}
    last = int(ds.layer.max())
    first = next(iter(per.values()))
    head_fit = "".join(f'<th colspan="{len(norms)}">fit: {esc(f)}</th>' for f in fits)
    head_norm = "".join(f'<th class="num">{esc(n)}</th>' for _ in fits for n in norms)
    rows = []
    for variant in first.variant.values:
        for init in first.init.values:
            cells = "".join(
                stat_cell(
                    float(per[f, n]["mean"].sel(variant=variant, init=init, layer=last)),
                    float("nan"),
                    ds,
                )
                for f in fits
                for n in norms
            )
            rows.append(
                f"<tr><td>{variant_label(str(variant))}</td><td>{esc(init)}</td>{cells}</tr>"
            )
    return _wrap(
        '<table class="norms"><thead>'
        f'<tr><th rowspan="2">variant</th><th rowspan="2">init</th>{head_fit}</tr>'
        f"<tr>{head_norm}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def final_table(datasets: Sequence[xr.Dataset], norm: str = "l1inf", fit: str = "mean") -> str:
    """Final-layer mean ± std of r per model and init (rows) and variant (columns)."""
    per = [stats(ds, "relative_residual", norm, fit) for ds in datasets]
    variants = ordered(dict.fromkeys(v for st in per for v in st.variant.values), VARIANTS)
    head = "".join(f'<th class="num">{variant_label(v)}</th>' for v in variants)
    rows = []
    for ds, st in zip(datasets, per, strict=True):
        last = int(st.layer.max())
        for init in st.init.values:
            cells = []
            for v in variants:
                if v not in st.variant.values:
                    cells.append(stat_cell(float("nan"), float("nan")))
                    continue
                one = st.sel(variant=v, init=init, layer=last)
                cells.append(stat_cell(float(one["mean"]), float(one["std"]), ds))
            rows.append(
                f"<tr><td>{esc(ds.attrs.get('model', ''))}</td><td>{esc(init)}</td>"
                f'<td class="num">{last}</td>{"".join(cells)}</tr>'
            )
    return _wrap(
        '<table class="final"><thead><tr><th>model</th><th>init</th>'
        f'<th class="num">layer</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def family_table(datasets: Sequence[xr.Dataset], threshold: float = 1e-3) -> str:
    """The comparison's first table: per model, r after the last layer for each variant, the
    depth at which SAN falls below ``threshold``, and the SAN's fitted order of collapse."""
    from probe.measures.stats import comparison_rows

    rows = comparison_rows(datasets, threshold)
    variants = ordered(dict.fromkeys(v for row in rows for v in row["final"]), VARIANTS)
    head = "".join(f'<th class="num">{variant_label(v)}</th>' for v in variants)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{esc(row["final_text"].get(v, "—"))}</td>' for v in variants
        )
        below = "—" if row["san_below"] is None else str(row["san_below"])
        order = "—" if row["order"] is None else f"{row['order']:.2f}"
        order = esc(f"{order} ({row['order_note']})")
        body.append(
            f"<tr><td>{esc(row['model'])}</td><td>{esc(row['family'])}</td>"
            f'<td>{esc(row["init"])}</td><td class="num">{row["layers"]}</td>{cells}'
            f'<td class="num">{below}</td><td class="num">{order}</td></tr>'
        )
    return _wrap(
        '<table class="families"><thead><tr><th>model</th><th>family</th><th>init</th>'
        f'<th class="num">layers</th>{head}<th class="num">SAN &lt; {threshold:g} at layer</th>'
        f'<th class="num">SAN order</th></tr></thead><tbody>{"".join(body)}</tbody></table>'
    )
