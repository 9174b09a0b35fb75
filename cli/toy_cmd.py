"""``probe toy sort|convex-hull|memorization|circle``: train, evaluate paths, write result + report.

Each command is thin: its options become ``probe.analyses.toy.run(task, ...)``
keywords (None keeps the task's default from ``TASKS``), the Dataset is saved
with ``save_result``, its report rendered by ``probe.reports.render_toy``, and
the folder's index rewritten.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from probe.names import PATH_ATTENTIONS, PATH_NORMS, SCHEDULES, TOY_SETUPS

from . import domains
from .console import Reporter, command_line, in_cli_words, named, out
from .domains import Count, OutFolder, Real, TextFile, option

if TYPE_CHECKING:
    import xarray as xr

#: Convex hull: the largest shift and box side accepted (the points lie in [0, BOX]^2).
MAX_SHIFT = 1e6

toy_app = typer.Typer(
    help="The paper's trained experiments: accuracy against path length, and the circle.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

Epochs = Annotated[
    int | None, option("--epochs", domain=Count(1), help="Training epochs [default: the paper's].")
]
Seed = Annotated[
    int,
    option(
        "--seed", domain=domains.Seed(), help="Seed of the data, the initial weights and the paths."
    ),
]
Device = Annotated[str, option("--device", domain=domains.Device(), help="Where it trains.")]
Out = Annotated[Path, option("--out", domain=OutFolder(), help="Folder for results and reports.")]
Quick = Annotated[bool, typer.Option("--quick", help="A reduced size that runs in under a minute.")]
Width = Annotated[int | None, option("--width", domain=Count(1), help="Heads per layer.")]
Depth = Annotated[int | None, option("--depth", domain=Count(1), help="Layers.")]
Hidden = Annotated[
    int | None, option("--hidden", domain=Count(1), help="Hidden size (a multiple of --width).")
]
Lr = Annotated[
    float | None,
    option(
        "--lr",
        domain=Real(0, 1, low_open=True),
        help="Adam learning rate [default: 1e-3 for sort and convex hull, where the paper's "
        "1e-5 leaves them untrained after its epochs; the paper's otherwise].",
    ),
]
Batch = Annotated[int | None, option("--batch-size", domain=Count(1), help="Sequences per step.")]
Train = Annotated[int | None, option("--train", domain=Count(1), help="Training sequences.")]
Eval = Annotated[int | None, option("--eval", domain=Count(1), help="Evaluation sequences.")]
NPaths = Annotated[
    int, option("--n-paths", domain=Count(1), help="Random paths summed per evaluation.")
]
Repeats = Annotated[
    int, option("--repeats", domain=Count(1), help="Draws of paths per path length.")
]
SubPath = Annotated[
    bool,
    typer.Option(
        "--sub-path/--no-sub-path",
        help="--sub-path: each path's term of the exact decomposition (normalisation frozen); "
        "--no-sub-path (the paper's runs): each path a pure chain of single heads.",
    ),
]
PathAttention = Annotated[
    str | None,
    option(
        "--path-attention",
        domain=domains.Choice(PATH_ATTENTIONS),
        help="own (the paper's): each path recomputes its attention from its own state; "
        "full: the full model's attention [default: own; --no-sub-path only].",
    ),
]
PathNorm = Annotated[
    str | None,
    option(
        "--path-norm",
        domain=domains.Choice(PATH_NORMS),
        help="paper (the paper's): LayerNorm without scale and shift on each head layer and "
        "on the summed paths; trained: the trained LayerNorms, nothing on the sum "
        "[default: paper; --no-sub-path only].",
    ),
]
WeightDecay = Annotated[
    float | None,
    option(
        "--weight-decay",
        domain=Real(0, 1),
        help="Adam's L2 weight decay [default: the paper's].",
    ),
]
Schedule = Annotated[
    str | None,
    option(
        "--schedule",
        domain=domains.Choice(SCHEDULES),
        help="Learning-rate schedule: constant, steps (x0.91 after epochs 15, 30, 40, 50, 60) "
        "or linear (decay to 0) [default: the paper's for the task].",
    ),
]
DEFAULT_OUT = Path("probe-reports")


def _run(task: str, out_dir: Path, **options) -> None:
    # Imported here, not at the top: `probe --help` must not load torch.
    from probe.analyses import toy
    from probe.reports import render_toy, toy_name

    from .output import check_out_dir, no_empty_folder, write_index, write_pair

    check_out_dir(out_dir)
    reporter = Reporter()
    with no_empty_folder(out_dir):
        with reporter.bar(0):
            ds = toy.run(task, progress=reporter.update, command=command_line(), **options)
        name = toy_name(ds)
        nc, html = write_pair(ds, out_dir, name, render_toy(ds, result_file=f"{name}.nc"))
        _print(ds)
        named("result", nc)
        named("report", html)
        named("index", write_index(out_dir))


def _print(ds: xr.Dataset) -> None:
    a = ds.attrs
    if a["task"] == "circle":
        table = Table(
            title=f"circle ({a['setup']} setup) · relative residual of the two points",
            title_justify="left",
        )
        table.add_column("hidden", justify="right")
        table.add_column("variant")
        shown = (0, len(ds.step) // 3, 2 * len(ds.step) // 3, len(ds.step) - 1)
        for step in shown:
            table.add_column(f"step {int(ds.step[step])}", justify="right")
        for h in ds.hidden.values:
            for v in ds.variant.values:
                r = ds.relative_residual.sel(hidden=h, variant=v).values
                table.add_row(str(int(h)), str(v), *(f"{r[s]:.3g}" for s in shown))
    else:
        table = Table(
            title=f"{a['task']} · accuracy of {a['n_paths']} random paths per length "
            f"(full model {float(ds.full_accuracy):.3f}, per-position majority "
            f"{float(ds.baseline_position):.3f}, majority {float(ds.baseline_majority):.3f})",
            title_justify="left",
        )
        table.add_column("path length", justify="right")
        table.add_column("accuracy", justify="right")
        for k in ds.path_length.values:
            acc = ds.accuracy.sel(path_length=k)
            table.add_row(str(int(k)), f"{float(acc.mean()):.3f} ± {float(acc.std()):.3f}")
    out.print(table)
    if a["task"] != "circle":
        out.print(f"path rules: attention {a['path_attention']}, norm {a['path_norm']}")
    gone = json.loads(a.get("deviations", "[]"))
    if gone:
        out.print(f"differences from the paper's run ({len(gone)}):")
        for line in gone:
            if a["task"] == "memorization":  # its --sequences sets the library's `train`
                line = line.replace("`train`", "`sequences`")
            out.print(f"  - {in_cli_words(line)}")
    out.print(f"time: {a['seconds']:.1f} s on {a['device']}")


@toy_app.command("sort")
def sort(
    length: Annotated[int | None, option("--length", domain=Count(2), help="Tokens per sequence [8].")] = None,
    symbols: Annotated[int | None, option("--symbols", domain=Count(2), help="Distinct symbols [10].")] = None,
    width: Width = None, depth: Depth = None, hidden: Hidden = None,
    train: Train = None, eval_: Eval = None, epochs: Epochs = None, lr: Lr = None,
    weight_decay: WeightDecay = None, schedule: Schedule = None,
    batch_size: Batch = None, n_paths: NPaths = 5, repeats: Repeats = 5,
    sub_path: SubPath = False, path_attention: PathAttention = None, path_norm: PathNorm = None,
    seed: Seed = 0, device: Device = "cpu", out_dir: Out = DEFAULT_OUT, quick: Quick = False,
) -> None:  # fmt: skip
    """Sort 8 tokens from 10 symbols (width 2, depth 6, hidden 48; 1000/200 sequences; 65 epochs)."""
    _run("sort", out_dir, length=length, symbols=symbols, width=width, depth=depth,
         hidden=hidden, train=train, eval=eval_, epochs=epochs, lr=lr,
         weight_decay=weight_decay, schedule=schedule, batch_size=batch_size,
         n_paths=n_paths, repeats=repeats, sub_path=sub_path, path_attention=path_attention,
         path_norm=path_norm, seed=seed, device=device, quick=quick)  # fmt: skip


@toy_app.command("convex-hull")
def convex_hull(
    points: Annotated[int | None, option("--points", domain=Count(3), help="Points per set [10].")] = None,
    box: Annotated[float | None, option("--box", domain=Real(0, MAX_SHIFT, low_open=True), help="Points uniform in [0, BOX]^2 [10].")] = None,
    shift: Annotated[float | None, option("--shift", domain=Real(0, MAX_SHIFT), help="Std of each set's Gaussian shift [3.3].")] = None,
    width: Width = None, depth: Depth = None, hidden: Hidden = None,
    train: Train = None, eval_: Eval = None, epochs: Epochs = None, lr: Lr = None,
    weight_decay: WeightDecay = None, schedule: Schedule = None,
    batch_size: Batch = None, n_paths: NPaths = 5, repeats: Repeats = 5,
    sub_path: SubPath = False, path_attention: PathAttention = None, path_norm: PathNorm = None,
    seed: Seed = 0, device: Device = "cpu", out_dir: Out = DEFAULT_OUT, quick: Quick = False,
) -> None:  # fmt: skip
    """Which of 10 points are on their convex hull (width 3, depth 6, hidden 84; 10000/300; 70 epochs)."""
    _run("convex-hull", out_dir, points=points, box=box, shift=shift, width=width, depth=depth,
         hidden=hidden, train=train, eval=eval_, epochs=epochs, lr=lr,
         weight_decay=weight_decay, schedule=schedule, batch_size=batch_size,
         n_paths=n_paths, repeats=repeats, sub_path=sub_path, path_attention=path_attention,
         path_norm=path_norm, seed=seed, device=device, quick=quick)  # fmt: skip


@toy_app.command("memorization")
def memorization(
    text: Annotated[
        Path | None,
        option("--text", domain=TextFile(), help="UTF-8 text [default: the built-in sample text]."),
    ] = None,
    sequences: Annotated[int | None, option("--sequences", domain=Count(1), help="Sequences to memorise [500].")] = None,
    tokens: Annotated[int | None, option("--tokens", domain=Count(2), help="Tokens per sequence [128].")] = None,
    positions: Annotated[
        bool | None,
        typer.Option(
            "--positions/--no-positions",
            help="Learned position embeddings [default: none, as the paper's model].",
        ),
    ] = None,
    width: Width = None, depth: Depth = None, hidden: Hidden = None,
    epochs: Epochs = None, lr: Lr = None, weight_decay: WeightDecay = None,
    schedule: Schedule = None, batch_size: Batch = None,
    n_paths: NPaths = 5, repeats: Repeats = 5, sub_path: SubPath = False,
    path_attention: PathAttention = None, path_norm: PathNorm = None,
    seed: Seed = 0, device: Device = "cpu", out_dir: Out = DEFAULT_OUT, quick: Quick = False,
) -> None:  # fmt: skip
    """Memorise random labels of BERT tokens (width 2, depth 6, hidden 250; 500 x 128; 50 epochs)."""
    _run("memorization", out_dir, text=str(text) if text else None, train=sequences,
         tokens=tokens, positions=positions, width=width, depth=depth, hidden=hidden,
         epochs=epochs, lr=lr, weight_decay=weight_decay, schedule=schedule,
         batch_size=batch_size, n_paths=n_paths, repeats=repeats, sub_path=sub_path,
         path_attention=path_attention, path_norm=path_norm, seed=seed, device=device,
         quick=quick)  # fmt: skip


@toy_app.command("circle")
def circle(
    points: Annotated[int | None, option("--points", domain=Count(4), help="Points on the circle [1000].")] = None,
    steps: Annotated[int | None, option("--steps", domain=Count(1), help="Recurrent steps [300].")] = None,
    setup: Annotated[
        str | None,
        option(
            "--setup",
            domain=domains.Choice(TOY_SETUPS),
            help="paper: the paper's three networks (attention skip and LayerNorm in each; "
            "+skip across recurrent steps; +MLP with the attention skip); strict: probe's "
            "stricter skip-free definitions [default: paper].",
        ),
    ] = None,
    width: Width = None, depth: Depth = None,
    hidden: Annotated[
        str | None,
        option(
            "--hidden",
            domain=domains.Text(),
            help="Hidden sizes, comma-separated (multiples of --width) [32,128].",
        ),
    ] = None,
    epochs: Epochs = None, lr: Lr = None, weight_decay: WeightDecay = None,
    schedule: Schedule = None, batch_size: Batch = None,
    seed: Seed = 0, device: Device = "cpu", out_dir: Out = DEFAULT_OUT, quick: Quick = False,
) -> None:  # fmt: skip
    """Two arcs of a circle, then recurrence: SAN, SAN+skip, SAN+MLP (depth 1, width 2, hidden 32 and 128)."""
    _run("circle", out_dir, points=points, steps=steps, setup=setup, width=width, depth=depth,
         hidden=hidden, epochs=epochs, lr=lr, weight_decay=weight_decay, schedule=schedule,
         batch_size=batch_size, seed=seed, device=device, quick=quick)  # fmt: skip
