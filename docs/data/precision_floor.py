"""The precision floor: where a float32 or bfloat16 run stops agreeing with float64.

    python docs/data/precision_floor.py

Runs ``probe collapse MODEL --metrics relative-residual --sequences 4 --tokens 32`` (all
four variants, seed 0) for six models in float32, in bfloat16 and in float64, on the same
weights and inputs, and writes, to ``docs/data/precision_floor.md`` (``docs/float64.md``
includes it), the largest absolute difference of each low-precision relative residual from
the float64 one, over every variant, layer, sequence, fit and norm, in units of the dtype's
machine epsilon.  ``probe.measures.stats.FLOOR_FACTOR`` (10 epsilons) lies above every one of them:
under it a value is the dtype's rounding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import note  # noqa: E402  (sibling scripts)

LLAMA_SMALL = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
}
#: (model, init, config values)
CASES = (
    ("minilm", "pretrained", None),
    ("minilm", "random", None),
    ("gpt2-tiny", "pretrained", None),
    ("bert-base-uncased", "random", {"num_hidden_layers": 6}),
    ("gpt2", "random", {"n_layer": 6}),
    ("meta-llama/Llama-3.2-1B", "random", LLAMA_SMALL),
)
LOW = ("float32", "bfloat16")


def run(model: str, init: str, config: dict | None, dtype: str) -> xr.Dataset:
    from probe import Inputs, Model
    from probe.analyses import collapse

    return collapse.run(
        Model(model, init=init, dtype=dtype, config=config),
        Inputs(sequences=4, tokens=32),
        metrics="relative-residual",
    )


def deviation(low: xr.Dataset, exact: xr.Dataset) -> float:
    """The largest |r_low - r_float64| over every entry both runs hold."""
    a, b = low["relative_residual"].values, exact["relative_residual"].values
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[both] - b[both]).max())


def markdown_table(results: dict) -> str:
    """``results``: {(model, init, dtype): Dataset} for every case and dtype."""
    from probe.measures.stats import dtype_eps, short

    head = ["model", "init", "smallest float64 r"]
    head += [f"{dtype}: largest difference (epsilons)" for dtype in LOW]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for model, init, _ in CASES:
        exact = results[model, init, "float64"]
        cells = [model, init, short(float(exact["relative_residual"].min()))]
        for dtype in LOW:
            found = deviation(results[model, init, dtype], exact)
            cells.append(f"{short(found)} ({found / dtype_eps(dtype):.1f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    results = {
        (model, init, dtype): run(model, init, config, dtype)
        for model, init, config in CASES
        for dtype in (*LOW, "float64")
    }
    table = markdown_table(results)
    details = "4 sequences x 32 tokens, seed 0, every variant"
    (HERE / "precision_floor.md").write_text(
        note("python docs/data/precision_floor.py", list(results.values()), details) + table + "\n",
        encoding="utf-8",
    )
    print(table)


if __name__ == "__main__":
    main()
