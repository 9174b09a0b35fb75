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
from .help import ANALYSIS, INPUTS, MODEL, OUTPUT, RUNNING, TRAINING, Typer, defaults_in_words

if TYPE_CHECKING:
    import xarray as xr

#: Convex hull: the largest shift and box side accepted (the points lie in [0, BOX]^2).
MAX_SHIFT = 1e6

toy_app = Typer(
    help="The paper's trained experiments: accuracy against path length, and the circle.",
    no_args_is_help=True,
)

Epochs = Annotated[
    int | None,
    option("--epochs", domain=Count(1), help="Training epochs.", rich_help_panel=TRAINING),
]
Seed = Annotated[
    int,
    option(
        "--seed",
        domain=domains.Seed(),
        help="Seed of the data, the initial weights and the paths.",
        rich_help_panel=TRAINING,
    ),
]
Device = Annotated[
    str,
    option("--device", domain=domains.Device(), help="Where it trains.", rich_help_panel=RUNNING),
]
Out = Annotated[
    Path,
    option(
        "--out", domain=OutFolder(), help="Folder for results and reports.", rich_help_panel=OUTPUT
    ),
]
Quick = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="A reduced size that runs in under a minute (sizes given explicitly win).",
        rich_help_panel=RUNNING,
    ),
]
Width = Annotated[
    int | None,
    option("--width", domain=Count(1), help="Heads per layer.", rich_help_panel=MODEL),
]
Depth = Annotated[
    int | None, option("--depth", domain=Count(1), help="Layers.", rich_help_panel=MODEL)
]
Hidden = Annotated[
    int | None,
    option(
        "--hidden",
        domain=Count(1),
        help="Hidden size (a multiple of --width).",
        rich_help_panel=MODEL,
    ),
]
Lr = Annotated[
    float | None,
    option(
        "--lr",
        domain=Real(0, 1, low_open=True),
        help="Adam learning rate.",
        rich_help_panel=TRAINING,
    ),
]
Batch = Annotated[
    int | None,
    option("--batch-size", domain=Count(1), help="Sequences per step.", rich_help_panel=TRAINING),
]
Train = Annotated[
    int | None,
    option("--train", domain=Count(1), help="Training sequences.", rich_help_panel=INPUTS),
]
Eval = Annotated[
    int | None,
    option("--eval", domain=Count(1), help="Evaluation sequences.", rich_help_panel=INPUTS),
]
NPaths = Annotated[
    int,
    option(
        "--n-paths",
        domain=Count(1),
        help="Random paths summed per evaluation.",
        rich_help_panel=ANALYSIS,
    ),
]
Repeats = Annotated[
    int,
    option(
        "--repeats",
        domain=Count(1),
        help="Draws of paths per path length.",
        rich_help_panel=ANALYSIS,
    ),
]
SubPath = Annotated[
    bool,
    typer.Option(
        "--sub-path/--no-sub-path",
        help="--sub-path: each path's term of the exact decomposition (normalisation frozen); "
        "--no-sub-path (the paper's runs): each path a pure chain of single heads.",
        rich_help_panel=ANALYSIS,
    ),
]
PathAttention = Annotated[
    str | None,
    option(
        "--path-attention",
        domain=domains.Choice(PATH_ATTENTIONS),
        help="With --no-sub-path: own (the paper's): each path recomputes its attention from "
        "its own state; full: the full model's attention.",
        show_default="own",
        rich_help_panel=ANALYSIS,
    ),
]
PathNorm = Annotated[
    str | None,
    option(
        "--path-norm",
        domain=domains.Choice(PATH_NORMS),
        help="With --no-sub-path: paper (the paper's): LayerNorm without scale and shift on "
        "each head layer and on the summed paths; trained: the trained LayerNorms, nothing "
        "on the sum.",
        show_default="paper",
        rich_help_panel=ANALYSIS,
    ),
]
WeightDecay = Annotated[
    float | None,
    option(
        "--weight-decay",
        domain=Real(0, 1),
        help="Adam's L2 weight decay.",
        rich_help_panel=TRAINING,
    ),
]
Schedule = Annotated[
    str | None,
    option(
        "--schedule",
        domain=domains.Choice(SCHEDULES),
        help="Learning-rate schedule: constant, steps (x0.91 after epochs 15, 30, 40, 50, 60) "
        "or linear (decay to 0).",
        rich_help_panel=TRAINING,
    ),
]


