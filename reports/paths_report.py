"""Reports of the path analyses (``paths-count``, ``paths-sample``, ``paths-decompose``).

Same page, meta tags and figure machinery as the collapse report; one render
function per analysis, picked by ``ds.attrs["analysis"]``.
"""

from __future__ import annotations

import xarray as xr

from probe.figures.plot_paths import (
    count_shares,
    decompose_error,
    decompose_layers,
    decompose_shares,
    fit_decay,
    fit_texts,
    sample_ratios,
)
from probe.files.results import attrs_id
from probe.measures.stats import ordered, shown
from probe.names import INITS

from .figures import Figures, numbers
from .naming import model_stem
from .page import esc, href, page
from .provenance import ablation_table, provenance_table
from .reproduce import command_line
from .tables import fmt, html_table

ANALYSES = ("paths-count", "paths-sample", "paths-decompose")


def is_paths(ds: xr.Dataset) -> bool:
    return str(ds.attrs.get("analysis", "")) in ANALYSES


def paths_report_name(ds: xr.Dataset) -> str:
    """E.g. "paths-count-presets-1a2b3c4d", "paths-sample-minilm-pretrained-float32-1a2b3c4d"."""
    parts = [str(ds.attrs["analysis"]), model_stem(ds.attrs.get("model", "model"))]
    if "init" in ds.coords:
        parts += ordered(ds.init.values, INITS)
    if ds.attrs.get("dtype"):
        parts.append(str(ds.attrs["dtype"]))
    # Every other setting (seed, sizes, samples, text, ...) as a short hash, so that two
    # runs that differ in any of them never write the same file.
    parts.append(attrs_id(ds.attrs))
    return "-".join(parts)


def render_paths(ds: xr.Dataset, result_file: str | None = None) -> str:
    result_file = result_file or f"{paths_report_name(ds)}.nc"
    kind = str(ds.attrs["analysis"])
    title, body = {
        "paths-count": _count,
        "paths-sample": _sample,
        "paths-decompose": _decompose,
    }[kind](ds, Figures())
    header = (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">created {esc(ds.attrs.get("created", "?"))} · probe '
        f"{esc(ds.attrs.get('probe_version', '?'))}</p>"
        f'<nav class="toc"><a href="{href(result_file)}">data ({esc(result_file)})</a></nav></header>'
    )
    reproduce = (
        '<section id="summary"><p>Reproduce with:</p>'
        f"<pre><code>{esc(command_line(ds.attrs))}</code></pre></section>"
    )
    details = ""
    if ds.attrs.get("ablation_table"):
        details = (
            '<section id="ablations"><h2>Ablations in this family</h2>'
            f"{ablation_table(ds.attrs)}</section>"
        )
    provenance = f'<section id="provenance"><h2>Provenance</h2>{provenance_table(ds)}</section>'
    return page(title, header + reproduce + body + details + provenance, _meta(ds, result_file))


def _meta(ds: xr.Dataset, result_file: str) -> dict[str, str]:
    inits = ordered(ds.init.values, INITS) if "init" in ds.coords else []
    return {
        "model": str(ds.attrs.get("model", "")),
        "analysis": str(ds.attrs.get("analysis", "")),
        "family": str(ds.attrs.get("family", "")),
        "variants": str(ds.attrs.get("variant", "")),
        "init": ",".join(inits),
        "created": str(ds.attrs.get("created", "")),
        "result": result_file,
    }


def _big(value: object) -> str:
    """An exact integer of any length, wrapped rather than cut."""
    return f'<code style="word-break: break-all">{esc(value)}</code>'


# --- counting ---------------------------------------------------------------------


