"""The attention page's removals table: MiniLM's relative residual with its sinks or its
massive activations removed.

    python docs/data/removals_minilm.py

Runs what ``probe collapse minilm --init pretrained --variants transformer,no-sink,no-massive
--metrics relative-residual --sequences 8 --tokens 64`` runs (seed 0, float32) and writes, to
``docs/data/removals_minilm.md`` (``docs/attention.md`` includes it), the mean relative
residual over sequences (l1inf, residual to the token mean) after each layer, one row per
variant, and the result's note of what was removed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import note  # noqa: E402  (sibling scripts)

VARIANTS = ("transformer", "no-sink", "no-massive")


def run() -> xr.Dataset:
    from probe import Inputs, Model
    from probe.analyses import collapse

    return collapse.run(
        Model("minilm", init="pretrained"),
        Inputs(sequences=8, tokens=64),
        variants=",".join(VARIANTS),
        metrics="relative-residual",
    )


def markdown_table(ds: xr.Dataset) -> str:
    from probe.measures.stats import shown, stats

    mean = stats(ds)["mean"].sel(init="pretrained")
    layers = [int(layer) for layer in mean.layer.values]
    lines = [
        "| variant | " + " | ".join(str(layer) for layer in layers) + " |",
        "|---|" + "---|" * len(layers),
    ]
    for variant in VARIANTS:
        cells = [shown(float(mean.sel(variant=variant, layer=la)), ds, 4) for la in layers]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\nRemoved: {ds.attrs['removal_note']}."


def main() -> None:
    ds = run()
    table = markdown_table(ds)
    details = "8 sequences x 64 tokens of the built-in text, seed 0, float32"
    (HERE / "removals_minilm.md").write_text(
        note("python docs/data/removals_minilm.py", [ds], details) + table + "\n",
        encoding="utf-8",
    )
    print(table)


if __name__ == "__main__":
    main()
