"""Figures and tables of the attention analysis: pure functions of its Dataset.

* :func:`heatmaps` — layer x head maps of ``sink_score`` and ``attention_entropy``, one row
  per init;
* :func:`massive` — ``massive_ratio`` per layer (log axis) beside ``anisotropy`` per layer;
* :func:`sinks` — the heads whose ``sink_score`` or ``top_key_score`` exceeds eps, with the
  tokens at their top key position (what Clark et al. read as [CLS] and [SEP]).

Like ``probe.figures.plot`` nothing here does I/O or touches pyplot; ``ds.probe.plot()`` of an
attention result is :func:`heatmaps`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from probe.figures.plot import log_axis, plain, styled
from probe.figures.plot_paths import init_colour
from probe.measures.stats import ordered
from probe.names import INITS


def heatmaps(ds: xr.Dataset) -> Figure:
    """sink_score (0..1) and attention_entropy (nats) over layer 1..L x head, per init."""
    inits = ordered(ds.init.values, INITS)
    layers = ds.layer.values[1:]
    with styled():
        fig = Figure(figsize=(10.0, 0.4 + 3.2 * len(inits)), layout="constrained")
        axes = np.atleast_2d(fig.subplots(len(inits), 2, squeeze=False))
        for row, init in enumerate(inits):
            one = ds.sel(init=init, layer=layers)
            for col, (name, label, cmap, top) in enumerate(
                (
                    ("sink_score", "attention to the first token", "viridis", 1.0),
                    ("attention_entropy", "attention entropy (nats)", "magma", None),
                )
            ):
                ax = axes[row, col]
                values = one[name].values.astype(float)  # (layer, head)
                image = ax.imshow(values, aspect="auto", cmap=cmap, vmin=0, vmax=top,
                                  origin="lower")  # fmt: skip
                ax.set_yticks(range(len(layers)), [str(int(x)) for x in layers])
                ax.set_xlabel("head")
                ax.set_ylabel("layer")
                ax.set_title(f"{plain(str(ds.attrs.get('model', '')))} · {init} · {label}")
                ax.grid(False)
                fig.colorbar(image, ax=ax)
    return fig


def massive(ds: xr.Dataset) -> Figure:
    """massive_ratio per layer (log axis) and anisotropy per layer, one line per init."""
    inits = ordered(ds.init.values, INITS)
    with styled():
        fig = Figure(figsize=(10.0, 3.8), layout="constrained")
        left, right = fig.subplots(1, 2)
        for init in inits:
            one = ds.sel(init=init)
            c = init_colour(init)
            left.plot(ds.layer, one["massive_ratio"], "o-", color=c, label=init)
            right.plot(ds.layer, one["anisotropy"], "o-", color=c, label=init)
        log_axis(left)
        left.set_title("largest |entry| / median |entry| of the layer output")
        right.set_title("mean cosine between tokens of different sequences")
        for ax in (left, right):
            ax.set_xlabel("layer (0 = embeddings' output)")
            ax.legend()
        left.set_ylabel("massive ratio")
        right.set_ylabel("anisotropy")
    return fig


def position_tokens(ds: xr.Dataset, position: int, most: int = 3) -> str:
    """The commonest token strings at ``position`` over the sequences, e.g. "'the' x3, '.' x1"."""
    if position < 0 or position >= ds.sizes["token"]:
        return ""
    texts = [str(t) for t in ds["token_text"].sel(token=position).values if str(t)]
    if not texts:
        ids = [int(i) for i in ds["input_ids"].sel(token=position).values if int(i) >= 0]
        texts = [f"id {i}" for i in ids]
    common = Counter(texts).most_common(most)
    return ", ".join(f"{text!r} x{n}" for text, n in common)


def sinks(ds: xr.Dataset, init: str, epsilon: float | None = None) -> list[dict]:
    """The (layer, head) pairs whose top key receives more than eps of the attention, strongest
    first: layer, head, top key position, its score, the sink score and the tokens there."""
    eps = float(ds.attrs.get("epsilon", 0.3)) if epsilon is None else epsilon
    one = ds.sel(init=init)
    rows = []
    for layer in ds.layer.values[1:]:
        for head in ds["head"].values:
            score = float(one["top_key_score"].sel(layer=layer, head=head))
            if not np.isfinite(score) or score <= eps:
                continue
            key = int(one["top_key"].sel(layer=layer, head=head))
            rows.append(
                {
                    "layer": int(layer),
                    "head": int(head),
                    "top_key": key,
                    "top_key_score": score,
                    "sink_score": float(one["sink_score"].sel(layer=layer, head=head)),
                    "tokens": position_tokens(ds, key),
                }
            )
    return sorted(rows, key=lambda r: -r["top_key_score"])


def sink_positions(ds: xr.Dataset, init: str) -> list[tuple[int, int, str]]:
    """(position, heads whose top key it is, tokens there), commonest first."""
    counts = Counter(int(k) for k in ds["top_key"].sel(init=init).values[1:].ravel())
    return [(pos, n, position_tokens(ds, pos)) for pos, n in counts.most_common()]
