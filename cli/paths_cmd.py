"""``probe paths``: count paths, sample chained attention along paths, decompose by path length.

One command with three modes, each following the collapse flow: analysis ->
Dataset -> result file + report beside it -> index.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from probe.errors import ProbeError
from probe.measures.path_vocabulary import MAX_SHAPE

from .console import Reporter, command_line, named, out, warn
from .domains import (
    Count,
    ModelName,
    argument,
    option,
)
from .help import ANALYSIS, INPUTS
from .options import Shared, Shown, shared_options

if TYPE_CHECKING:
    import xarray as xr


@shared_options(
    "init", "text", "seed", "device", "device_map", "max_memory", "offload_folder", "dtype",
    "config", "revision", "quiet", "out_dir", tokens=128, batch_size=8,
    dtype=Shown(None, "float32 with --sample, float64 with --decompose"),
)  # fmt: skip
def paths(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        argument(
            "MODEL",
            ModelName(),
            help="Hub id, local folder or `minilm`: for --sample and --decompose; with "
            "--count, optional.",
        ),
    ] = None,
    count: Annotated[
        bool,
        typer.Option(
            "--count", help="Count paths per length (no model needed).", rich_help_panel=ANALYSIS
        ),
    ] = False,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="Distance from rank one of attention along paths.",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    decompose: Annotated[
        bool,
        typer.Option(
            "--decompose",
            help="Exact path-length decomposition (SAN+skip).",
            rich_help_panel=ANALYSIS,
        ),
    ] = False,
    layers: Annotated[
        int | None,
        option(
            "--layers",
            domain=Count(1, MAX_SHAPE),
            help="--count: number of layers L.",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    heads: Annotated[
        int | None,
        option(
            "--heads",
            domain=Count(1, MAX_SHAPE),
            help="--count: heads per layer H.",
            rich_help_panel=ANALYSIS,
        ),
    ] = None,
    samples: Annotated[
        int,
        option(
            "--samples",
            domain=Count(1),
            help="--sample: paths per depth.",
            rich_help_panel=ANALYSIS,
        ),
    ] = 100,
    sequences: Annotated[
        int | None,
        option(
            "--sequences",
            domain=Count(1),
            help="Sequences per model.",
            show_default="32 with --sample, 8 with --decompose",
            rich_help_panel=INPUTS,
        ),
    ] = None,
    *,
    shared: Shared,
) -> None:
    """Attention paths: --count, --sample MODEL or --decompose MODEL."""

    modes = [
        name for name, on in (("count", count), ("sample", sample), ("decompose", decompose)) if on
    ]
    if len(modes) != 1:
        raise ProbeError("choose one of --count, --sample MODEL, --decompose MODEL")
    mode = modes[0]
    if mode != "count":
        if model is None:
            raise ProbeError(f"--{mode} needs a MODEL (a hub id, a local folder, or minilm)")
    flags = {param.name: param.opts[0] for param in ctx.command.params}  # --set for config
    ignored = [
        flags.get(name, "--" + name.replace("_", "-"))
        for name in NOT_FOR[mode]
        if ctx.get_parameter_source(name) is not None
        and ctx.get_parameter_source(name).name == "COMMANDLINE"
    ]
    if ignored:
        raise ProbeError(f"{', '.join(ignored)} do not apply to --{mode}; leave them out")
    from .output import check_out_dir, no_empty_folder  # not at the top: keeps --help fast

    if mode != "count":  # checked before the folder: a bad request writes nothing
        (request,) = shared.models([model])
        given = shared.inputs(sequences)
    out_dir = shared.out_dir
    check_out_dir(out_dir)
    if mode == "count":
        with no_empty_folder(out_dir):
            from probe.analyses import paths as analysis

            ds = analysis.count(model, layers=layers, heads=heads, command=command_line())
            _publish(ds, out_dir)
        return
    options = {"command": command_line()} | ({"samples": samples} if mode == "sample" else {})
    from probe import distributed

    here = distributed.world()
    if here.parallel:  # started by torchrun: this process takes its share of the batches
        request = replace(request, device=distributed.device_for(request.device, here))
        with distributed.process_group(here, request.device):
            _run_sharded(mode, request, given, here, out_dir, options)
        return
    with no_empty_folder(out_dir):
        _publish(_analyse(mode, request, given, options, warn), out_dir)


def _analyse(mode: str, request, given, options: dict, warn_with, part=(0, 1)) -> xr.Dataset:
    """The --sample or --decompose Dataset of the ``request`` (:class:`probe.Model`) on
    ``given`` (:class:`probe.Inputs`), of one part of a torchrun job."""
    from probe.analyses import paths as analysis

    reporter = Reporter()
    with reporter.bar(0):
        run = analysis.sample if mode == "sample" else analysis.decompose
        return run(
            request,
            given,
            progress=reporter.update,
            warn=warn_with,
            part=part,
            **options,
        )


def _run_sharded(mode: str, request, given, here, out_dir: Path, options) -> None:
    """One rank of a torchrun job (:func:`cli.sharded.run_sharded`).

    --decompose: each rank decomposes its share of the batches, and rank 0 concatenates the
    shards along ``sequence`` (``probe.distributed.merge``).  --sample: each rank computes
    the sampled paths whose sequence its batches hold, and rank 0 takes each path's value
    from the one rank that computed it (``probe.distributed.merge_parts``).  Either way the
    result equals a single-process run's bit for bit and records ``world_size``.
    """
    from probe import distributed
    from probe.files.results import save_result

    from .sharded import rank_warn, run_sharded

    def work(folder: Path) -> None:
        part = (here.rank, here.size)
        ds = _analyse(mode, request, given, options, rank_warn(here), part)
        if mode == "sample" or ds.sizes["sequence"]:  # a rank past the last batch has none
            save_result(ds, distributed.shard_path(folder, here.rank, 0))

    def publish(folder: Path) -> None:
        shards = [distributed.shard_path(folder, rank, 0) for rank in range(here.size)]
        shards = [path for path in shards if path.exists()]
        if mode == "sample":
            ds = distributed.merge_parts(shards, here.size, "ratio")
        else:
            with distributed.merge(shards, here.size) as merged:  # closes the shards
                ds = merged.load()
        _publish(ds, out_dir)

    run_sharded(here, out_dir, work, publish)


def _publish(ds: xr.Dataset, out_dir: Path) -> None:
    """The table, then the result and its report, then the folder's index."""
    from .output import write_index

    printers = {
        "paths-count": print_count,
        "paths-sample": print_sample,
        "paths-decompose": print_decompose,
    }
    printers[ds.attrs["analysis"]](ds)
    nc, html = write_paths_result(ds, out_dir)
    named("result", nc)
    named("report", html)
    named("index", write_index(out_dir))


