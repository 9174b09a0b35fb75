"""The full toy runs of docs/toy.md, at the paper's setup: hours on a 2-core CPU.

    OMP_NUM_THREADS=1 python docs/data/toy.py [--out probe-reports/toy-full]

Runs, seed 0, each command of the table in ``docs/toy.md`` (the same runs as ``probe toy
TASK`` with those options), keeps each result in ``--out``, and prints the table's rows
as Markdown: the time, the full model's accuracy with its baselines, and the accuracy
per path length (mean ± std over the repeats), then the circle's relative residual at
steps 100 and 300.  Not part of ``make docs-data``: its runs take hours.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: (the command as the table shows it, toy.run's arguments).
RUNS = (
    ("probe toy sort", ("sort", {})),
    (
        "probe toy sort --path-attention full --path-norm trained",
        ("sort", {"path_attention": "full", "path_norm": "trained"}),
    ),
    ("probe toy sort --lr 1e-5", ("sort", {"lr": 1e-5})),
    ("probe toy convex-hull", ("convex-hull", {})),
    ("probe toy memorization", ("memorization", {})),
)


def row(command: str, ds) -> str:
    mean, std = ds.accuracy.mean("repeat"), ds.accuracy.std("repeat")
    per_length = ", ".join(
        f"{float(m):.3f} ± {float(s):.3f}" for m, s in zip(mean.values, std.values, strict=True)
    )
    full = (
        f"{float(ds.full_accuracy):.3f} (baselines {float(ds.baseline_position):.3f}, "
        f"{float(ds.baseline_majority):.3f})"
    )
    return f"| `{command}` | {ds.attrs['seconds']:.0f} s | {full} | {per_length} |"


def main() -> None:
    from probe import open_result, save_result
    from probe.analyses import toy

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("probe-reports/toy-full"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def result(name: str, task: str, options: dict):
        path = args.out / f"{name}.nc"
        if not path.is_file():
            save_result(toy.run(task, **options), path)
        return open_result(path)

    for i, (command, (task, options)) in enumerate(RUNS):
        print(row(command, result(f"run{i}", task, options)), flush=True)
    for setup in ("paper", "strict"):
        circle = result(f"circle-{setup}", "circle", {"setup": setup})
        print(f"circle --setup {setup}: {circle.attrs['seconds']:.0f} s")
        for hidden in circle.hidden.values:
            cells = [
                " / ".join(
                    f"{float(circle.relative_residual.sel(hidden=hidden, variant=v, step=s)):.3g}"
                    for s in (100, 300)
                )
                for v in circle.variant.values
            ]
            print(f"| {int(hidden)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
