"""The sink rate and the massive ratio at random init, for every config of the cross-family table.

    python docs/data/attention_random.py                   # run every model, write the table
    python docs/data/attention_random.py --models gpt2 bert-base-uncased
    python docs/data/attention_random.py --from RESULT.nc ...   # tabulate existing results

Runs, per model of ``docs/data/cross_family.py``'s list, what ``probe attention MODEL
--init random --sequences 4 --tokens 64`` runs (seed 0, float32, eps 0.3; random token ids
for configs without a tokenizer, seeded noise images for ViT, whose image size fixes its
tokens), at 64 tokens as Gu et al. (2025) measure the sink rate.  It keeps each result in
``--out`` (a result already there is reused, so an interrupted run picks up where it
stopped) and writes the table, with the machine and versions it ran on, as Markdown to
``docs/data/attention_random.md``; ``docs/attention.md`` includes it.  Per model: the sink
rate Sink_0.3, the mean and the largest sink score over (layer, head), the sink score that
uniform attention gives (1/T for an encoder, H_T / T for a causal model), and the massive
ratio's smallest and largest value over the layers' outputs (layer 0, the embeddings,
included) with the layer of the largest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import xarray as xr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import note, per_model, per_model_arguments  # noqa: E402  (sibling scripts)
from cross_family import MODELS  # noqa: E402

SEQUENCES, TOKENS = 4, 64


def run_model(name: str, sequences: int = SEQUENCES, tokens: int = TOKENS) -> xr.Dataset:
    """The result of ``probe attention NAME --init random`` at these sizes."""
    from probe import Inputs, Model
    from probe.analyses import attention

    return attention.run(Model(name, init="random"), Inputs(sequences=sequences, tokens=tokens))


def uniform_sink(tokens: int, causal: bool) -> float:
    """The sink score of uniform attention over ``tokens`` real tokens: 1/T for an encoder;
    for a causal model the mean over rows i of 1/(i + 1), H_T / T."""
    if not causal:
        return 1 / tokens
    return float(np.sum(1 / np.arange(1, tokens + 1))) / tokens


def markdown_table(datasets: list[xr.Dataset]) -> str:
    head = [
        "model",
        "family",
        "layers x heads",
        "tokens",
        "sink rate",
        "mean sink score",
        "max sink score",
        "uniform",
        "massive ratio, min-max over layers",
        "layer of max",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ds in datasets:
        ds = ds.sel(init="random")
        tokens = int(ds["input_ids"].shape[1])
        causal = bool(ds.attrs["causal"])
        score = ds["sink_score"].sel(layer=ds.layer[1:]).values
        ratio = ds["massive_ratio"].values
        attended = np.isfinite(score).any()
        cells = [
            ds.attrs["model"],
            ds.attrs.get("family", ""),
            f"{ds.sizes['layer'] - 1} x {ds.sizes['head']}",
            str(tokens),
            f"{float(ds['sink_rate']):.3g}" if attended else "— (no T x T attention)",
            f"{np.nanmean(score):.3f}" if attended else "—",
            f"{np.nanmax(score):.3f}" if attended else "—",
            f"{uniform_sink(tokens, causal):.3f}" if attended else "—",
            f"{ratio.min():.1f}-{ratio.max():.1f}",
            str(int(ratio.argmax())),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = per_model_arguments(
        __doc__, MODELS, Path("probe-reports/attention-random"), HERE / "attention_random.md"
    )
    args = parser.parse_args()
    datasets = per_model(args, run_model)
    table = markdown_table(datasets)
    text = note(
        "python docs/data/attention_random.py",
        datasets,
        f"{SEQUENCES} sequences x {TOKENS} tokens, seed 0, float32, eps 0.3",
    )
    args.table.write_text(text + table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
