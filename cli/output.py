"""Writing what a command produced: the result file, its report, the folder's index."""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from probe.reports import (
    comparison_name,
    index_entries,
    render,
    render_comparison,
    render_index,
    report_name,
)
from probe.results import save_result, utc_now, write_text_atomic


def write_result(ds: xr.Dataset, out_dir: Path) -> tuple[Path, Path]:
    """DIR/<name>.nc and DIR/<name>.html; returns both paths."""
    name = report_name(ds)
    nc = save_result(ds, out_dir / f"{name}.nc")
    html = write_text_atomic(out_dir / f"{name}.html", render(ds, result_file=nc.name))
    return nc, html


def write_report(ds: xr.Dataset, nc: Path, out_dir: Path) -> Path:
    """Render the report of an existing result file into ``out_dir``."""
    name = nc.stem
    rel = Path(_relative(nc, out_dir))
    return write_text_atomic(out_dir / f"{name}.html", render(ds, result_file=str(rel)))


def write_comparison(datasets: list[xr.Dataset], files: list[Path], out_dir: Path) -> Path:
    name = comparison_name(datasets)
    html = render_comparison(datasets, [_relative(f, out_dir) for f in files], created=utc_now())
    return write_text_atomic(out_dir / f"{name}.html", html)


def write_index(out_dir: Path) -> Path:
    return write_text_atomic(out_dir / "index.html", render_index(index_entries(out_dir)))


def _relative(path: Path, folder: Path) -> str:
    try:
        return Path(path).resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        return Path(path).resolve().as_uri()