#: Options a mode has no use for: given anyway, they are refused rather than ignored.
#: (The fuzzer reads it too, as ``paths.not_for``, to write lines a mode accepts.)
NOT_FOR = {
    "count": (
        "samples",
        "init",
        "text",
        "sequences",
        "tokens",
        "seed",
        "device",
        "device_map",
        "max_memory",
        "offload_folder",
        "dtype",
        "batch_size",
        "config",
        "revision",
    ),
    "sample": ("layers", "heads"),
    "decompose": ("samples", "layers", "heads"),
}
paths.not_for = NOT_FOR  # read by the fuzzer: a line in one mode leaves these out


def write_paths_result(ds: xr.Dataset, out_dir: Path) -> tuple[Path, Path]:
    """DIR/<name>.nc and DIR/<name>.html as one unit (see probe.files.results.write_together)."""
    from probe.reports.paths_report import paths_report_name, render_paths

    from .output import write_pair

    name = paths_report_name(ds)
    return write_pair(ds, out_dir, name, render_paths(ds, result_file=f"{name}.nc"))


def print_count(ds: xr.Dataset) -> None:
    """One architecture: per-length exact counts; several: one row each."""
    if ds.sizes["architecture"] == 1:
        one = ds.isel(architecture=0)
        table = Table(
            title=f"{one.architecture.item()}: L={int(one.layers)}, H={int(one.heads)}",
            title_justify="left",
        )
        for column in ("k", "paths of length k", "share", "share up to k"):
            table.add_column(column, justify="right", overflow="fold")
        for k in ds.path_length.values:
            n = str(one["count"].sel(path_length=k).values)
            if n:
                table.add_row(
                    str(int(k)),
                    n,
                    f"{float(one['share'].sel(path_length=k)):.4g}",
                    f"{float(one['cumulative_share'].sel(path_length=k)):.4g}",
                )
        out.print(table)
        out.print(f"{one['total'].item()} paths in total; mean length {float(one.mean_length):.4g}")
        return
    table = Table(title="attention paths per architecture", title_justify="left")
    for column in ("architecture", "L", "H", "mean length", "log10 paths"):
        table.add_column(column, justify="left" if column == "architecture" else "right")
    for name in ds.architecture.values:
        one = ds.sel(architecture=name)
        table.add_row(
            str(name),
            str(int(one.layers)),
            str(int(one.heads)),
            f"{float(one.mean_length):.4g}",
            f"{float(one.log10_total):.4g}",
        )
    out.print(table)
    # Exact totals and sources as plain lines: a table cell would cut or fold them.
    out.print("paths in total, (H+1)^L:")
    for name in ds.architecture.values:
        out.print(f"  {name}: {ds['total'].sel(architecture=name).item()}")
    out.print("sources of (L, H):")
    for name in ds.architecture.values:
        out.print(f"  {name}: {ds['source'].sel(architecture=name).item()}")


