"""``probe fastformer``: train the Fastformer causal LM (and its GPT-2 baseline), report the curves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .console import OneLineErrors, command_line, err, out

fastformer_app = typer.Typer(
    cls=OneLineErrors,
    help="The Fastformer causal LM: train it on characters, with a GPT-2 baseline.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@fastformer_app.command("train")
def train_command(
    text: Annotated[
        str,
        typer.Option(
            help="UTF-8 training text, or `stdlib` for the standard library's docstrings, "
            "gathered now."
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for the Fastformer checkpoint.")],
    hidden: Annotated[int, typer.Option(min=1, help="Width.")] = 256,
    layers: Annotated[int, typer.Option(min=1, help="Depth.")] = 4,
    heads: Annotated[
        int, typer.Option(min=1, help="Heads (pooling heads for the Fastformer).")
    ] = 4,
    context: Annotated[int, typer.Option(min=2, help="Characters per training window.")] = 256,
    steps: Annotated[int, typer.Option(min=1, help="Optimizer steps.")] = 1000,
    batch: Annotated[int, typer.Option(min=1, help="Windows per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW).")] = 1e-3,
    warmup: Annotated[
        int | None, typer.Option(min=0, help="Warm-up steps [default: steps/20].")
    ] = None,
    dropout: Annotated[float, typer.Option(help="Dropout probability.")] = 0.0,
    convolve: Annotated[
        bool, typer.Option("--convolve", help="Add the causal convolution to every layer.")
    ] = False,
    baseline: Annotated[str | None, typer.Option(help="Also train a matching model: gpt2.")] = None,
    baseline_out: Annotated[
        Path | None, typer.Option(help="Folder of the baseline [default: OUT-gpt2].")
    ] = None,
    seed: Annotated[
        int, typer.Option(min=0, max=2**63 - 1, help="Seed of init, batches and dropout.")
    ] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    eval_every: Annotated[
        int | None, typer.Option(min=1, help="Steps between evaluations [default: steps/10].")
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="A short check: 40 steps of a 32-wide, 2-layer model."),
    ] = False,
) -> None:
    """Train a character-level Fastformer; --baseline gpt2 trains the matching GPT-2 beside it."""
    from probe.errors import ProbeError
    from probe.fastformer.train import TrainSettings, train

    if quick:
        hidden, layers, heads, context, steps, batch, lr = 32, 2, 4, 64, 40, 8, 3e-3
    from .output import check_out_dir

    for folder in [out_dir, baseline_out]:
        if folder is not None and folder.exists() and not folder.is_dir():
            raise ProbeError(f"--out {folder} is a file; give a folder")
        if folder is not None:  # the checkpoint folder is staged beside it, then renamed
            check_out_dir(folder.parent, option=f"the folder of {folder}")
    source, body = _read(text)
    settings = TrainSettings(
        text=body,
        text_source=source,
        out=out_dir,
        hidden=hidden,
        layers=layers,
        heads=heads,
        context=context,
        steps=steps,
        batch=batch,
        lr=lr,
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
    )
    with _progress() as update:
        curves = train(settings, update)
    for curve in curves:
        out.print(
            f"{curve.name}: validation {curve.final_bits_per_char:.3f} bits/char after "
            f"{curve.steps[-1]} steps, {curve.seconds[-1]:.0f} s -> {curve.folder}"
        )
    html = _write_report([Path(c.folder) for c in curves], out_dir)
    out.print(f"training report: {html}")


@fastformer_app.command("report")
def report_command(
    folders: Annotated[
        list[Path], typer.Argument(help="Folders written by `probe fastformer train`.")
    ],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Folder [default: the first].")
    ] = None,
) -> None:
    """Rebuild the training report (loss against step and wall time) of trained folders."""
    html = _write_report(folders, out_dir or folders[0])
    out.print(f"training report: {html}")


def _read(text: str) -> tuple[str, str]:
    from probe.fastformer.corpus import STDLIB, stdlib_docstrings
    from probe.inputs import read_text

    if text == STDLIB and not Path(text).exists():
        err.print("gathering the standard library's docstrings ...", markup=False)
        return "docstrings of the Python standard library", stdlib_docstrings()
    body, source = read_text(text)
    return source, body


def _write_report(folders: list[Path], out_dir: Path) -> Path:
    from probe.fastformer.train import curves, read_training
    from probe.reports.training import render_training
    from probe.results import save_result, write_text_atomic

    ds = curves([read_training(folder) for folder in folders])
    out_dir.mkdir(parents=True, exist_ok=True)
    nc = save_result(ds, out_dir / "training.nc")
    return write_text_atomic(out_dir / "training.html", render_training(ds, result_file=nc.name))


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
