"""The report of one "collapse" dataset: one self-contained HTML page.

Reading order: what was probed, the story in one paragraph and how to
reproduce it, the paper's figure (linear and log), the order of collapse, the
other metrics, then the details: what the ablations mean in this family and
every attr the probe recorded. One function per section, in that order.
"""

from __future__ import annotations

import xarray as xr

from probe.figures.plot import METRICS, collapse, collapse_order, describe_selection, metric
from probe.measures.stats import (
    FIT_UPPER,
    MAX_STDERR,
    MIN_SPREAD,
    eps,
    floor,
    order_fit,
    ordered,
    short,
    stats,
    summarise,
)
from probe.names import INITS, VARIANTS
from probe.registry import find, resolve

from .figures import Figures, numbers
from .naming import report_name, settings_summary
from .page import esc, href, page
from .provenance import ablation_table, provenance_table
from .reproduce import command_line
from .tables import norms_table, orders_table, stats_table
from .text import paragraph
from .theory import theory_section

#: A result up to this size is read into memory once for its report.  The page reads every
#: variable many times (each table, figure and summary), and each read of a lazily opened
#: file goes back through HDF5: bert-base at 2 x 16 tokens spent 1 s of CPU time there.  A
#: larger result is read slice by slice, so the page never holds the whole of it.
IN_MEMORY_BYTES = 64 * 2**20

_METRIC_NOTES = {
    "effective_rank": "exp of the entropy of the normalised singular values (Roy & Vetterli)",
    "stable_rank": "squared Frobenius over squared spectral norm, a smooth lower bound on the rank",
    "cosine_similarity": "mean pairwise cosine similarity of the tokens; 1 means all tokens align",
}


def metadata(ds: xr.Dataset, result_file: str) -> dict[str, str]:
    """The probe:* meta tags the index is rebuilt from."""
    return {
        "model": str(ds.attrs.get("model", "")),
        "analysis": str(ds.attrs.get("analysis", "collapse")),
        "family": str(ds.attrs.get("family", "")),
        "variants": ",".join(ordered(ds.variant.values, VARIANTS)),
        "init": ",".join(ordered(ds.init.values, INITS)),
        "created": str(ds.attrs.get("created", "")),
        "result": result_file,
        "settings": settings_summary(ds.attrs),
        "id": str(ds.attrs.get("settings_id", "")),
    }


def _band(ds: xr.Dataset) -> str:
    return f"mean over {ds.sizes.get('sequence', 0)} sequences, band ±1 sd"


def _header(ds: xr.Dataset, title: str, result_file: str) -> str:
    a = ds.attrs
    facts = [
        f"{ds.sizes.get('layer', 1) - 1} layers",
        f"{a.get('sequences', ds.sizes.get('sequence', '?'))} sequences "
        f"of {a.get('tokens', '?')} tokens ({a.get('inputs', '?')})",
        str(a.get("dtype", "")),
        f"surgery: {a.get('surgery', 'probe')}",
        f"created {a.get('created', '?')}",
        f"probe {a.get('probe_version', '?')}",
    ]
    links = [("#summary", "summary"), ("#collapse", "rank collapse"), ("#order", "order")]
    links += [("#metrics", "metrics"), ("#ablations", "ablations"), ("#provenance", "provenance")]
    nav = "".join(f'<a href="{target}">{words}</a>' for target, words in links)
    warnings = [a.get("weights_warning"), _surgery_warning(a), a.get("mask_note")]
    notes = "".join(f'<p class="warning">{esc(w)}</p>' for w in warnings if w)
    return (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">{" · ".join(esc(f) for f in facts)}</p>'
        f'<nav class="toc">{nav}<a href="{href(result_file)}">data ({esc(result_file)})</a></nav>'
        f"{notes}</header>"
    )


def _surgery_warning(attrs) -> str:
    if str(attrs.get("surgery", "probe")) == "probe":
        return ""
    return (
        "Ablations follow the paper's own surgery, not probe's uniform definitions: "
        f"{attrs.get('surgery_note', '')}."
    )


def _summary(ds: xr.Dataset, result_file: str, threshold: float) -> str:
    return (
        '<section id="summary"><h2>Summary</h2>'
        f'<p class="summary">{esc(paragraph(summarise(ds, threshold), threshold))}</p>'
        "<p>Reproduce with:</p>"
        f"<pre><code>{esc(command_line(ds.attrs))}</code></pre>"
        f'<p>Data: <a href="{href(result_file)}">{esc(result_file)}</a> '
        "(netCDF, read it with <code>xarray.open_dataset</code>).</p></section>"
    )


