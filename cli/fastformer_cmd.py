"""``probe fastformer``: train the Fastformer causal LM (and its GPT-2 baseline), report the curves."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from probe.errors import ProbeError
from probe.names import BASELINES

from .console import (
    OneLineErrors,
    check_interrupt,
    command_line,
    err,
    named,
    out,
    say,
    shown,
    wrote,
)
from .domains import (
    Choice,
    Count,
    Device,
    InFolder,
    NewFolder,
    OutFolder,
    Real,
    Seed,
    TextFile,
    argument,
    option,
)
from .help import INPUTS, MODEL, OUTPUT, RUNNING, Typer
from .help import TRAINING as TRAINING_PANEL

#: The largest peak learning rate accepted (probe.fastformer.train.MAX_LR; not imported
#: from there, which would load torch to parse the command line).
MAX_LR = 1.0

fastformer_app = Typer(
    cls=OneLineErrors,
    help="The Fastformer causal LM: train it on characters, with a GPT-2 baseline.",
    no_args_is_help=True,
)


#: The sizes of a full run and of --quick; an option given explicitly wins over both.
FULL = dict(hidden=256, layers=4, heads=4, context=256, steps=1000, batch=16, lr=1e-3)
QUICK = dict(hidden=32, layers=2, heads=4, context=64, steps=40, batch=8, lr=3e-3)
TRAINING = "training.json"
WRITER = "probe fastformer train"
#: --save-every's word for log-spaced checkpoints, and the dtypes they may be stored in
#: (probe.fastformer.train_steps.LOG and SAVE_DTYPES; not imported, as MAX_LR above).
SAVE_LOG = "log"
SAVE_DTYPES = ("float32", "float16", "bfloat16")
#: The file at the root of a series of checkpoints (probe.loading.shipped.SERIES_FILE).
SERIES = "series.json"


def _sized(name: str, help: str, panel: str, low: int = 1):
    return option(
        f"--{name}",
        domain=Count(low),
        help=help,
        show_default=f"{FULL[name]}"
        + (f", or {QUICK[name]} with --quick" if QUICK[name] != FULL[name] else ""),
        rich_help_panel=panel,
    )


@fastformer_app.command("train")
def train_command(
    text: Annotated[
        str,
        option(
            "--text",
            domain=TextFile(words=("stdlib",)),
            help="UTF-8 training text, or `stdlib` for the standard library's docstrings, "
            "gathered now.",
            rich_help_panel=INPUTS,
        ),
    ],
    out_dir: Annotated[
        Path,
        option(
            "--out",
            domain=NewFolder(TRAINING, WRITER),
            help="Folder for the Fastformer checkpoint (new, or one this command wrote).",
            rich_help_panel=OUTPUT,
        ),
    ],
    hidden: Annotated[int | None, _sized("hidden", "Width.", MODEL)] = None,
    layers: Annotated[int | None, _sized("layers", "Depth.", MODEL)] = None,
    heads: Annotated[
        int | None, _sized("heads", "Heads (pooling heads for the Fastformer).", MODEL)
    ] = None,
    context: Annotated[
        int | None, _sized("context", "Characters per training window.", INPUTS, 2)
    ] = None,
    steps: Annotated[int | None, _sized("steps", "Optimizer steps.", TRAINING_PANEL)] = None,
    batch: Annotated[int | None, _sized("batch", "Windows per step.", TRAINING_PANEL)] = None,
    lr: Annotated[
        float | None,
        option(
            "--lr",
            domain=Real(0, MAX_LR, low_open=True),
            help="Peak learning rate (AdamW).",
            show_default=f"{FULL['lr']}, or {QUICK['lr']} with --quick",
            rich_help_panel=TRAINING_PANEL,
        ),
    ] = None,
    warmup: Annotated[
        int | None,
        option(
            "--warmup",
            domain=Count(0),
            help="Warm-up steps.",
            show_default="steps/20",
            rich_help_panel=TRAINING_PANEL,
        ),
    ] = None,
    dropout: Annotated[
        float,
        option(
            "--dropout",
            domain=Real(0, 1, high_open=True),
            help="Dropout probability.",
            rich_help_panel=TRAINING_PANEL,
        ),
    ] = 0.0,
    convolve: Annotated[
        bool,
        typer.Option(
            "--convolve", help="Add the causal convolution to every layer.", rich_help_panel=MODEL
        ),
    ] = False,
    baseline: Annotated[
        str | None,
        option(
            "--baseline",
            domain=Choice(BASELINES),
            help="Also train a matching model.",
            rich_help_panel=MODEL,
        ),
    ] = None,
    baseline_out: Annotated[
        Path | None,
        option(
            "--baseline-out",
            domain=NewFolder(TRAINING, WRITER),
            help="Folder of the baseline.",
            show_default="OUT-gpt2",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    seed: Annotated[
        int,
        option(
            "--seed",
            domain=Seed(),
            help="Seed of init, batches and dropout.",
            rich_help_panel=TRAINING_PANEL,
        ),
    ] = 0,
    device: Annotated[
        str,
        option("--device", domain=Device(), help="Where it trains.", rich_help_panel=RUNNING),
    ] = "cpu",
    eval_every: Annotated[
        int | None,
        option(
            "--eval-every",
            domain=Count(1),
            help="Steps between evaluations.",
            show_default="steps/10",
            rich_help_panel=TRAINING_PANEL,
        ),
    ] = None,
    save_every: Annotated[
        str | None,
        option(
            "--save-every",
            domain=Count(1, words=(SAVE_LOG,)),
            help="Also keep a checkpoint every N optimizer steps, at step 0 and at the last "
            "step, or at log-spaced steps (log: 0, 1, 3, 10, 30, 100, ... and the last), in "
            "OUT-steps/step-NNNNNN (and BASELINE-OUT-steps) beside each model's folder.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    save_dtype: Annotated[
        str | None,
        option(
            "--save-dtype",
            domain=Choice(SAVE_DTYPES, metavar="DTYPE"),
            help="The dtype of the checkpoints --save-every keeps (the training runs in "
            "float32 whatever it is).",
            show_default="float32",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="A short check: 40 steps of a 32-wide, 2-layer model (sizes given explicitly "
            "win).",
            rich_help_panel=RUNNING,
        ),
    ] = False,
) -> None:
    """Train a character-level Fastformer; --baseline gpt2 trains the matching GPT-2 beside it."""
    from probe.fastformer.train import TrainSettings, baseline_folder, series_folder, train
    from probe.requests import checks

    from .output import no_empty_folder

    given = dict(hidden=hidden, layers=layers, heads=heads, context=context, steps=steps,
                 batch=batch, lr=lr)  # fmt: skip
    sizes = {k: v if v is not None else (QUICK if quick else FULL)[k] for k, v in given.items()}
    settings = TrainSettings(
        text="",
        text_source="",
        out=out_dir,
        warmup=warmup,
        dropout=dropout,
        convolve=convolve,
        seed=seed,
        device=device,
        eval_every=eval_every,
        eval_windows=16 if quick else 64,
        baseline=baseline,
        baseline_out=baseline_out,
        command=command_line(),
        **sizes,
    )
    if baseline is not None and baseline_out is None:  # the default folder is checked too
        checks.new_folder(baseline_folder(settings), "the baseline's folder", TRAINING, WRITER)
    if save_dtype is not None and save_every is None:
        raise ProbeError("--save-dtype goes with --save-every (the dtype of those checkpoints)")
    if save_every is not None:
        every = save_every if save_every == SAVE_LOG else int(save_every)
        dtype = save_dtype or "float32"
        settings = dataclasses.replace(settings, save_every=every, save_dtype=dtype)
        settings.check_saving()  # the series folders apart from the others, before they are checked
        for folder in [Path(out_dir)] + ([baseline_folder(settings)] if baseline else []):
            what = f"the checkpoints along training of {folder}"
            checks.new_folder(series_folder(folder), what, SERIES, WRITER)
    settings.check_options()  # before the text is read (stdlib takes a while to gather)
    source, body = _read(text)
    settings = dataclasses.replace(settings, text=body, text_source=source)
    settings.check()  # everything, memory included, before the first step

    def report(staged: dict[Path, Path]) -> None:
        # The training report goes into the Fastformer's folder before it is put in place.
        _render_report(list(staged.values()), staged[Path(out_dir)])

    folders = [Path(out_dir).parent, baseline_folder(settings).parent]
    with no_empty_folder(*folders), _progress() as update:
        curves = train(settings, update, finish=report, committed=lambda f: wrote(*f))
    for curve in curves:
        out.print(
            f"{curve.name}: validation {curve.final_bits_per_char:.3f} bits/char after "
            f"{curve.steps[-1]} steps, {curve.seconds[-1]:.0f} s -> {shown(curve.folder)}",
            markup=False,
        )
        if save_every is not None:
            out.print(
                f"{curve.name}: checkpoints along training -> {shown(series_folder(curve.folder))}",
                markup=False,
            )
    named("training report", Path(out_dir) / "training.html")


@fastformer_app.command("report")
def report_command(
    folders: Annotated[
        list[Path],
        argument("FOLDER", InFolder(), help="Folders written by `probe fastformer train`."),
    ],
    out_dir: Annotated[
        Path | None,
        option(
            "--out",
            domain=OutFolder(),
            help="Folder for the report.",
            show_default="the first FOLDER",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
) -> None:
    """Rebuild the training report (loss against step and wall time) of trained folders."""
    from probe.fastformer.train import read_training

    from .output import no_empty_folder

    resolved = [folder.resolve() for folder in folders]
    twice = sorted(
        {str(f) for f, r in zip(folders, resolved, strict=True) if resolved.count(r) > 1}
    )
    if twice:
        raise ProbeError(f"{', '.join(twice)} given more than once; give each folder once")
    for folder in folders:
        read_training(folder)  # every record checked before anything is written
    target = out_dir or folders[0]
    ds, page = _report(folders)
    with no_empty_folder(target):
        _write_report(ds, page, target)
    named("training report", target / "training.html")


def _write_report(ds, page: str, target: Path) -> None:
    from probe.files.results import write_netcdf, write_together

    write_together(
        {
            target / "training.nc": lambda tmp: write_netcdf(ds, tmp),
            target / "training.html": lambda tmp: Path(tmp).write_text(page, encoding="utf-8"),
        },
        committed=lambda paths: wrote(*paths),
    )


def _read(text: str) -> tuple[str, str]:
    from probe.fastformer.corpus import STDLIB, stdlib_docstrings
    from probe.requests.inputs import read_text

    if text == STDLIB and not Path(text).exists():
        start = time.monotonic()
        body = stdlib_docstrings()
        say(
            f"probe: gathered the standard library's docstrings ({len(body):,} characters) "
            f"in {time.monotonic() - start:.1f} s"
        )
        return "docstrings of the Python standard library", body
    body, source = read_text(text)
    return source, body


def _report(folders: list[Path]):
    """The curves Dataset of ``folders`` and its HTML page (which names training.nc)."""
    from probe.fastformer.train import curves, read_training
    from probe.reports.training import render_training

    ds = curves([read_training(folder) for folder in folders])
    return ds, render_training(ds, result_file="training.nc")


def _render_report(folders: list[Path], into: Path) -> None:
    """training.nc and training.html of ``folders``, written into the folder ``into``."""
    from probe.files.results import write_netcdf

    ds, page = _report(folders)
    write_netcdf(ds, into / "training.nc")
    (into / "training.html").write_text(page, encoding="utf-8")


class _progress:
    """A rich bar with loss and bits/char on a terminal; one line per evaluation always."""

    def __enter__(self):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = None
        if err.is_terminal:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            )
            self.bar.__enter__()
            self.tasks = {}
        return self.update

    def update(self, name, step, total, loss, bits):
        import math

        check_interrupt()

        stats = f"loss {loss:.3f} ({loss / math.log(2):.3f} bits/char)"
        if self.bar is not None:
            if name not in self.tasks:
                self.tasks[name] = self.bar.add_task(name, total=total, stats="")
            self.bar.update(self.tasks[name], completed=step, stats=stats)
        if bits is not None:
            err.print(f"{name} step {step}/{total}: train {stats}, validation {bits:.3f} bits/char")

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False