def _count(ds: xr.Dataset, figure: Figures) -> tuple[str, str]:
    fig = figure(
        count_shares(ds),
        "Share of paths of each length, C(L,k) H<sup>k</sup> / (H+1)<sup>L</sup>. The x-axis is "
        "logarithmic in k + 1 and labelled with k, so the single all-skip path (k = 0) is drawn "
        "at 1. Solid: the architectures of the paper's path-length figure; dashed: today's models.",
        "share of paths against path length",
    )
    rows = []
    for name in ds.architecture.values:
        one = ds.sel(architecture=name)
        rows.append(
            [
                esc(name),
                str(int(one.layers)),
                str(int(one.heads)),
                _big(one["total"].values),
                fmt(float(one["log10_total"]), 4),
                fmt(float(one["mean_length"]), 4),
                esc(one["source"].values),
            ]
        )
    summary = html_table(
        ["architecture", "L", "H", "paths (H+1)<sup>L</sup>", "log10", "mean length", "source"],
        rows,
        "paths-count",
    )
    per_length = []
    for name in ds.architecture.values:
        one = ds.sel(architecture=name)
        lines = [
            [str(int(k)), _big(one["count"].sel(path_length=k).values)]
            + [fmt(float(one[v].sel(path_length=k)), 4) for v in ("share", "cumulative_share")]
            for k in ds.path_length.values
            if str(one["count"].sel(path_length=k).values)
        ]
        per_length.append(
            numbers(
                html_table(["k", "paths of length k", "share", "share up to k"], lines, "counts"),
                f"{name}: exact counts per length",
            )
        )
    body = (
        '<section id="counts"><h2>Paths per length</h2>'
        "<p>An L-layer network with H heads per layer and skip connections is a sum of "
        "(H+1)<sup>L</sup> paths; C(L,k) H<sup>k</sup> of them go through k heads. The shares are "
        "a binomial distribution with mean L H / (H+1): by count, almost every path is long.</p>"
        f"{fig}{summary}{''.join(per_length)}</section>"
    )
    title = "Attention paths: how many of each length"
    return title, body


# --- sampling ---------------------------------------------------------------------


_FIT_WORDS = {"svd": "best rank-one fit (SVD)", "mean": "mean row, 1p<sup>T</sup>"}


def _orders(ds: xr.Dataset) -> list[str]:
    """The multiplication orders a result holds, the headline (earliest-left) first."""
    return [str(o) for o in ds.order.values] if "order" in ds.coords else ["latest-left"]


def _fit_rows(ds: xr.Dataset, order: str) -> list[list[str]]:
    """Per init, one row per fit (SVD first): decay, fitted order, median per depth."""
    rows = []
    for init in ds.init.values:
        for fit in ("svd", "mean"):
            fits = fit_decay(ds, fit=fit, order=order)
            texts = fit_texts(fits, init, str(ds.attrs.get("dtype", "float64")))
            rows.append(
                [esc(init), _FIT_WORDS[fit], *(esc(t) for t in texts)]
                + [
                    esc(shown(float(fits["median"].sel(init=init, depth=d)), ds))
                    for d in ds.depth.values
                ]
            )
    return rows


def _sample(ds: xr.Dataset, figure: Figures) -> tuple[str, str]:
    orders = _orders(ds)
    headline = orders[0]
    product = (
        "P = A<sub>l_1</sub> ⋯ A<sub>l_d</sub> (earliest layer on the left, as the paper's "
        "notebook multiplies)"
        if headline == "earliest-left"
        else "P = A<sub>l_d</sub> ⋯ A<sub>l_1</sub> (latest layer on the left)"
    )
    fig = figure(
        sample_ratios(ds, fit="svd", order=headline),
        "Relative distance from the best rank-one (SVD) fit, ‖P − rank1(P)‖ / ‖P‖ (l1inf "
        f"norm), the paper's quantity, of the attention product {product} along "
        f"{ds.sizes['sample']} sampled paths per depth d (d distinct layers, one head each, one "
        "sequence). Boxes: quartiles; whiskers 1.5 IQR. Solid: exponential fit of the median; "
        "dotted: the doubly exponential reference r(1)<sup>3<sup>d−1</sup></sup>. Clipped at the "
        "dtype's epsilon; shaded: below the run's precision floor (10 epsilons), where the "
        "ratio is the arithmetic's rounding and the tables show it as below the floor.",
        "ratio against depth, log axis",
    )
    head = [
        "init",
        "distance to",
        "log10 decay per layer (± stderr, depths)",
        "fitted order (± stderr, pairs)",
    ] + [  # fmt: skip
        f"median d={int(d)}" for d in ds.depth.values
    ]
    other = ""
    for order in orders[1:]:
        other += numbers(
            html_table(head, _fit_rows(ds, order), "fits-other"),
            f"The same with the product multiplied in the other order ({order}: "
            + (
                "P = A_ld ⋯ A_l1, the map the path applies to the tokens)"
                if order == "latest-left"
                else "P = A_l1 ⋯ A_ld)"
            ),  # plain text: numbers() escapes its summary
        )
    body = (
        '<section id="sample"><h2>Attention products along paths</h2>'
        "<p>Each attention matrix is row-stochastic, so is their product; the paper shows the "
        "product along a path of length d approaches a rank-one matrix doubly exponentially in "
        "d. Headline: the distance to the best rank-one fit (SVD) of the product multiplied "
        f"as the paper's notebook does ({esc(headline)}); the distance to 1p<sup>T</sup> "
        "(p the mean row) beside it. A fitted order near 3 is the cubic contraction, near 1 "
        "plain exponential decay.</p>"
        f"{fig}{html_table(head, _fit_rows(ds, headline), 'fits')}{other}</section>"
    )
    title = f"Attention paths in {ds.attrs.get('model', 'a model')}: chained attention"
    return title, body


