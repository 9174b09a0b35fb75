"""The report of one "toy" Dataset (probe.analyses.toy): one self-contained HTML page.

Sort, convex hull, memorization: the accuracy of the network restricted to n
random paths of each length, beside the full model and the input-blind
baselines (all measured on the same evaluation set), the rules the paths were
evaluated with, the training loss, the paths drawn.  Circle: the trajectories
of the three variants under recurrent application for each hidden size, the
relative residual of the two points per step, the losses, and what the
variants mean in the chosen setup.  Every report lists the ways its run
differs from the paper's (the ``deviations`` attribute).
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from probe.files.results import attrs_id

from . import toy_figures as figs
from .figures import Figures, numbers
from .page import esc, esc_code, href, page
from .provenance import provenance_table
from .reproduce import command_line
from .tables import fmt, stat_cell
from .text import duration

_TASK_WORDS = {
    "sort": "sorting 8-token sequences (per-token accuracy)",
    "convex-hull": "finding the convex hull of point sets (per-point accuracy)",
    "memorization": "memorizing random labels of natural-text tokens (training-set accuracy)",
    "circle": "moving two points along a circle, then applying the network recurrently",
}


#: attrs that vary from run to run or follow from the others: not part of the file name's hash.
_NOT_HASHED = ("seconds", "train_seconds", "threads", "deviations")


def toy_name(ds: xr.Dataset) -> str:
    """File stem, e.g. "toy-sort-seed0-1a2b3c4d" or "toy-circle-seed2-quick-1a2b3c4d".

    The last part hashes every other setting (epochs, sizes, learning rate, ...), so
    runs that differ in any of them never write the same file, and a rerun with the same
    settings replaces its own (timings and the derived list of deviations are left out).
    """
    a = {k: v for k, v in ds.attrs.items() if k not in _NOT_HASHED}
    quick = "-quick" if str(a.get("quick", "False")) == "True" else ""
    sub = "-subpath" if str(a.get("sub_path", "False")) == "True" else ""
    strict = "-strict" if str(a.get("setup", "")) == "strict" else ""
    return f"toy-{a.get('task', 'task')}-seed{a.get('seed', 0)}{strict}{sub}{quick}-{attrs_id(a)}"


def metadata(ds: xr.Dataset, result_file: str) -> dict[str, str]:
    if "variant" in ds.coords:
        variants = ",".join(map(str, ds.variant.values)) + f" ({ds.attrs.get('setup', '?')})"
    elif str(ds.attrs.get("sub_path")) == "True":
        variants = "sub-path"
    else:
        variants = f"no-sub-path ({_rules(ds)})"
    return {
        "model": str(ds.attrs.get("model", "")),
        "analysis": "toy",
        "family": str(ds.attrs.get("family", "")),
        "variants": variants,
        "init": "trained",
        "created": str(ds.attrs.get("created", "")),
        "result": result_file,
    }


def _header(ds: xr.Dataset, title: str, result_file: str) -> str:
    a = ds.attrs
    facts = [
        f"depth {a.get('depth', '?')}, width {a.get('width', '?')}, hidden {a.get('hidden', '?')}",
        *([f"{a.get('setup')} setup"] if a.get("setup") else []),
        f"{a.get('epochs', '?')} epochs, lr {a.get('lr', '?')}, batch {a.get('batch_size', '?')}",
        f"seed {a.get('seed', '?')}",
        f"{duration(a.get('seconds'))} on {a.get('device', '?')}",
        f"created {a.get('created', '?')}",
    ]
    return (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">{" · ".join(esc(f) for f in facts)}</p>'
        f'<nav class="toc"><a href="#summary">summary</a><a href="#results">results</a>'
        f'<a href="#deviations">differences from the paper</a><a href="#provenance">provenance</a>'
        f'<a href="{href(result_file)}">data ({esc(result_file)})</a></nav></header>'
    )


def _reproduce(ds: xr.Dataset, result_file: str) -> str:
    return (
        "<p>Reproduce with:</p>"
        f"<pre><code>{esc(command_line(ds.attrs))}</code></pre>"
        f'<p>Data: <a href="{href(result_file)}">{esc(result_file)}</a> '
        "(netCDF, read it with <code>xarray.open_dataset</code>).</p>"
    )


def _rules(ds: xr.Dataset) -> str:
    """The path rules of a result, in a few words."""
    a = ds.attrs
    return f"attention {a.get('path_attention', '?')}, norm {a.get('path_norm', '?')}"


def path_rules(ds: xr.Dataset) -> str:
    """How the paths of a result were evaluated (plain text)."""
    a = ds.attrs
    if str(a.get("sub_path")) == "True":
        return (
            "each path's term of the exact decomposition: the full model's attention, "
            "LayerNorm frozen at the full model's statistics, the terms summed (--sub-path)"
        )
    attention = (
        "its attention recomputed from the path's own state (the paper's rule)"
        if a.get("path_attention") == "own"
        else "the full model's attention (not the paper's rule)"
    )
    norm = (
        "each head layer normalised by a LayerNorm without scale and shift, and one more on "
        "the summed paths (the paper's rule)"
        if a.get("path_norm") == "paper"
        else "each head layer normalised by its trained LayerNorm, nothing on the sum "
        "(not the paper's rule)"
    )
    return f"each path a chain of single heads (--no-sub-path), {attention}; {norm}"


def path_summary(ds: xr.Dataset) -> str:
    """The path figure in words (plain text)."""
    mean = ds.accuracy.mean("repeat").values
    best = int(np.argmax(mean))
    mode = path_rules(ds)
    return (
        f"The trained network reaches {float(ds.full_accuracy):.3f} accuracy on "
        f"{ds.attrs.get('eval_set', 'the evaluation set')}; predicting the most frequent "
        f"label per position gives {float(ds.baseline_position):.3f}, the most frequent "
        f"label overall {float(ds.baseline_majority):.3f}. Restricted to "
        f"{ds.attrs.get('n_paths', '?')} random paths of one length ({mode}), accuracy is "
        f"highest at path length {best} ({mean[best]:.3f}) and is "
        f"{mean[-1]:.3f} at the full length {int(ds.path_length[-1])}."
    )


def _path_table(ds: xr.Dataset) -> str:
    rows = []
    for k in ds.path_length.values:
        acc = ds.accuracy.sel(path_length=k)
        cells = "".join(f'<td class="num">{fmt(float(a))}</td>' for a in acc.values)
        rows.append(
            f'<tr><td class="num">{int(k)}</td>'
            f"{stat_cell(float(acc.mean()), float(acc.std()))}{cells}</tr>"
        )
    reps = "".join(f'<th class="num">repeat {int(r)}</th>' for r in ds.repeat.values)
    return (
        '<div class="table-scroll"><table><thead><tr><th class="num">path length</th>'
        f'<th class="num">mean ± std</th>{reps}</tr></thead><tbody>{"".join(rows)}</tbody>'
        "</table></div>"
    )


def _paths_list(ds: xr.Dataset) -> str:
    rows = []
    for k in ds.path_length.values:
        for r in ds.repeat.values:
            drawn = ", ".join(map(str, ds.paths.sel(path_length=k, repeat=r).values))
            rows.append(
                f"<tr><td>{int(k)}</td><td>{int(r)}</td><td><code>{esc(drawn)}</code></td></tr>"
            )
    return (
        '<div class="table-scroll"><table><thead><tr><th>length</th><th>repeat</th>'
        f"<th>paths (one step per layer: s = skip, n = head n)</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _path_results(ds: xr.Dataset, figure: Figures) -> str:
    main = figure(
        figs.path_accuracy(ds),
        f"Accuracy of the network restricted to the sum of {esc(ds.attrs.get('n_paths'))} "
        "uniform random paths of each length (length = number of heads a path goes "
        f"through); mean ± std over {ds.sizes['repeat']} draws. Horizontal lines: the full "
        "model and the input-blind baselines, measured on the same evaluation set.",
        "accuracy against path length",
    )
    loss = figure(figs.training_loss(ds), "Mean training loss per epoch (cross-entropy).",
                  "training loss against epoch")  # fmt: skip
    return (
        f'<section id="results"><h2>Accuracy against path length</h2>{main}'
        f"{numbers(_path_table(ds), 'Numbers behind the path figure')}"
        f"{numbers(_paths_list(ds), 'The paths drawn')}"
        f"<h2>Training</h2>{loss}</section>"
    )


def deviations(ds: xr.Dataset) -> list[str]:
    """The ways the run differs from the paper's, from attrs["deviations"]."""
    try:
        lines = json.loads(str(ds.attrs.get("deviations", "[]")))
    except ValueError:
        return [str(ds.attrs["deviations"])]
    return [str(line) for line in lines] if isinstance(lines, list) else [str(lines)]


