"""The attention page's figures: sinks, entropy, massive activations and anisotropy of MiniLM.

    python docs/data/attention_minilm.py                  # run the analysis, draw the figures
    python docs/data/attention_minilm.py --from RESULT.nc # draw them from an existing result

Runs what ``probe attention minilm`` runs (pretrained and random init, 32 sequences of 128
tokens of the built-in text, seed 0, float32, eps 0.3) and draws ``probe.plot_attention``'s
heatmaps (attention to the first token and attention entropy over layer x head) to
``docs/attention-minilm.png`` and the massive ratio and anisotropy per layer to
``docs/attention-minilm-massive.png``.  ``docs/attention.md`` shows both.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import xarray as xr

import probe
from probe.plot_attention import heatmaps, massive

DOCS = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="result", type=Path, help="an attention result (.nc)")
    args = parser.parse_args()
    if args.result is not None:
        ds = xr.load_dataset(args.result)
    else:
        ds = probe.attention("minilm", probe.Inputs(sequences=32, tokens=128), epsilon=0.3)
    heatmaps(ds).savefig(DOCS / "attention-minilm.png", dpi=80)
    massive(ds).savefig(DOCS / "attention-minilm-massive.png", dpi=80)


if __name__ == "__main__":
    main()
