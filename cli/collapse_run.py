"""``probe collapse``: check and load everything, probe each model, write results and reports.

Order matters for trust: every model, text and output folder is checked (and
every model loaded) before the first forward pass, so a typo in the third model
never leaves the first one's result behind with no index and no comparison.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import xarray as xr
from rich.table import Table

from probe import distributed
from probe.analyses import collapse
from probe.analyses.collapse_measure import empty
from probe.files.results import ENGINE, check_space, temp_beside
from probe.files.stream import CHUNK_SEQUENCES
from probe.measures.stats import shown
from probe.requests.request import Inputs, Model

from .console import Reporter, checked, command_line, err, named, out, warn
from .output import (
    PAGES_BYTES,
    check_out_dir,
    no_empty_folder,
    print_family_table,
    write_comparison,
    write_index,
    write_result,
)
from .sharded import rank_warn, run_sharded


def run_collapse(
    models: list[Model],
    inputs: Inputs,
    *,
    metric: str,
    norm: str,
    fit: str,
    out_dir: Path,
    **options,
) -> None:
    """Probe each of ``models`` on ``inputs``; ``options`` are the collapse analysis' own."""
    check_out_dir(out_dir)
    here = distributed.world()
    if here.parallel:  # started by torchrun: this process probes its share
        device = distributed.device_for(models[0].device, here)
        models = [replace(model, device=device) for model in models]
        with distributed.process_group(here, device):
            _run_sharded(models, inputs, here, metric, norm, fit, out_dir, options)
        return
    with no_empty_folder(out_dir):
        _run(models, inputs, metric, norm, fit, out_dir, options)


def _run(models, inputs, metric, norm, fit, out_dir: Path, options: dict) -> None:
    command = command_line()
    reporter = Reporter()
    plans = []
    for model in models:
        with reporter.loading(f"loading {model.name} ({_inits(model)} weights)"):
            plans.append(collapse.prepare(model, inputs, warn=warn, command=command, **options))
    reporter.loaded()
    check_space(out_dir, needed_bytes(plans), "the results and their reports")
    checked()
    results: list[tuple[xr.Dataset, Path]] = []
    # Results go to disk batch by batch (probe.files.stream): host memory does not grow with the
    # number of sequences.  Each file is moved into place, next to its report, at the end.
    streams = [Path(temp_beside(out_dir / "collapse.nc")) for _ in plans]
    try:
        with reporter.bar(sum(plan.steps for plan in plans), summary=True):
            datasets = [
                collapse.execute(plan, progress=reporter.update, stream_to=stream)
                for plan, stream in zip(plans, streams, strict=True)
            ]
        for ds, stream in zip(datasets, streams, strict=True):
            nc, html = write_result(ds, out_dir, streamed=stream)
            results.append((ds, nc))  # still read lazily: its file was moved, not copied
            _print_result(ds, nc, html, metric, norm, fit)
        _finish(results, out_dir)
    finally:
        for ds, _ in results:
            ds.close()
        for stream in streams:  # left only by a failure
            stream.unlink(missing_ok=True)


def needed_bytes(plans) -> int:
    """Disk space the results of ``plans`` take, with their reports: each metric's values
    of one sequence (8 bytes each) times the sequences, plus a last HDF5 chunk of
    ``CHUNK_SEQUENCES`` allocated whole, plus its pages."""
    total = PAGES_BYTES
    for plan in plans:
        per_sequence = sum(values.nbytes for values in empty(plan, 1).values())
        total += per_sequence * (plan.inputs.sequences + CHUNK_SEQUENCES) + PAGES_BYTES
    return total


def _run_sharded(models, inputs, here, metric, norm, fit, out_dir, options) -> None:
    """One rank of a torchrun job (:func:`cli.sharded.run_sharded`): every rank loads,
    checks and probes its share of every model's batches into a shard; rank 0 then merges
    the shards (``open_mfdataset``) and writes each result with its report, the comparison
    and the index, exactly as a single process would."""
    command = command_line()
    part = (here.rank, here.size)
    plans: list = []

    def work(folder: Path) -> None:
        reporter = Reporter()
        for model in models:
            with reporter.loading(f"loading {model.name} ({_inits(model)} weights)"):
                plans.append(
                    collapse.prepare(
                        model, inputs, warn=rank_warn(here), command=command, **options
                    )
                )
        reporter.loaded()
        if here.main:  # the shards, then the results merged from them, beside them
            check_space(out_dir, 2 * needed_bytes(plans), "the shards and the results")
            checked()
        with reporter.bar(sum(plan.steps_of(part) for plan in plans)):
            for index, plan in enumerate(plans):
                path = distributed.shard_path(folder, here.rank, index)
                collapse.execute(plan, progress=reporter.update, stream_to=path, part=part).close()

    def publish(folder: Path) -> None:
        _publish(plans, folder, here.size, metric, norm, fit, out_dir)

    run_sharded(here, out_dir, work, publish)