def _deviations_section(ds: xr.Dataset) -> str:
    lines = deviations(ds)
    if not lines:
        body = "<p>None: this run used the paper's settings.</p>"
    else:
        items = "".join(f"<li>{esc_code(line)}</li>" for line in lines)
        body = f"<p>This run differs from the paper's in {len(lines)} ways:</p><ul>{items}</ul>"
    return f'<section id="deviations"><h2>Differences from the paper\'s run</h2>{body}</section>'


def first_below(r: np.ndarray, threshold: float) -> int | None:
    """The first step whose relative residual is below ``threshold`` (None: never)."""
    hits = np.flatnonzero(np.nan_to_num(r, nan=0.0) < threshold)
    return int(hits[0]) if hits.size else None


def circle_summary(ds: xr.Dataset, threshold: float = 1e-3) -> str:
    parts = []
    for h in ds.hidden.values:
        for v in ds.variant.values:
            r = ds.relative_residual.sel(hidden=h, variant=v).values
            step = first_below(r, threshold)
            when = (
                f"falls under {threshold:g} at step {step}"
                if step is not None
                else (f"stays above {threshold:g}")
            )
            parts.append(f"hidden {int(h)}, {v} {when} and ends at {r[-1]:.3g}")
    return (
        f"Each network was trained to move two points one step along two arcs of a "
        f"circle, then applied to its own output for {int(ds.step[-1])} steps from the "
        "start points. A relative residual near 0 means the two points have merged "
        f"(rank collapse of the 2-token matrix): {'; '.join(parts)}. "
        f"Networks: {ds.attrs.get('variants', '')}."
    )


