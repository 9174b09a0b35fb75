"""The README's collapse table across families, and its figure, from collapse results.

    python docs/cross_family.py RESULT.nc ... [--png docs/cross-family.png]

prints the table of `probe compare` (per model: r after the last layer for each
variant, the first layer where SAN falls below 1e-3, the SAN's fitted order) as
Markdown, and draws `probe.plot.across_models` (one panel per variant, one line per
model) to the PNG.  The results come from one `probe collapse MODEL --init random
--sequences 8 --tokens 128` per model; the README says which.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import xarray as xr

from probe.names import VARIANTS
from probe.plot import across_models
from probe.stats import comparison_rows


def markdown_table(datasets: list[xr.Dataset], threshold: float = 1e-3) -> str:
    rows = comparison_rows(datasets, threshold)
    variants = [v for v in VARIANTS if any(v in row["final"] for row in rows)]
    head = ["model", "family", "layers", *(f"r_L {v}" for v in variants)]
    head += [f"SAN < {threshold:g} at layer", "SAN order"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"], row["family"], str(row["layers"])]
        cells += [f"{row['final'][v]:.2g}" if v in row["final"] else "—" for v in variants]
        cells.append("—" if row["san_below"] is None else str(row["san_below"]))
        cells.append("—" if row["order"] is None else f"{row['order']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    datasets = [xr.load_dataset(p) for p in args.results]
    print(markdown_table(datasets))
    if args.png is not None:
        across_models(datasets).savefig(args.png, dpi=110)
        print(f"figure: {args.png}")


if __name__ == "__main__":
    main()