# --- decomposition ----------------------------------------------------------------


def _decompose(ds: xr.Dataset, figure: Figures) -> tuple[str, str]:
    parts = []
    for init in ordered(ds.init.values, INITS):
        parts.append(
            figure(
                decompose_shares(ds, init),
                f"{esc(init)} init: Frobenius-norm share of each path length in the output of the "
                "frozen SAN+skip network (mean over sequences), next to the share of paths of that "
                "length by count. x: log axis at k + 1, labelled k.",
                "norm share against path length",
            )
        )
    task = "loss" in ds
    parts.append(
        figure(
            decompose_error(ds),
            "Left: relative error ‖X<sub>≤k</sub> − X‖<sub>F</sub> / ‖X‖<sub>F</sub> of the last "
            "layer's output when only paths of length ≤ k are kept (the bias constant is always "
            "kept). Right: "
            + (
                "next-token loss of GPT-2's tied LM head on the truncated output (dotted: the "
                "full output)."
                if task
                else "cosine of the truncated mean-pooled sentence embedding to the full one."
            ),
            "truncation error and task measure against k",
        )
    )
    parts.append(
        figure(
            decompose_layers(ds),
            "Effective path length of the residual stream X<sub>l</sub> after each layer: the "
            "mean length weighted by each length's Frobenius norm (band: ±1 sd over sequences), "
            "next to the mean length by count, l H / (H+1).",
            "effective path length against layer",
        )
    )
    eff = ds["effective_length"].sel(norm="fro").mean("sequence")
    rows = [
        [str(int(layer))]
        + [fmt(float(eff.sel(init=i, layer=layer)), 3) for i in ds.init.values]
        + [fmt(float(ds["uniform_mean_length"].sel(layer=layer)), 3)]
        for layer in ds.layer.values
    ]
    head = ["layer"] + [f"effective length ({esc(i)})" for i in ds.init.values] + ["count mean"]
    const = ds["constant_share"].sel(norm="fro").mean("sequence")
    const_rows = [
        [str(int(layer))] + [fmt(float(const.sel(init=i, layer=layer)), 3) for i in ds.init.values]
        for layer in ds.layer.values
    ]
    body = (
        '<section id="decompose"><h2>Exact path-length decomposition</h2>'
        f"<p>{esc(ds.attrs.get('frozen', ''))}</p>"
        f"{''.join(parts)}"
        "<h3>Effective path length per layer (norm-weighted mean length)</h3>"
        f"{html_table(head, rows, 'effective')}"
        + numbers(
            html_table(["layer"] + [esc(i) for i in ds.init.values], const_rows, "constant"),
            "Norm of the bias constant relative to the layer's output (Frobenius)",
        )
        + "</section>"
    )
    title = f"Attention paths in {ds.attrs.get('model', 'a model')}: path-length decomposition"
    return title, body
