"""The report of an attention result: sinks, entropy, massive activations, anisotropy.

Same page, meta tags and figure machinery as the other reports.  It names the tokens that
are sinks (the commonest tokens at each head's top key position) and states the family's
attention note (the Fastformer has no T x T attention).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from probe.figures.plot_attention import heatmaps, massive, sink_positions, sinks
from probe.files.results import attrs_id
from probe.measures.stats import ordered
from probe.names import INITS

from .figures import Figures, numbers
from .naming import model_stem
from .page import esc, href, page
from .provenance import provenance_table
from .reproduce import command_line
from .tables import fmt, html_table

#: Key positions shown in a "where the heads look most" table; the rest are folded away.
TOP_POSITIONS = 5


def attention_report_name(ds: xr.Dataset) -> str:
    """E.g. "attention-minilm-pretrained-float32-1a2b3c4d"."""
    parts = ["attention", model_stem(ds.attrs.get("model", "model"))]
    parts += ordered(ds.init.values, INITS)
    if ds.attrs.get("dtype"):
        parts.append(str(ds.attrs["dtype"]))
    parts.append(attrs_id(ds.attrs))  # every other setting, so two runs never share a name
    return "-".join(parts)


def render_attention(ds: xr.Dataset, result_file: str | None = None) -> str:
    result_file = result_file or f"{attention_report_name(ds)}.nc"
    model = str(ds.attrs.get("model", "?"))
    title = f"{model} · attention sinks, massive activations, anisotropy"
    figure = Figures()
    eps = float(ds.attrs.get("epsilon", 0.3))
    inits = ordered(ds.init.values, INITS)
    header = _header(ds, title, result_file)
    summary = _summary(ds, inits, eps)
    body = ""
    if np.isfinite(ds["sink_score"].values).any():
        body += _sinks_section(ds, figure, inits, eps)
    body += _massive_section(ds, figure, inits)
    provenance = f'<section id="provenance"><h2>Provenance</h2>{provenance_table(ds)}</section>'
    meta = {
        "model": model,
        "analysis": "attention",
        "family": str(ds.attrs.get("family", "")),
        "variants": "transformer",
        "init": ",".join(inits),
        "created": str(ds.attrs.get("created", "")),
        "result": result_file,
    }
    return page(title, header + summary + body + provenance, meta)


def _header(ds: xr.Dataset, title: str, result_file: str) -> str:
    return (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">created {esc(ds.attrs.get("created", "?"))} · probe '
        f"{esc(ds.attrs.get('probe_version', '?'))}</p>"
        f'<nav class="toc"><a href="{href(result_file)}">data ({esc(result_file)})</a></nav>'
        f"{_mask_note(ds)}</header>"
    )


def _mask_note(ds: xr.Dataset) -> str:
    """The attention mask the run chose, where it chose one (``probe.surgery.masks``)."""
    note = ds.attrs.get("mask_note")
    return f'<p class="warning">{esc(note)}</p>' if note else ""


def _summary(ds: xr.Dataset, inits: list[str], eps: float) -> str:
    lines = [_summary_line(ds, init, eps) for init in inits]
    return (
        '<section id="summary"><p>Reproduce with:</p>'
        f"<pre><code>{esc(command_line(ds.attrs))}</code></pre>"
        f"<ul>{''.join(lines)}</ul><p>{esc(ds.attrs.get('attention_note', ''))}</p></section>"
    )


def _summary_line(ds: xr.Dataset, init: str, eps: float) -> str:
    """One init's sink rate, largest massive activation and anisotropy, as a list item."""
    one = ds.sel(init=init)
    rate = float(one["sink_rate"])
    peak = int(np.argmax(one["massive_ratio"].values))
    where = (
        f"layer {peak}: token {int(one['massive_token'][peak])} of sequence "
        f"{int(one['massive_sequence'][peak])}, dim {int(one['massive_dim'][peak])}"
    )
    rate_text = "not measured" if not np.isfinite(rate) else f"{rate:.3g}"
    share = float(one["sink_head_share"]) if "sink_head_share" in one else float("nan")
    if np.isfinite(share):
        rate_text += f" (heads whose mean sink score passes it: {fmt(share, 3)})"
    return (
        f"<li><b>{esc(init)}</b>: sink rate Sink<sub>{fmt(eps, 3)}</sub> {rate_text}; "
        f"largest massive ratio {fmt(float(one['massive_ratio'][peak]), 4)} at {esc(where)}; "
        f"anisotropy from {fmt(float(one['anisotropy'][0]), 3)} (layer 0) to "
        f"{fmt(float(one['anisotropy'][-1]), 3)} (layer {int(ds.layer[-1])}).</li>"
    )


