"""The attention page's MiniLM table and figures: sinks, entropy, spectrum, massive activations
and anisotropy per layer.

    python docs/data/attention_minilm.py                  # run the analysis, write it all
    python docs/data/attention_minilm.py --from RESULT.nc # from an existing result

Runs what ``probe attention minilm`` runs (pretrained and random init, 32 sequences of 128
tokens of the built-in text, seed 0, float32, eps 0.3), keeps the result in ``--out``
(reused when it is there), writes the per-layer table, with the machine and versions it ran
on, to ``docs/data/attention_minilm.md`` (``docs/attention.md`` includes it), and draws
``probe.figures.plot_attention``'s heatmaps (attention to the first token and attention entropy over
layer x head) to ``docs/attention-minilm.png`` and the massive ratio and anisotropy per
layer to ``docs/attention-minilm-massive.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import kept, note  # noqa: E402  (sibling scripts)

SEQUENCES, TOKENS, EPSILON = 32, 128, 0.3
COMMAND = "python docs/data/attention_minilm.py"
DETAILS = f"`probe attention minilm`, {SEQUENCES} sequences x {TOKENS} tokens, seed 0, float32"


def run() -> xr.Dataset:
    """The result of ``probe attention minilm`` (both inits) at these sizes."""
    import probe

    return probe.attention(
        "minilm", probe.Inputs(sequences=SEQUENCES, tokens=TOKENS), epsilon=EPSILON
    )


def markdown_table(ds: xr.Dataset) -> str:
    """One row per layer: the pretrained model's mean and largest sink score over heads, its
    mean entropy, gap and stable rank over heads, its massive ratio (with the token and the
    hidden dimension of the largest entry) and anisotropy; then the random init's mean sink
    score, massive ratio and anisotropy.  A dash: layer 0 (the embeddings) has no attention."""
    head = [
        "layer",
        "pretrained: mean sink score",
        "max",
        "mean entropy (nats)",
        "mean gap",
        "mean stable rank",
        "massive ratio (token, dim)",
        "anisotropy",
        "random: mean sink",
        "random: massive ratio",
        "random: anisotropy",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    trained, random = ds.sel(init="pretrained"), ds.sel(init="random")

    def over_heads(one: xr.Dataset, name: str, layer: int, how, spec: str) -> str:
        values = one[name].sel(layer=layer).values
        return "-" if not np.isfinite(values).any() else format(float(how(values)), spec)

    for layer in ds.layer.values:
        at = trained.sel(layer=layer)
        cells = [
            str(int(layer)),
            over_heads(trained, "sink_score", layer, np.mean, ".3f"),
            over_heads(trained, "sink_score", layer, np.max, ".3f"),
            over_heads(trained, "attention_entropy", layer, np.mean, ".2f"),
            over_heads(trained, "attention_gap", layer, np.mean, ".2f"),
            over_heads(trained, "attention_stable_rank", layer, np.mean, ".2f"),
            f"{float(at['massive_ratio']):.1f} ({int(at['massive_token'])}, "
            f"{int(at['massive_dim'])})",
            f"{float(at['anisotropy']):.3f}",
            over_heads(random, "sink_score", layer, np.mean, ".3f"),
            f"{float(random['massive_ratio'].sel(layer=layer)):.1f}",
            f"{float(random['anisotropy'].sel(layer=layer)):.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    from probe.figures.plot_attention import heatmaps, massive

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="result", type=Path, help="an attention result (.nc)")
    parser.add_argument("--out", type=Path, default=Path("probe-reports/attention-minilm"))
    parser.add_argument("--table", type=Path, default=HERE / "attention_minilm.md")
    args = parser.parse_args()
    if args.result is not None:
        ds = xr.load_dataset(args.result)
    else:
        ds = kept(args.out / "minilm.nc", run, "minilm")
    table = markdown_table(ds)
    args.table.write_text(note(COMMAND, [ds], DETAILS) + table + "\n", encoding="utf-8")
    print(table)
    heatmaps(ds).savefig(HERE.parent / "attention-minilm.png", dpi=80)
    massive(ds).savefig(HERE.parent / "attention-minilm-massive.png", dpi=80)


if __name__ == "__main__":
    main()