class HiddenSizes(domains.Text):
    """The circle's hidden sizes, a comma list the task reads (``32,128``)."""

    metavar = "N,..."


#: Why sort's and convex hull's learning rate is not the paper's (analyses/toy_settings.py).
FASTER = "1e-3 (the paper's 1e-5 leaves the network far from trained after its epochs)"
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
@defaults_in_words(
    length="8", symbols="10", width="2", depth="6", hidden="48", train="1000", eval_="200",
    epochs="65", lr=FASTER, weight_decay="0", schedule="constant", batch_size="30",
)  # fmt: skip
def sort(
    length: Annotated[int | None, option("--length", domain=Count(2), help="Tokens per sequence.", rich_help_panel=INPUTS)] = None,
    symbols: Annotated[int | None, option("--symbols", domain=Count(2), help="Distinct symbols.", rich_help_panel=INPUTS)] = None,
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
@defaults_in_words(
    points="10", box="10", shift="3.3", width="3", depth="6", hidden="84", train="10000",
    eval_="300", epochs="70", lr=FASTER, weight_decay="1e-3", schedule="steps",
    batch_size="30",
)  # fmt: skip
def convex_hull(
    points: Annotated[int | None, option("--points", domain=Count(3), help="Points per set.", rich_help_panel=INPUTS)] = None,
    box: Annotated[float | None, option("--box", domain=Real(0, MAX_SHIFT, low_open=True), help="Points uniform in [0, BOX]^2.", rich_help_panel=INPUTS)] = None,
    shift: Annotated[float | None, option("--shift", domain=Real(0, MAX_SHIFT), help="Std of each set's Gaussian shift.", rich_help_panel=INPUTS)] = None,
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
@defaults_in_words(
    sequences="500", tokens="128", positions="no-positions (the paper's)", width="2",
    depth="6", hidden="250", epochs="50", lr="3e-4", weight_decay="0", schedule="linear",
    batch_size="8",
)  # fmt: skip
def memorization(
    text: Annotated[
        Path | None,
        option(
            "--text",
            domain=TextFile(),
            help="UTF-8 text.",
            show_default="the built-in sample text",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    sequences: Annotated[int | None, option("--sequences", domain=Count(1), help="Sequences to memorise.", rich_help_panel=INPUTS)] = None,
    tokens: Annotated[int | None, option("--tokens", domain=Count(2), help="Tokens per sequence.", rich_help_panel=INPUTS)] = None,
    positions: Annotated[
        bool | None,
        typer.Option(
            "--positions/--no-positions",
            help="Learned position embeddings.",
            rich_help_panel=MODEL,
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
@defaults_in_words(
    points="1000", steps="300", setup="paper", width="2", depth="1", hidden="32,128",
    epochs="70", lr="1e-5", weight_decay="0", schedule="constant", batch_size="30",
)  # fmt: skip
def circle(
    points: Annotated[int | None, option("--points", domain=Count(4), help="Points on the circle.", rich_help_panel=INPUTS)] = None,
    steps: Annotated[int | None, option("--steps", domain=Count(1), help="Recurrent steps.", rich_help_panel=ANALYSIS)] = None,
    setup: Annotated[
        str | None,
        option(
            "--setup",
            domain=domains.Choice(TOY_SETUPS),
            help="paper: the paper's three networks (attention skip and LayerNorm in each; "
            "+skip across recurrent steps; +MLP with the attention skip); strict: probe's "
            "stricter skip-free definitions.",
            rich_help_panel=MODEL,
        ),
    ] = None,
    width: Width = None, depth: Depth = None,
    hidden: Annotated[
        str | None,
        option(
            "--hidden",
            domain=HiddenSizes(),
            help="Hidden sizes, comma-separated (multiples of --width).",
            rich_help_panel=MODEL,
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