def _sinks_section(ds: xr.Dataset, figure: Figures, inits: list[str], eps: float) -> str:
    body = '<section id="sinks"><h2>Attention sinks and entropy</h2>' + figure(
        heatmaps(ds),
        "Left: the attention the first token receives (mean over query rows and sequences; "
        "a row that cannot see it counts 0), per layer and head. Right: the mean entropy of "
        "the attention rows in nats (ln T is uniform attention).",
        "sink score and attention entropy per layer and head",
    )
    for init in inits:
        body += _top_positions(ds, init) + _sink_heads(ds, init, eps)
    return body + "</section>"


def _top_positions(ds: xr.Dataset, init: str) -> str:
    """The key positions the heads look at most: the first few shown, the rest folded."""
    positions = [[str(p), str(n), esc(t)] for p, n, t in sink_positions(ds, init)]
    head = ["top key position", "heads", "tokens there"]
    body = f"<h3>{esc(init)}: where the heads look most</h3>" + html_table(
        head, positions[:TOP_POSITIONS], "attention"
    )
    if len(positions) > TOP_POSITIONS:
        rest = positions[TOP_POSITIONS:]
        body += numbers(
            html_table(head, rest, "attention"),
            f"{init}: the other {len(rest)} positions some head looks at most",
        )
    return body


def _sink_heads(ds: xr.Dataset, init: str, eps: float) -> str:
    rows = sinks(ds, init, eps)
    return numbers(
        html_table(
            ["layer", "head", "top key", "its attention", "sink score", "tokens"],
            [
                [
                    str(r["layer"]),
                    str(r["head"]),
                    str(r["top_key"]),
                    fmt(r["top_key_score"], 3),
                    fmt(r["sink_score"], 3),
                    esc(r["tokens"]),
                ]
                for r in rows
            ],  # fmt: skip
            "attention",
        ),
        f"{init}: the {len(rows)} heads whose top key receives more than {eps:g}",
    )


def _massive_section(ds: xr.Dataset, figure: Figures, inits: list[str]) -> str:
    body = '<section id="massive"><h2>Massive activations and anisotropy</h2>' + figure(
        massive(ds),
        "Left: the mean over sequences of the largest |entry| of each layer's output over the "
        "mean median |entry| (Sun et al. 2024), log axis. Right: the mean cosine between "
        "tokens of different sequences (Ethayarajh 2019); probe collapse's cosine similarity is "
        "the within-sequence one, and its relative residual per layer is in the collapse report.",
        "massive ratio and anisotropy per layer",
    )
    rows = [
        [str(int(layer))]
        + [
            cell
            for init in inits
            for cell in (
                fmt(float(ds["massive_ratio"].sel(init=init, layer=layer)), 4),
                esc(_massive_token(ds, init, int(layer))),
                str(int(ds["massive_dim"].sel(init=init, layer=layer))),
                fmt(float(ds["anisotropy"].sel(init=init, layer=layer)), 3),
            )
        ]
        for layer in ds.layer.values
    ]
    head = ["layer"] + [
        f"{esc(i)} {c}" for i in inits for c in ("massive ratio", "token", "dim", "anisotropy")
    ]
    return (
        body
        + numbers(html_table(head, rows, "attention"), "massive activations per layer")
        + "</section>"
    )


def _massive_token(ds: xr.Dataset, init: str, layer: int) -> str:
    one = ds.sel(init=init, layer=layer)
    seq, tok = int(one["massive_sequence"]), int(one["massive_token"])
    text = str(ds["token_text"].values[seq, tok]) if "token_text" in ds else ""
    return f"{tok} ({text!r})" if text else str(tok)