def print_sample(ds: xr.Dataset) -> None:
    """Median distance to the best rank-one fit (the headline) and to 1p^T beside it."""
    from probe.figures.plot_paths import fit_decay
    from probe.measures.stats import shown

    order = "earliest-left" if "order" in ds.coords else "latest-left"
    fits = {fit: fit_decay(ds, fit=fit, order=order) for fit in ("svd", "mean")}
    table = Table(
        title=f"{ds.attrs['model']} · median ||P - rank1_SVD(P)|| / ||P|| (l1inf) along sampled "
        f"paths, P multiplied {order} (mean-row distance beside)",
        title_justify="left",
    )
    table.add_column("depth", justify="right")
    for init in ds.init.values:
        table.add_column(f"{init} SVD", justify="right")
        table.add_column(f"{init} mean row", justify="right")
    for d in ds.depth.values:
        table.add_row(
            str(int(d)),
            *(
                shown(float(fits[fit]["median"].sel(init=i, depth=d)), ds)
                for i in ds.init.values
                for fit in ("svd", "mean")
            ),
        )
    out.print(table)
    for init in ds.init.values:
        svd, mean = fits["svd"], fits["mean"]
        out.print(
            f"{init}: SVD distance {_fitted(svd, init, ds)} "
            f"(mean-row distance: {_fitted(mean, init, ds)})"
        )


def _fitted(fit: xr.Dataset, init: str, ds: xr.Dataset) -> str:
    """The fitted decay and order of one init with their quality, or why none was fitted."""
    from probe.figures.plot_paths import fit_texts

    rate, order = fit_texts(fit, init, str(ds.attrs.get("dtype", "float64")), missing="none")
    return f"log10 decay per layer {rate}, fitted order {order}"


def print_decompose(ds: xr.Dataset) -> None:
    last = int(ds.layer.max())
    for init in ds.init.values:
        one = ds.sel(init=init, norm="fro")
        table = Table(
            title=f"{ds.attrs['model']} · {init} · SAN+skip output (layer {last}) by path length",
            title_justify="left",
        )
        for column in ("k", "norm share", "count share", "error keeping <= k", ds.attrs["task"]):
            table.add_column(column, justify="right")
        task = ds["loss" if "loss" in ds else "cosine"].sel(init=init).mean("sequence")
        for k in ds.path_length.values:
            table.add_row(
                str(int(k)),
                f"{float(one['share'].sel(layer=last, path_length=k).mean('sequence')):.3g}",
                f"{float(ds['uniform_share'].sel(layer=last, path_length=k)):.3g}",
                f"{float(one['truncation_error'].sel(layer=last, path_length=k).mean('sequence')):.3g}",
                f"{float(task.sel(path_length=k)):.4g}",
            )
        out.print(table)
        eff = float(one["effective_length"].sel(layer=last).mean("sequence"))
        out.print(
            f"{init}: effective path length {eff:.3g} "
            f"(count mean {float(ds['uniform_mean_length'].sel(layer=last)):.3g})"
        )
