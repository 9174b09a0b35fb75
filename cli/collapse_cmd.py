"""``probe collapse``: probe each model, print its table, write result, report and index."""

from __future__ import annotations

from pathlib import Path

import xarray as xr
from rich.table import Table

from probe.analyses import collapse
from probe.errors import ProbeError

from .console import command_line, err, out, progress_bar, warn
from .output import write_comparison, write_index, write_result


def run_collapse(
    models: list[str], *, metric: str, norm: str, fit: str, out_dir: Path, **options
) -> None:
    _check_out_dir(out_dir)
    command = command_line()
    results: list[tuple[xr.Dataset, Path]] = []
    for model in models:
        with progress_bar() as update:
            ds = collapse.run(model, progress=update, warn=warn, command=command, **options)
        nc, html = write_result(ds, out_dir)
        results.append((ds, nc))
        print_table(ds, metric, norm, fit)
        out.print(f"result: {nc}")
        out.print(f"report: {html}")
    if len(results) > 1:
        comparison = write_comparison([ds for ds, _ in results], [nc for _, nc in results], out_dir)
        out.print(f"comparison: {comparison}")
    out.print(f"index: {write_index(out_dir)}")


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ProbeError(f"--out {out_dir} is a file; give a folder")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot create --out {out_dir}: {exc.strerror}") from None


def select(ds: xr.Dataset, metric: str, norm: str = "l1inf", fit: str = "mean") -> xr.DataArray:
    values = ds[metric]
    if metric == "relative_residual":
        values = values.sel(norm=norm, fit=fit)
    return values


def print_table(ds: xr.Dataset, metric: str, norm: str = "l1inf", fit: str = "mean") -> None:
    """One table per init: layers down, variants across, mean over sequences (± std)."""
    values = select(ds, metric, norm, fit)
    mean, std = values.mean("sequence"), values.std("sequence")
    label = metric.replace("_", " ") + (
        f" ({norm}, residual to the {fit})" if metric == "relative_residual" else ""
    )
    for init in ds.init.values:
        table = Table(title=f"{ds.attrs['model']} · {init} · {label}", title_justify="left")
        table.add_column("layer", justify="right")
        for variant in ds.variant.values:
            table.add_column(str(variant), justify="right")
        for layer in ds.layer.values:
            cells = [
                f"{float(mean.sel(init=init, variant=v, layer=layer)):.3g} ± "
                f"{float(std.sel(init=init, variant=v, layer=layer)):.1g}"
                for v in ds.variant.values
            ]
            table.add_row(str(int(layer)), *cells)
        out.print(table)
    if ds.attrs.get("inputs") == "synthetic ids":
        err.print(
            "probe: note: no tokenizer could be loaded; inputs are seeded random token ids",
            markup=False,
        )
