"""The median distances from rank one along sampled attention paths (docs/paths.md).

    python docs/data/paths_sample.py

Runs what ``probe paths --sample bert-base-cased --init random --samples 100 --sequences 32
--tokens 128`` and ``probe paths --sample minilm --init pretrained --samples 100
--sequences 32`` run (seed 0, float32), and writes, per model and fit, the median distance
from rank one at each depth d = 1..6 and the fitted order (l1inf norm, the earliest layer
on the left, as the paper's notebook multiplies) to ``docs/data/paths_sample.md``, which
``docs/paths.md`` includes.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = (
    ("bert-base-cased", "random", "bert-base-cased, random init"),
    ("minilm", "pretrained", "MiniLM, pretrained"),
)
FITS = (("svd", "best rank-one (SVD)"), ("mean", "mean row"))
DEPTHS = 6


def table(results) -> str:
    from probe.figures.plot_paths import fit_decay

    head = ["model", "distance to", *(f"d={d}" for d in range(1, DEPTHS + 1)), "fitted order"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (DEPTHS + 1)]
    for (_, init, label), ds in zip(RUNS, results, strict=True):
        for i, (fit, words) in enumerate(FITS):
            fits = fit_decay(ds, fit=fit, order="earliest-left")
            medians = [float(fits["median"].sel(init=init, depth=d)) for d in range(1, DEPTHS + 1)]
            cells = [label if i == 0 else "", words, *(f"{m:.2g}" for m in medians)]
            cells.append(f"{float(fits['order'].sel(init=init)):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    import os
    import platform
    from importlib import metadata

    from probe import Inputs, Model
    from probe.analyses import paths

    results = [
        paths.sample(Model(name, init=init), Inputs(sequences=32, tokens=128), samples=100)
        for name, init, _ in RUNS
    ]
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("torch", "transformers"))
    text = (
        f"*Measured on {platform.machine()}, {os.cpu_count()} cores, {versions}, by "
        "`python docs/data/paths_sample.py`.*\n\n" + table(results) + "\n"
    )
    (HERE / "paths_sample.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