def _publish(plans, folder: Path, size: int, metric, norm, fit, out_dir: Path) -> None:
    """Rank 0: each model's shards merged into its result and report; comparison, index."""
    results: list[tuple[xr.Dataset, Path]] = []
    try:
        for index, _ in enumerate(plans):
            shards = [distributed.shard_path(folder, rank, index) for rank in range(size)]
            ds = distributed.merge(shards, size)
            try:
                nc, html = write_result(ds, out_dir)
            finally:
                ds.close()
            ds = xr.open_dataset(nc, engine=ENGINE)
            results.append((ds, nc))
            _print_result(ds, nc, html, metric, norm, fit)
        _finish(results, out_dir)
    finally:
        for ds, _ in results:
            ds.close()


def _print_result(ds, nc, html, metric: str, norm: str, fit: str) -> None:
    # The table shows --metric, or the first metric computed where --metrics left it out.
    shown = metric if metric in ds.data_vars else ds.attrs["metrics"].split(",")[0]
    print_table(ds, shown, norm, fit)
    # no-sink / no-massive: what each removed, or one line saying it is the transformer.
    for line in filter(None, ds.attrs.get("removal_note", "").split("; ")):
        out.print(line, markup=False)
    named("result", nc)
    named("report", html)


def _finish(results: list, out_dir: Path) -> None:
    """The comparison of several models (and its table), then the folder's index."""
    if len(results) > 1:
        datasets = [ds for ds, _ in results]
        comparison = write_comparison(datasets, [nc for _, nc in results], out_dir)
        print_family_table(datasets)
        named("comparison", comparison)
    named("index", write_index(out_dir))


def select(ds: xr.Dataset, metric: str, norm: str = "l1inf", fit: str = "mean") -> xr.DataArray:
    values = ds[metric]
    if metric == "relative_residual":
        values = values.sel(norm=norm, fit=fit)
    return values


def print_table(ds: xr.Dataset, metric: str, norm: str = "l1inf", fit: str = "mean") -> None:
    """One table per init: layers down, variants across, mean ± std over sequences."""
    values = select(ds, metric, norm, fit)
    mean, std = values.mean("sequence"), values.std("sequence")
    label = metric.replace("_", " ") + (
        f" ({norm}, residual to the {fit})" if metric == "relative_residual" else ""
    )
    spread = f"mean ± std over {ds.sizes['sequence']} sequences"
    for init in ds.init.values:
        table = Table(
            title=f"{ds.attrs['model']} · {init} · {label}",
            caption=spread,
            title_justify="left",
            caption_justify="left",
        )
        table.add_column("layer", justify="right")
        for variant in ds.variant.values:
            table.add_column(str(variant), justify="right")
        for layer in ds.layer.values:
            cells = []
            for v in ds.variant.values:
                m = float(mean.sel(init=init, variant=v, layer=layer))
                s = float(std.sel(init=init, variant=v, layer=layer))
                # A distance to rank one under the run's precision floor is its rounding.
                text = shown(m, ds) if metric == "relative_residual" else f"{m:.3g}"
                cells.append(text if text.startswith("<") else f"{m:.3g} ± {s:.1g}")
            table.add_row(str(int(layer)), *cells)
        out.print(table)
    if ds.attrs.get("inputs") == "synthetic ids":
        err.print(
            "probe: note: no tokenizer could be loaded; inputs are seeded random token ids",
            markup=False,
        )
    if ds.attrs.get("weights_warning"):
        warn(str(ds.attrs["weights_warning"]))


def _inits(model: Model) -> str:
    """The weights a model loads, as the command line named them."""
    return "both" if len(model.init) == 2 else model.init[0]
