"""The getting-started page's figures and table: the first run, `probe collapse minilm
--init pretrained`, as its report shows it.

    python docs/data/first_run.py [FOLDER]

Reads the result of ``probe collapse minilm --init pretrained --out FOLDER`` (default
``probe-reports``; ``make demo`` and ``make docs-data`` make it) and writes the report's
first two figures, drawn by the same functions (``probe.figures.plot.collapse`` on linear and log
axes), to ``docs/first-run.png`` and ``docs/first-run-log.png``, and the numbers behind them
(the mean relative residual over sequences after each layer, l1inf, residual to the token
mean) to ``docs/data/first_run.md`` (``docs/getting-started.md`` includes it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import xarray as xr

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent
sys.path.insert(0, str(HERE))
from common import note  # noqa: E402  (sibling scripts)

COMMAND = "probe collapse minilm --init pretrained"
VARIANTS = ("SAN", "SAN+MLP", "SAN+skip", "transformer")


def first_run(folder: Path) -> Path:
    """The result file in ``folder`` that ``COMMAND --out folder`` wrote (the newest if the
    command ran more than once)."""
    from probe import open_result

    found = []
    for path in folder.glob("collapse-minilm-pretrained-float32-*.nc"):
        command = str(open_result(path).attrs.get("command", ""))
        if re.sub(r"\s+--out\s+\S+", "", command).strip() == COMMAND:
            found.append(path)
    if not found:
        raise SystemExit(f"no result of `{COMMAND}` in {folder}/: run `{COMMAND} --out {folder}`")
    return max(found, key=lambda path: path.stat().st_mtime)


def markdown_table(ds: xr.Dataset) -> str:
    from probe.measures.stats import shown, stats

    mean = stats(ds)["mean"].sel(init="pretrained")
    layers = [int(layer) for layer in mean.layer.values]
    lines = [
        "| variant | " + " | ".join(f"layer {layer}" for layer in layers) + " |",
        "|---|" + "---:|" * len(layers),
    ]
    for variant in VARIANTS:
        cells = [shown(float(mean.sel(variant=variant, layer=la)), ds) for la in layers]
        lines.append(f"| `{variant}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figures(ds: xr.Dataset) -> list[Path]:
    """The report's figures 1 and 2, as PNG files under docs/."""
    import matplotlib

    matplotlib.use("Agg")
    from probe.figures.plot import collapse

    written = []
    for log, name in ((False, "first-run.png"), (True, "first-run-log.png")):
        fig = collapse(ds, log=log)
        path = DOCS / name
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path("probe-reports"))
    args = parser.parse_args()
    path = first_run(args.folder)
    from probe import open_result

    ds = open_result(path)
    for written in figures(ds):
        print(f"figure: {written}")
    details = (
        f"the result of `{COMMAND}`: {ds.attrs['sequences']} sequences x {ds.attrs['tokens']} "
        f"tokens of the built-in text, seed {ds.attrs['seed']}, {ds.attrs['dtype']}; mean over "
        "sequences of the relative residual, l1inf, residual to the token mean"
    )
    table = markdown_table(ds)
    (HERE / "first_run.md").write_text(
        note("python docs/data/first_run.py", [ds], details) + table + "\n", encoding="utf-8"
    )
    print(table)


if __name__ == "__main__":
    main()