def _circle_table(ds: xr.Dataset) -> str:
    steps = ds.step.values
    shown = sorted({int(s) for s in np.linspace(0, steps[-1], 7).round()})
    head = "".join(f'<th class="num">step {s}</th>' for s in shown)
    r = ds.relative_residual
    rows = "".join(
        f'<tr><td class="num">{int(h)}</td><td>{esc(v)}</td>'
        + "".join(
            f'<td class="num">{fmt(float(r.sel(hidden=h, variant=v, step=s)))}</td>' for s in shown
        )
        + "</tr>"
        for h in ds.hidden.values
        for v in ds.variant.values
    )
    return (
        '<div class="table-scroll"><table><thead><tr><th class="num">hidden</th>'
        f"<th>variant</th>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _circle_results(ds: xr.Dataset, figure: Figures) -> str:
    skip_words = (
        "the points drawn for SAN+skip are f(s), the network's output, while the state "
        "runs as s <- s + f(s), as in the paper's figure"
        if ds.attrs.get("setup") == "paper"
        else "each network's output is its next input"
    )
    traj = figure(
        figs.trajectories(ds),
        "Trajectories of the two points under recurrent application of each trained "
        "network, one row per hidden size (grey: the circle of the training data; circle "
        f"marker: start, cross: end); {esc(skip_words)}. Networks: "
        f"{esc(ds.attrs.get('variants', ''))}.",
        "trajectories of the two points for each variant",
    )
    rank = figure(
        figs.circle_residual(ds),
        "Relative residual ‖X − 1 x̄ᵀ‖₁,∞ / ‖X‖₁,∞ of the 2 × 2 matrix of the points "
        "at each step, solid for the first hidden size, dashed for the next (log axis, "
        "clipped at float32 epsilon, 1.2e-7: the networks run in float32, so smaller values "
        "are rounding).",
        "relative residual against step",
    )
    loss = figure(figs.training_loss(ds),
                  "Training loss per epoch (squared error summed over the batch, per sequence).",
                  "training loss against epoch")  # fmt: skip
    return (
        f'<section id="results"><h2>Trajectories</h2>{traj}<h2>Rank of the points</h2>{rank}'
        f"{numbers(_circle_table(ds), 'Relative residual at selected steps')}"
        f"<h2>Training</h2>{loss}</section>"
    )


def render_toy(ds: xr.Dataset, result_file: str | None = None) -> str:
    """The HTML report of a toy Dataset; ``result_file`` is the .nc saved beside it."""
    result_file = result_file or f"{toy_name(ds)}.nc"
    task = str(ds.attrs.get("task", "?"))
    title = f"Trained toy network: {task}"
    figure = Figures()
    if task == "circle":
        story, results = circle_summary(ds), _circle_results(ds, figure)
    else:
        story, results = path_summary(ds), _path_results(ds, figure)
    summary = (
        f'<section id="summary"><h2>Summary</h2><p>Task: {esc(_TASK_WORDS.get(task, task))}.</p>'
        f'<p class="summary">{esc(story)}</p>{_reproduce(ds, result_file)}</section>'
    )
    details = f'<section id="provenance"><h2>Provenance</h2>{provenance_table(ds)}</section>'
    body = "\n".join(
        [_header(ds, title, result_file), summary, results, _deviations_section(ds), details]
    )
    return page(title, body, metadata(ds, result_file))
