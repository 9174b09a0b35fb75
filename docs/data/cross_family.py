"""The collapse table across families at random init, and its figure.

    python docs/data/cross_family.py                   # run every model, write the table
    python docs/data/cross_family.py --models gpt2 bert-base-uncased
    python docs/data/cross_family.py --from RESULT.nc ...   # tabulate existing results

Runs, per model, what ``probe collapse MODEL --init random --sequences 8 --tokens 128``
runs (seed 0, float32, the default metrics; random token ids for configs without a
tokenizer, seeded noise images for ViT), keeps each result in ``--out``, and writes the
table of ``probe compare`` (per model: r after the last layer for each variant, the first
layer where the SAN falls below 1e-3, the SAN's fitted order) as Markdown to
``docs/data/cross_family.md``, with the machine and versions it ran on, and draws
``probe.figures.plot.across_models`` (one panel per variant, one line per model) to
``docs/cross-family.png``.  A result already in ``--out`` is reused, so an interrupted
run picks up where it stopped.  ``docs/collapse.md`` includes the table.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr
from common import note, per_model, per_model_arguments

from probe.figures.plot import across_models
from probe.measures.stats import comparison_rows
from probe.names import VARIANTS

HERE = Path(__file__).resolve().parent

#: Every shipped config that fits a 24 GiB machine at 8 x 128 in float32, in table order.
MODELS = (
    "bert-base-uncased",
    "albert-base-v2",
    "xlnet-base-cased",
    "FacebookAI/roberta-base",
    "distilbert/distilbert-base-uncased",
    "google/electra-base-discriminator",
    "microsoft/deberta-v3-base",
    "answerdotai/ModernBERT-base",
    "google-t5/t5-base",
    "google/vit-base-patch16-224",
    "gpt2",
    "facebook/opt-125m",
    "EleutherAI/pythia-160m",
    "EleutherAI/pythia-1.4b",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen3-0.6B",
    "meta-llama/Llama-3.2-1B",
)
SEQUENCES, TOKENS = 8, 128


def run_model(name: str, sequences: int = SEQUENCES, tokens: int = TOKENS) -> xr.Dataset:
    """The collapse result of ``probe collapse NAME --init random`` at these sizes."""
    from probe import Inputs, Model
    from probe.analyses import collapse

    return collapse.run(Model(name, init="random"), Inputs(sequences=sequences, tokens=tokens))


def markdown_table(datasets: list[xr.Dataset], threshold: float = 1e-3) -> str:
    rows = comparison_rows(datasets, threshold)
    variants = [v for v in VARIANTS if any(v in row["final"] for row in rows)]
    head = ["model", "family", "layers", *(f"r_L {v}" for v in variants)]
    head += [f"SAN < {threshold:g} at layer", "SAN order"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"], row["family"], str(row["layers"])]
        cells += [row["final_text"].get(v, "—") for v in variants]
        cells.append("—" if row["san_below"] is None else str(row["san_below"]))
        order = "—" if row["order"] is None else f"{row['order']:.2f}"
        cells.append(f"{order} ({row['order_note']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = per_model_arguments(
        __doc__, MODELS, Path("probe-reports/cross-family"), HERE / "cross_family.md"
    )
    parser.add_argument("--png", type=Path, default=HERE.parent / "cross-family.png")
    args = parser.parse_args()
    datasets = per_model(args, run_model)
    table = markdown_table(datasets)
    args.table.write_text(note("python docs/data/cross_family.py") + table + "\n", encoding="utf-8")
    print(table)
    across_models(datasets).savefig(args.png, dpi=110)
    print(f"table: {args.table}\nfigure: {args.png}")


if __name__ == "__main__":
    main()
