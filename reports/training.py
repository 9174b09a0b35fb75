"""The training report: loss against step and against wall time, for every model trained together.

Input is the Dataset of ``probe.fastformer.train.curves`` (dims ``model``,
``step``, ``evaluation``); output one self-contained page, like the other
reports.  Losses are shown in bits per character (nats / ln 2): the training
loss per step, thin, with its moving average, and the held-out validation
bits per character as markers.
"""

from __future__ import annotations

import json
import math

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from .figures import Figures, numbers
from .page import esc, href, page
from .provenance import provenance_table
from .reproduce import command_line

COLOURS = ("#0b5cad", "#c2410c", "#15803d", "#7e22ce")
WINDOW = 25  # steps in the moving average of the training loss


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    kept = values[np.isfinite(values)]
    if len(kept) < window:
        return kept
    kernel = np.ones(window) / window
    return np.convolve(kept, kernel, mode="valid")


def curve_figure(ds: xr.Dataset, x: str) -> Figure:
    """Training and validation bits/char against ``x``: "step" or "seconds"."""
    fig = Figure(figsize=(7.2, 4.0))
    ax = fig.add_subplot()
    for i, model in enumerate(ds.model.values):
        colour = COLOURS[i % len(COLOURS)]
        row = ds.sel(model=model)
        bits = row.train_loss.values / math.log(2)
        xs = row.step.values if x == "step" else row.seconds.values
        keep = np.isfinite(bits)
        ax.plot(xs[keep], bits[keep], color=colour, alpha=0.25, linewidth=0.8)
        smooth = _moving_average(bits, WINDOW)
        if len(smooth) < keep.sum():
            ax.plot(
                xs[keep][WINDOW - 1 :], smooth, color=colour, linewidth=1.6, label=f"{model} train"
            )
        ex = row.eval_step.values if x == "step" else row.eval_seconds.values
        ev = row.val_bits_per_char.values
        ax.plot(ex, ev, "o--", color=colour, markersize=4, label=f"{model} validation")
    # The first steps start far above the rest (up to ~log2 of the logits' spread):
    # the axis shows the validation range and a margin, where the comparison is.
    valid = ds.val_bits_per_char.values[np.isfinite(ds.val_bits_per_char.values)]
    if valid.size:
        ax.set_ylim(valid.min() - 0.25, valid.max() + 0.75)
    ax.set_xlabel("step" if x == "step" else "wall time (s)")
    ax.set_ylabel("bits per character")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return fig


def evaluations_table(ds: xr.Dataset) -> str:
    head = "<th>model</th><th>step</th><th>wall time (s)</th><th>validation bits/char</th>"
    rows = []
    for model in ds.model.values:
        row = ds.sel(model=model)
        for step, seconds, bits in zip(
            row.eval_step.values, row.eval_seconds.values, row.val_bits_per_char.values, strict=True
        ):
            if np.isfinite(bits):
                rows.append(
                    f"<tr><td>{esc(model)}</td><td>{int(step)}</td><td>{seconds:.1f}</td>"
                    f"<td>{bits:.4f}</td></tr>"
                )
    return (
        '<div class="table-scroll"><table><thead><tr>'
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def finals(ds: xr.Dataset) -> list[tuple[str, float, int]]:
    """(model, final validation bits per character, parameters) per model.  Results written
    before these were variables kept them as JSON attributes: read those instead."""
    if "final_val_bits_per_char" in ds.data_vars:
        return [
            (str(m), float(bits), int(params))
            for m, bits, params in zip(
                ds.model.values,
                ds["final_val_bits_per_char"].values,
                ds["parameters"].values,
                strict=True,
            )
        ]
    bits = json.loads(ds.attrs.get("final_val_bits_per_char", "{}"))
    params = json.loads(ds.attrs.get("parameters", "{}"))
    return [(m, bits[m], params.get(m, 0)) for m in bits]


def render_training(ds: xr.Dataset, result_file: str | None = None) -> str:
    """The HTML page of a training Dataset (pure: no I/O)."""
    result_file = result_file or "training.nc"
    title = f"Training: {' vs '.join(str(m) for m in ds.model.values)}"
    summary = "; ".join(
        f"{esc(m)}: {bits:.3f} bits/char ({params:,} parameters)" for m, bits, params in finals(ds)
    )
    figures = Figures()
    body = (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">{esc(ds.attrs.get("text_source", ""))} · '
        f"sha256 {esc(str(ds.attrs.get('text_sha256', ''))[:16])}…</p>"
        f'<nav class="toc"><a href="#summary">summary</a><a href="#curves">curves</a>'
        f'<a href="#provenance">provenance</a>'
        f'<a href="{href(result_file)}">data ({esc(result_file)})</a></nav></header>'
        f'<h2 id="summary">Summary</h2><p class="summary">Final validation bits per character '
        f"on the held-out split: {summary}. Same data, split, tokenizer, batches, steps and "
        f"learning-rate schedule for every model.</p>"
        f"<p>Reproduce with <code>{esc(command_line(ds.attrs))}</code></p>"
        f'<h2 id="curves">Curves</h2>'
        + figures(
            curve_figure(ds, "step"),
            "Bits per character against optimizer step: training loss (thin: per step, thick: "
            f"{WINDOW}-step moving average) and held-out validation (markers).",
            "bits per character against step",
        )
        + figures(
            curve_figure(ds, "seconds"),
            "The same curves against wall time: what each model costs on this machine.",
            "bits per character against wall time",
        )
        + numbers(evaluations_table(ds), "validation evaluations")
        + f'<h2 id="provenance">Provenance</h2>{provenance_table(ds)}'
    )
    meta = {
        "model": ds.attrs.get("model", ""),
        "analysis": "training",
        "family": "fastformer",
        "variants": "",
        "init": "trained",
        "created": ds.attrs.get("created", ""),
        "result": result_file,
    }
    return page(title, f"<main>{body}</main>", meta)
