"""The collapse page's branch-scale table: Noci et al.'s 1/sqrt(L) scaling at random init.

    python docs/data/branch_scale.py

Runs, for GPT-2, BERT and the Llama-3.2-1B config narrowed to width 512 (vocabulary 1000),
each at depths 4 and 24, ``probe collapse MODEL --init random --variants transformer
--metrics relative-residual,cosine-similarity --sequences 4 --tokens 32`` without scaling and
with ``--branch-scale '1/sqrt(L)'`` (seed 0, float32, uniform random token ids), and writes, to
``docs/data/branch_scale.md`` (``docs/collapse.md`` includes it), the mean relative residual
and the mean token cosine over sequences after the last layer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import note  # noqa: E402  (sibling scripts)

LLAMA_512 = {
    "hidden_size": 512,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 1000,
}
#: (label, model, the config key of its depth, other config values)
MODELS = (
    ("`gpt2`", "gpt2", "n_layer", {}),
    ("`bert-base-uncased`", "bert-base-uncased", "num_hidden_layers", {}),
    ("`meta-llama/Llama-3.2-1B`, width 512", "meta-llama/Llama-3.2-1B", "num_hidden_layers",
     LLAMA_512),
)  # fmt: skip
DEPTHS = (4, 24)
SCALES = ("1", "1/sqrt(L)")


def run(model: str, depth_key: str, depth: int, config: dict, scale: str) -> xr.Dataset:
    from probe import Inputs, Model
    from probe.analyses import collapse

    return collapse.run(
        Model(model, init="random", config={depth_key: depth, **config}),
        Inputs(sequences=4, tokens=32),
        variants="transformer",
        metrics="relative-residual,cosine-similarity",
        branch_scale=scale,
    )


def last(ds: xr.Dataset, name: str) -> float:
    from probe.measures.stats import stats

    return float(stats(ds, name)["mean"].sel(variant="transformer", init="random").isel(layer=-1))


def markdown_table(results: dict) -> str:
    """``results``: {(label, depth, scale): Dataset}."""
    from probe.measures.stats import shown

    lines = [
        "| model (random init) | L | residual, alpha = 1 | residual, 1/sqrt(L) | cosine, alpha "
        "= 1 | cosine, 1/sqrt(L) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, *_ in MODELS:
        for depth in DEPTHS:
            runs = [results[label, depth, scale] for scale in SCALES]
            cells = [shown(last(ds, "relative_residual"), ds) for ds in runs]
            cells += [f"{last(ds, 'cosine_similarity'):.3f}" for ds in runs]
            lines.append(f"| {label} | {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    results = {
        (label, depth, scale): run(model, key, depth, config, scale)
        for label, model, key, config in MODELS
        for depth in DEPTHS
        for scale in SCALES
    }
    table = markdown_table(results)
    details = "4 sequences x 32 uniform random token ids, seed 0, float32, the transformer variant"
    (HERE / "branch_scale.md").write_text(
        note("python docs/data/branch_scale.py", list(results.values()), details) + table + "\n",
        encoding="utf-8",
    )
    print(table)


if __name__ == "__main__":
    main()