def _collapse(ds: xr.Dataset, figure: Figures) -> str:
    what = describe_selection("relative_residual", "l1inf", "mean")
    dtype = esc(ds.attrs.get("dtype", "float64"))
    linear = figure(
        collapse(ds),
        f"Relative residual r = ‖res(X)‖ / ‖X‖ ({esc(what)}) after each layer; {_band(ds)}. "
        "Layer 0 is the embeddings' output. SAN: no skip, no MLP; SAN+MLP: no skip; "
        "SAN+skip: no MLP; transformer: unablated.",
        "relative residual against layer, linear axis",
    )
    log = figure(
        collapse(ds, log=True),
        f"The same numbers on a log axis, clipped at {dtype} machine epsilon "
        f"({eps(ds):.1e}; dotted where reached) so full collapse stays visible. Shaded: "
        f"below the {dtype} precision floor ({short(floor(ds))}, 10 machine epsilons), where "
        "r is the arithmetic's rounding, not a measurement; tables show such values as "
        "below the floor.",
        "relative residual against layer, log axis",
    )
    table = numbers(stats_table(stats(ds), ds), f"Numbers behind figures 1–2: r, {_band(ds)}")
    robust = ""
    if {"norm", "fit"} <= set(ds["relative_residual"].dims):
        # Does the story depend on the norm or the fit? The final layer in all of them.
        robust = numbers(norms_table(ds), "Final-layer mean r in every norm and fit")
    return f'<section id="collapse"><h2>Rank collapse</h2>{linear}{log}{table}{robust}</section>'


def _order(ds: xr.Dataset, figure: Figures) -> str:
    fig = figure(
        collapse_order(ds),
        "Each point is one layer transition of the mean r. Filled points (both ends in "
        f"[{short(floor(ds))}, {FIT_UPPER:g}], from the {esc(ds.attrs.get('dtype', 'float64'))} "
        "precision floor up) enter the least-squares slope in the legend, with its standard "
        "error and number of pairs. A slope is shown when two pairs span at least "
        f"{MIN_SPREAD:g} decade of r or, from three pairs, when its standard error is at most "
        f"{MAX_STDERR:g}; otherwise it is n/a and the table says why. "
        "Dashed: slope 1, r(l+1) = r(l), exponential decay; dotted: slope 3, "
        "r(l+1) = r(l)³, the cubic contraction behind the doubly exponential bound.",
        "log r at layer l+1 against log r at layer l",
    )
    return (
        f'<section id="order"><h2>Order of collapse</h2>{fig}'
        "<h3>Fitted order (slope of log r(l+1) against log r(l))</h3>"
        f"{orders_table(order_fit(ds), str(ds.attrs.get('dtype', 'float64')))}</section>"
    )


def _metrics(ds: xr.Dataset, figure: Figures) -> str:
    parts = []
    for name in (m for m in METRICS if m in ds.data_vars):
        words = name.replace("_", " ")
        parts.append(
            f"<h3>{esc(words.capitalize())}</h3>"
            + figure(
                metric(ds, name),
                f"{esc(words.capitalize())}: {esc(_METRIC_NOTES[name])}; {_band(ds)}.",
                f"{words} against layer",
            )
            + numbers(stats_table(stats(ds, name)), f"Numbers behind the {words} figure")
        )
    body = "".join(parts) or '<p class="empty">No other metric was recorded.</p>'
    note = ds.attrs.get("metrics_note")
    if note:  # how each recorded metric was computed, and how accurate it is
        body = f'<p class="note">Metrics computed: {esc(note)}.</p>' + body
    return f'<section id="metrics"><h2>Other metrics</h2>{body}</section>'


def _details(ds: xr.Dataset) -> str:
    return (
        '<section id="ablations"><h2>Ablations</h2>'
        f"<p>What each ablation means in the {esc(ds.attrs.get('family', '?'))} family, "
        "in this probe and in the paper.</p>"
        f"{ablation_table(ds.attrs)}</section>"
        f'<section id="provenance"><h2>Provenance</h2>{provenance_table(ds)}</section>'
    )


def render(ds: xr.Dataset, result_file: str | None = None, threshold: float = 1e-3) -> str:
    """The HTML report of `ds`; `result_file` is the .nc file saved beside it.

    `result_file` defaults to `report_name(ds) + ".nc"`; `threshold` is the
    level of r the summary paragraph calls collapsed.
    """
    analysis = str(ds.attrs.get("analysis", "collapse"))
    if analysis == "collapse":
        return render_collapse(ds, result_file, threshold)
    known = find(analysis)  # each analysis has its own page (probe.registry)
    if known is None:
        from probe.errors import ProbeError

        raise ProbeError(f"probe has no report for results of the analysis {analysis!r}")
    return resolve(known.report)(ds, result_file)


def render_collapse(ds: xr.Dataset, result_file: str | None = None, threshold: float = 1e-3) -> str:
    """The report of a collapse result (see :func:`render`)."""
    result_file = result_file or f"{report_name(ds)}.nc"
    if ds.nbytes <= IN_MEMORY_BYTES:
        ds = ds.compute()  # a copy in memory; the caller's Dataset stays as it was
    a = ds.attrs
    inits = ", ".join(ordered(ds.init.values, INITS))
    title = f"Rank collapse in {a.get('model', 'a model')} ({a.get('family', '?')}, init: {inits})"
    figure = Figures()  # numbers the figures (and their SVG ids) across sections
    sections = [
        _header(ds, title, result_file),
        _summary(ds, result_file, threshold),
        _collapse(ds, figure),
        _order(ds, figure),
        theory_section(ds, figure),
        _metrics(ds, figure),
        _details(ds),
    ]
    return page(title, "\n".join(sections), metadata(ds, result_file))
