"""``probe collapse``: the command's options, their checks, and the call to the run.

The run itself (loading, probing, writing) is :mod:`cli.collapse_run`, imported when the
command runs: it imports xarray and the analyses, which ``probe --help`` must not wait for.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from probe import names
from probe.surgery.ablate import parse_variants, with_norms

from .console import fail, warn
from .domains import Choice, CommaList, Count, ModelName, argument, option
from .help import ANALYSIS, INPUTS
from .options import SHARED, BranchScaleOption, MaskOption, Shared, shared_options


def _choices(values) -> tuple[str, ...]:
    """The CLI's spelling of one of the library's tuples of names (- for _)."""
    return tuple(v.replace("_", "-") for v in values)


Metric = _choices(names.METRICS)
Norm = _choices(names.NORMS)
Fit = _choices(names.FITS)
Surgery = _choices(names.SURGERIES)
ErankMethod = _choices(names.EFFECTIVE_RANK_METHODS)


def _parse_metrics(text: str):
    """The library's reader of --metrics (imported when a value is parsed, not for --help)."""
    from probe.analyses.collapse import parse_metrics

    return parse_metrics(text)


@shared_options(*SHARED, tokens=128, dtype="float32", batch_size=16)
def collapse(
    models: Annotated[
        list[str],
        argument("MODEL", ModelName(), help="Hub ids, local save_pretrained folders, or `minilm`."),
    ],
    no_skip: Annotated[
        bool,
        typer.Option(
            "--no-skip",
            help="Remove the attention skip connection: SAN+MLP (with --no-mlp: SAN).",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    no_mlp: Annotated[
        bool,
        typer.Option(
            "--no-mlp",
            help="Remove the MLP sublayer: SAN+skip (with --no-skip: SAN).",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    variants: Annotated[
        str | None,
        option(
            "--variants",
            domain=CommaList(
                names.VARIANTS
                + names.NORM_VARIANTS
                + names.COMPOSED_NORM_VARIANTS
                + names.REMOVAL_VARIANTS,
                parse_variants,
                words=("all",),
                metavar="all|LIST",
            ),
            help="all (the paper's four), or a comma list of SAN, SAN+MLP, SAN+skip, "
            "transformer, LN-affine, no-LN, their LayerNorm variants SAN/no-LN, "
            "SAN/LN-affine, SAN+MLP/no-LN, ..., no-sink, no-massive.",
            show_default="all",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    no_layernorm: Annotated[
        bool,
        typer.Option(
            "--no-layernorm",
            help="Add each variant's LayerNorm variants: norms reduced to their scale and "
            "shift (LN-affine; SAN/LN-affine, ...) and removed (no-LN; SAN/no-LN, ...).",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    metric: Annotated[
        str,
        option(
            "--metric",
            domain=Choice(Metric, metavar="METRIC"),
            help="The metric of the printed table.",
            rich_help_panel=ANALYSIS,
        ),
    ] = "relative-residual",
    metrics: Annotated[
        str,
        option(
            "--metrics",
            domain=CommaList(
                [m.replace("_", "-") for m in names.METRICS],
                _parse_metrics,
                words=("all",),
                metavar="all|LIST",
            ),
            help="Metrics computed and stored (the relative residual always is).",
            rich_help_panel=ANALYSIS,
        ),
    ] = "all",
    effective_rank: Annotated[
        str,
        option(
            "--effective-rank",
            domain=Choice(ErankMethod),
            help="Effective rank from the full spectrum (exact), by stochastic Lanczos "
            "quadrature (estimate), or by the cheaper here (auto).",
            rich_help_panel=ANALYSIS,
        ),
    ] = "auto",
    norm: Annotated[
        str | None,
        option(
            "--norm",
            domain=Choice(Norm, metavar="NORM"),
            help="Norm of the relative residual in the table (l1inf: the paper's).",
            show_default="l1inf",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    fit: Annotated[
        str | None,
        option(
            "--fit",
            domain=Choice(Fit),
            help="Residual to the token mean (the paper's) or to the best rank-one fit.",
            show_default="mean",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    surgery: Annotated[
        str,
        option(
            "--surgery",
            domain=Choice(Surgery),
            help="probe: the same ablations for every family; paper: the surgery of the "
            "paper's code, per family (differs for ALBERT without MLP).",
            rich_help_panel=ANALYSIS,
        ),
    ] = "probe",
    branch_scale: BranchScaleOption = "1",
    mask: MaskOption = "model",
    sequences: Annotated[
        str,
        option(
            "--sequences",
            domain=Count(1, words=("all",)),
            help="Sequences (images) per model, or all: every full sequence of --text "
            "(every image of --images).",
            rich_help_panel=INPUTS,
        ),
    ] = "32",
    *,
    shared: Shared,
) -> None:
    """Measure rank collapse per layer for the paper's four variants."""
    from .collapse_run import run_collapse

    _refuse_conflicts(models, variants, no_skip, no_mlp)
    metric_name = _metric_name(metric, metrics, norm, fit)
    chosen = _chosen_variants(variants, no_skip, no_mlp, no_layernorm)
    run_collapse(
        shared.models(models),
        shared.inputs(sequences),
        variants=chosen,
        metric=metric_name,
        norm=_value(norm) if norm is not None else "l1inf",
        fit=_value(fit) if fit is not None else "mean",
        surgery=_value(surgery),
        metrics=metrics,
        effective_rank=_value(effective_rank),
        branch_scale=branch_scale,
        mask=mask,
        out_dir=shared.out_dir,
    )


def _refuse_conflicts(models: list[str], variants, no_skip: bool, no_mlp: bool) -> None:
    """A model named twice, or the variants chosen two ways at once: one line, exit 2."""
    same = [m for i, m in enumerate(models) if _same_model(m) in map(_same_model, models[:i])]
    if same:
        fail(f"{', '.join(dict.fromkeys(same))} given more than once; give each model once")
    if variants is not None and (no_skip or no_mlp):
        fail("use either --variants or --no-skip/--no-mlp, not both")


def _metric_name(metric, metrics: str, norm, fit) -> str:
    """The library's name of --metric, which --metrics must include; --norm and --fit given
    with another metric are said to be ignored."""
    metric_name = _value(metric).replace("-", "_")
    if metric_name not in _parse_metrics(metrics):
        fail(f"--metric {_value(metric)} is not among --metrics {metrics}; add it there")
    if metric_name != "relative_residual":
        for option, given in (("--norm", norm), ("--fit", fit)):
            if given is not None:
                warn(
                    f"{option} applies to the relative residual only; ignored for --metric {_value(metric)}"
                )
    return metric_name


def _chosen_variants(variants, no_skip: bool, no_mlp: bool, no_layernorm: bool) -> str:
    """The library's variant list from --variants, --no-skip/--no-mlp and --no-layernorm."""
    from probe.surgery.ablate import variant_from_flags

    chosen = variant_from_flags(no_skip, no_mlp) if (no_skip or no_mlp) else (variants or "all")
    if no_layernorm:  # each of the paper's variants with its norms affine and removed
        given = parse_variants(chosen)
        added = [
            name for variant in given if variant in names.VARIANTS for name in with_norms(variant)
        ]
        chosen = ",".join([*given, *added])
    return chosen


def _same_model(name: str) -> str:
    """What a model name points to: a local folder by its real path, else the name."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def _value(choice) -> str:
    return choice.value if isinstance(choice, Enum) else str(choice)
