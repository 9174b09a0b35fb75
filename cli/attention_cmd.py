"""``probe attention MODEL...``: attention sinks, entropy and spectrum, massive activations and
anisotropy (:mod:`probe.analyses.attention`), beside the collapse of the same request.

Made of the shared request options (:mod:`cli.options`) and ``--epsilon``; follows the
collapse flow: every request is checked before any model loads, then per model analysis ->
Dataset -> result file + report beside it -> index.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from rich.table import Table

from .console import Reporter, command_line, fail, named, out, warn
from .domains import Count, ModelName, Real, argument, option
from .help import ANALYSIS, INPUTS
from .options import SHARED, BranchScaleOption, MaskOption, Shared, shared_options

if TYPE_CHECKING:
    import xarray as xr


@shared_options(*SHARED, tokens=128, dtype="float32", batch_size=8)
def attention(
    models: Annotated[
        list[str],
        argument("MODEL", ModelName(), help="Hub ids, local save_pretrained folders, or `minilm`."),
    ],
    epsilon: Annotated[
        float,
        option(
            "--epsilon",
            domain=Real(0, 1, low_open=True, high_open=True),
            help="Sink threshold: the sink rate (Gu et al.'s Sink_eps) is the share of "
            "(sequence, layer, head) whose attention to the first token exceeds it.",
            rich_help_panel=ANALYSIS,
        ),
    ] = 0.3,
    branch_scale: BranchScaleOption = "1",
    mask: MaskOption = "model",
    sequences: Annotated[
        int,
        option(
            "--sequences",
            domain=Count(1),
            help="Sequences (images) per model.",
            rich_help_panel=INPUTS,
        ),
    ] = 32,
    *,
    shared: Shared,
) -> None:
    """Attention sinks, attention entropy and spectrum, massive activations, anisotropy."""
    if len(set(models)) != len(models):
        fail("a model is given more than once; give each model once")
    requests = shared.models(models)
    given = shared.inputs(sequences)
    out_dir = shared.out_dir
    from probe.requests.preflight import check_models

    from .output import check_out_dir, no_empty_folder, write_index

    check_out_dir(out_dir)
    check_models(requests, given, branch_scale=branch_scale, mask=mask)  # all, before any runs
    with no_empty_folder(out_dir):
        for request in requests:
            from probe.analyses import attention as analysis

            reporter = Reporter()
            with reporter.bar(0):
                ds = analysis.run(
                    request,
                    given,
                    epsilon=epsilon,
                    branch_scale=branch_scale,
                    mask=mask,
                    progress=reporter.update,
                    warn=warn,
                    command=command_line() if len(requests) == 1 else None,
                )
            print_attention(ds)
            nc, html = write_attention_result(ds, out_dir)
            named("result", nc)
            named("report", html)
        named("index", write_index(out_dir))


def write_attention_result(ds: xr.Dataset, out_dir: Path) -> tuple[Path, Path]:
    """DIR/attention-<model>-....nc and its report, put in place together."""
    from probe.reports.attention_report import attention_report_name, render_attention

    from .output import write_pair

    name = attention_report_name(ds)
    return write_pair(ds, out_dir, name, render_attention(ds, result_file=f"{name}.nc"))


def print_attention(ds: xr.Dataset) -> None:
    """Per layer and init: the mean sink score (and, with learned sink logits, the learned
    sink's share of the rows beside it), entropy, massive ratio and anisotropy."""
    import numpy as np

    learned = "learned_sink_share" in ds
    columns = ("sink", "learned sink", "entropy") if learned else ("sink", "entropy")

    table = Table(
        title=f"{ds.attrs['model']} · attention per layer (mean over heads)", title_justify="left"
    )
    table.add_column("layer", justify="right")
    inits = list(ds.init.values)
    for init in inits:
        for what in (*columns, "massive", "aniso."):
            table.add_column(f"{init} {what}", justify="right")
    for layer in ds.layer.values:
        cells = []
        for init in inits:
            one = ds.sel(init=init, layer=layer)
            heads = ("sink_score", "learned_sink_share", "attention_entropy")
            for values in (one[name].values for name in heads if name in one):
                cells.append(f"{float(np.mean(values)):.3g}" if np.isfinite(values).all() else "-")
            cells += [
                f"{float(one['massive_ratio']):.4g}",
                f"{float(one['anisotropy']):.3g}",
            ]
        table.add_row(str(int(layer)), *cells)
    out.print(table)
    eps = float(ds.attrs["epsilon"])
    for init in inits:
        rate = float(ds["sink_rate"].sel(init=init))
        shown = f"{rate:.3g}" if np.isfinite(rate) else "not measured"
        if "sink_head_share" in ds and np.isfinite(
            share := float(ds["sink_head_share"].sel(init=init))
        ):
            shown += f" (heads whose mean sink score passes {eps:g}: {share:.3g})"
        out.print(f"{init}: sink rate Sink_{eps:g} = {shown}")
    out.print(str(ds.attrs["attention_note"]))
    if learned:
        out.print(str(ds.attrs["learned_sink_note"]))
