"""The comparison report: several models' collapse side by side on one page.

One panel per model on shared axes (so depth and level compare at a glance),
linear and log, for every init all models share; then the final-layer numbers
per model, variant and init, and where each model's data came from.
"""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from probe.figures.plot import across_models, comparison
from probe.measures.stats import ordered, summarise
from probe.names import INITS, VARIANTS

from .figures import Figures
from .naming import report_name
from .page import esc, href, page
from .reproduce import command_line
from .tables import family_table, final_table
from .text import EXPLANATION, paragraph


def _models_phrase(models: Sequence[str]) -> str:
    return models[0] if len(models) == 1 else f"{', '.join(models[:-1])} and {models[-1]}"


def _sources(datasets: Sequence[xr.Dataset], result_files: Sequence[str]) -> str:
    rows = []
    for ds, result in zip(datasets, result_files, strict=True):
        a = ds.attrs
        rows.append(
            f"<tr><td>{esc(a.get('model', ''))}</td><td>{esc(a.get('family', ''))}</td>"
            f'<td class="num">{ds.sizes.get("layer", 1) - 1}</td><td>{esc(a.get("dtype", ""))}</td>'
            f"<td>{esc(a.get('created', ''))}</td><td><code>{esc(command_line(a))}</code></td>"
            f'<td><a href="{href(result)}">{esc(result)}</a></td></tr>'
        )
    return (
        '<div class="table-scroll"><table class="sources"><thead><tr><th>model</th>'
        '<th>family</th><th class="num">layers</th><th>dtype</th><th>created</th>'
        f"<th>command</th><th>data</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def render_comparison(
    datasets: Sequence[xr.Dataset],
    result_files: Sequence[str] | None = None,
    created: str | None = None,
    threshold: float = 1e-3,
) -> str:
    """HTML comparing `datasets`; `result_files` are their .nc files (default: report names).

    `created` defaults to the newest input's, which keeps the function pure;
    pass the time of rendering to list the comparison by when it was made.
    """
    datasets = list(datasets)
    if not datasets:
        raise ValueError("render_comparison needs at least one dataset")
    if result_files is None:
        result_files = [f"{report_name(ds)}.nc" for ds in datasets]
    if len(result_files) != len(datasets):
        raise ValueError("one result file per dataset")
    models = [str(ds.attrs.get("model", "?")) for ds in datasets]
    title = f"Rank collapse compared: {_models_phrase(models)}"
    shared = [i for i in INITS if all(i in ds.init.values for ds in datasets)]
    figure = Figures()

    parts = [
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">{len(datasets)} models · relative residual, '
        "residual to the token mean, l1inf norm</p></header>",
        _families_section(datasets, threshold, figure),
    ]
    for init in shared or [None]:
        parts.append(_init_section(datasets, init, figure))
    parts.append(_final_section(models, datasets, threshold))
    parts.append(
        f'<section id="sources"><h2>Sources</h2>{_sources(datasets, result_files)}</section>'
    )
    meta = _meta(models, datasets, result_files, created)
    return page(title, "\n".join(parts), meta)


def _families_section(datasets: list[xr.Dataset], threshold: float, figure: Figures) -> str:
    return (
        '<section id="families"><h2>Across models</h2>'
        "<p>Per model and init: the mean relative residual r after the last layer for each "
        f"variant, the first layer at which the pure-attention SAN falls below {threshold:g} "
        "(— if it does not within the model's depth), and the SAN's fitted order of collapse "
        "(the slope of log r(l+1) on log r(l): 1 is exponential, 3 the paper's cubic "
        "contraction).</p>"
        f"{family_table(datasets, threshold)}"
        + figure(
            across_models(datasets),
            "Relative residual against layer, one panel per variant, one line per model "
            "(mean over sequences; pretrained where available; causal decoders dashed), "
            "clipped at each model's machine epsilon.",
            "relative residual per variant, one line per model, log axis",
        )
        + "</section>"
    )


def _init_section(datasets: list[xr.Dataset], init: str | None, figure: Figures) -> str:
    """One init's panels per model, linear then log (``init`` None: pretrained where any)."""
    which = f"init: {init}" if init else "pretrained where available"
    return (
        f"<section><h2>{esc(which.capitalize())}</h2>"
        + figure(
            comparison(datasets, log=False, init=init),
            f"Relative residual against layer, one panel per model on shared axes ({esc(which)}); "
            "mean over sequences, band ±1 sd.",
            f"relative residual per model, {which}, linear axis",
        )
        + figure(
            comparison(datasets, log=True, init=init),
            "The same on a log axis, clipped at each model's machine epsilon.",
            f"relative residual per model, {which}, log axis",
        )
        + "</section>"
    )


def _final_section(models: list[str], datasets: list[xr.Dataset], threshold: float) -> str:
    stories = []
    for model, ds in zip(models, datasets, strict=True):
        story = paragraph(summarise(ds, threshold), threshold, explain=False)
        stories.append(f"<li><strong>{esc(model)}</strong>: {esc(story)}</li>")
    story_list = "<ul>" + "".join(stories) + "</ul>"
    return (
        '<section id="final"><h2>Final layer</h2>'
        "<p>Mean ± sd of r over sequences at each model's last layer.</p>"
        f"{final_table(datasets)}{story_list}<p>{esc(EXPLANATION)}</p></section>"
    )


def _meta(
    models: list[str],
    datasets: list[xr.Dataset],
    result_files: Sequence[str],
    created: str | None,
) -> dict[str, str]:
    return {
        "model": ", ".join(models),
        "analysis": "comparison",
        "family": ", ".join(dict.fromkeys(str(ds.attrs.get("family", "")) for ds in datasets)),
        "variants": ",".join(
            ordered(dict.fromkeys(v for ds in datasets for v in ds.variant.values), VARIANTS)
        ),
        "init": ",".join(
            ordered(dict.fromkeys(i for ds in datasets for i in ds.init.values), INITS)
        ),
        "created": created or max(str(ds.attrs.get("created", "")) for ds in datasets),
        "result": ", ".join(result_files),
    }
