"""The report of a sweep: its summaries against the swept values, the phase diagram, a table.

Same page, meta tags and figure machinery as the other reports.  One swept value (besides
the seed): the summaries as curves against it (:func:`probe.figures.plot_sweep.curves`; checkpoints
against the training step on a log axis).  Two: the phase diagram of the final relative
residual per variant (:func:`probe.figures.plot_sweep.phase`) and the curves along the first.  Every
point's numbers and its own ``probe collapse`` command follow in a folded table.
"""

from __future__ import annotations

import json

import xarray as xr

from probe.figures.plot_sweep import curves, phase, swept
from probe.measures.stats import ordered, point_order_text, point_rate_text, shown
from probe.names import INITS, VARIANTS

from .figures import Figures, numbers
from .page import esc, href, page
from .provenance import provenance_table
from .reproduce import command_line
from .tables import fmt, html_table


def _point_command(ds: xr.Dataset, one: xr.Dataset) -> str:
    """A point's command: the one it recorded, or the one its request renders (a point
    keeps its own `request` where points differ in it)."""
    request = one["request"].item() if "request" in one else ds.attrs.get("request", "")
    return command_line({"command": one["command"].item(), "request": request})


def _rows(ds: xr.Dataset) -> tuple[list[str], list[list[str]]]:
    dims = swept(ds)
    variants = ordered(ds.variant.values, VARIANTS)
    head = [*dims, "init", *(f"final r {v}" for v in variants), "SAN r &lt; 1e-3 at",
            "SAN order", "SAN mu(X) rate", "eff. rank (transformer)", "sink rate", "massive ratio", "command"]  # fmt: skip
    flat = ds.stack(point=dims)
    rows = []
    for index in range(flat.sizes["point"]):
        one = flat.isel(point=index)
        for init in ordered(ds.init.values, INITS):
            at = one.sel(init=init)
            below = int(at["first_below"].sel(variant="SAN")) if "SAN" in variants else -1
            rows.append([
                *(esc(one[d].item()) for d in dims),
                esc(init),
                *(esc(shown(float(at["final_residual"].sel(variant=v)), ds)) for v in variants),
                "never" if below < 0 else str(below),
                esc(point_order_text(at, "SAN", ds)),
                esc(point_rate_text(at, "SAN", ds)),
                _cell(at, "final_effective_rank", "transformer"),
                fmt(float(at["sink_rate"])),
                fmt(float(at["max_massive_ratio"]), 4),
                f"<code>{esc(_point_command(ds, one))}</code>",
            ])  # fmt: skip
    return head, rows


def _cell(at: xr.Dataset, name: str, variant: str) -> str:
    """One variant's value of a summary, or a dash where the sweep did not run it."""
    if variant not in at.variant.values:
        return "–"
    return fmt(float(at[name].sel(variant=variant)))


def render_sweep(ds: xr.Dataset, result_file: str | None = None) -> str:
    """The HTML page of a sweep result (no I/O)."""
    result_file = result_file or "sweep.nc"
    model = str(ds.attrs.get("model", "?"))
    dims = swept(ds)
    grid = json.loads(ds.attrs.get("sweep_dims", "{}"))
    title = f"{model} · sweep over {', '.join(dims)}"
    header = (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">created {esc(ds.attrs.get("created", "?"))} · probe '
        f"{esc(ds.attrs.get('probe_version', '?'))}</p>"
        f'<nav class="toc"><a href="{href(result_file)}">data ({esc(result_file)})</a></nav></header>'
    )
    done, total = int(ds.attrs.get("points_done", 0)), int(ds.attrs.get("points", 0))
    values = "".join(f"<li><b>{esc(d)}</b>: {esc(', '.join(v))}</li>" for d, v in grid.items())
    summary = (
        '<section id="summary"><p>Reproduce with:</p>'
        f"<pre><code>{esc(command_line(ds.attrs))}</code></pre>"
        f"<p>{done} of {total} points; each is one <code>probe collapse</code> run with its "
        f"values (its command is in the table below).</p><ul>{values}</ul>"
        f"<p>{esc(ds.attrs.get('summaries_note', ''))}.</p>"
        f"<p>{esc(ds.attrs.get('padding_note', ''))}. {esc(ds.attrs.get('attention_note', ''))}"
        "</p></section>"
    )
    body = _figures(ds, dims)
    provenance = f'<section id="provenance"><h2>Provenance</h2>{provenance_table(ds)}</section>'
    meta = {
        "model": model,
        "analysis": "sweep",
        "family": str(ds.attrs.get("family", "")),
        "variants": ",".join(ordered(ds.variant.values, VARIANTS)),
        "init": ",".join(ordered(ds.init.values, INITS)),
        "created": str(ds.attrs.get("created", "")),
        "result": result_file,
        "settings": ", ".join(dims),
        "id": str(ds.attrs.get("settings_id", "")),
    }
    return page(title, header + summary + body + provenance, meta)


def _figures(ds: xr.Dataset, dims: list[str]) -> str:
    """The figures section: the phase diagram (two swept settings besides the seed), the
    summaries against the first swept value, and every point's row."""
    figure = Figures()
    body = '<section id="figures"><h2>Summaries against the swept values</h2>'
    besides_seed = [d for d in dims if d != "seed"]
    if len(besides_seed) >= 2:
        body += figure(
            phase(ds),
            "The phase diagram: the relative residual after the last layer (median over "
            f"sequences) over {esc(besides_seed[0])} and {esc(besides_seed[1])}, per variant"
            + (", mean over seeds" if "seed" in dims else "")
            + ".",
            "phase diagram of the final relative residual",
        )
    body += figure(
        curves(ds),
        "Each summary against the first swept value, a line per variant"
        + (" (mean over seeds, their range shaded)" if "seed" in dims else "")
        + "; log axes where the values span a decade or more.  A point missing from the "
        "fitted order is a fit too poor to state (too few layer pairs above the precision "
        "floor, or too scattered); the table gives the SAN's order or the reason it has none.  "
        "The rate of mu(X) is its factor per layer, fitted through the layers above the "
        "floor; a point missing from it has fewer than three such layers.",
        "summaries against the swept value",
    )
    head, rows = _rows(ds)
    return (
        body
        + numbers(html_table(head, rows, "sweep"), "every point's summaries and command")
        + "</section>"
    )
