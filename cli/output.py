"""Writing what a command produced: the result file, its report, the folder's index.

Every folder is checked before any computation (``check_out_dir``); a result and
its report are put in place together, or not at all; every write first removes
temporary files that a killed run left behind.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import xarray as xr

from probe.files.results import (
    check_space,
    folder_lock,
    make_parent,
    utc_now,
    write_netcdf,
    write_together,
)
from probe.reports import (
    comparison_name,
    index_entries,
    render,
    render_comparison,
    render_index,
    report_name,
)
from probe.requests import checks

from .console import wrote

#: Room a command's pages need at the least (a report with its figures, the index): checked
#: with the folder, before any work; a result's own size is checked where it is known.
PAGES_BYTES = 2 * 2**20


def check_out_dir(folder: Path, option: str = "--out", needed: int = PAGES_BYTES) -> Path:
    """Make sure results can be written to ``folder`` (tried, not created: see
    :func:`probe.requests.checks.writable_folder`), and that its disk has ``needed`` bytes free."""
    checks.writable_folder(folder, option)
    check_space(folder, needed, "the results and their reports")
    return folder


@contextlib.contextmanager
def no_empty_folder(*folders: Path):
    """Folders this command creates (and their new parents) and leaves empty when it fails
    or is interrupted are removed again: such a command leaves nothing behind."""
    created = []
    for folder in folders:
        folder = Path(folder)
        missing = []
        while not folder.exists() and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        created += missing  # deepest first
    try:
        yield
    except BaseException:
        for folder in created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty
        raise


def result_paths(ds: xr.Dataset, out_dir: Path) -> tuple[Path, Path]:
    name = report_name(ds)
    return out_dir / f"{name}.nc", out_dir / f"{name}.html"


def write_result(ds: xr.Dataset, out_dir: Path, streamed: Path | None = None) -> tuple[Path, Path]:
    """DIR/<name>.nc and DIR/<name>.html of a collapse result, as one unit; both paths.

    ``streamed``: the netCDF file ``ds`` was streamed into (and is read from); it is moved
    into place instead of being written again.
    """
    nc, _ = result_paths(ds, out_dir)
    return write_pair(ds, out_dir, nc.stem, render(ds, result_file=nc.name), streamed)


def write_pair(
    ds: xr.Dataset, out_dir: Path, name: str, page: str, streamed: Path | None = None
) -> tuple[Path, Path]:
    """DIR/<name>.nc (``ds``, or the file ``streamed``) and DIR/<name>.html (``page``),
    put in place together."""
    nc, html = out_dir / f"{name}.nc", out_dir / f"{name}.html"
    write_together(
        {
            nc: (lambda tmp: os.replace(streamed, tmp))
            if streamed is not None
            else (lambda tmp: write_netcdf(ds, tmp)),
            html: lambda tmp: Path(tmp).write_text(page, encoding="utf-8"),
        },
        committed=lambda paths: wrote(*paths),
    )
    return nc, html


def write_report(ds: xr.Dataset, nc: Path, out_dir: Path) -> Path:
    """Render the report of an existing result file into ``out_dir``."""
    name = nc.stem
    rel = Path(relative_to_folder(nc, out_dir))
    return write_page(out_dir / f"{name}.html", render(ds, result_file=str(rel)))


def print_family_table(datasets: list[xr.Dataset], threshold: float = 1e-3) -> None:
    """The comparison's first table on the terminal (the report opens with the same)."""
    from rich.table import Table

    from probe.measures.stats import comparison_rows
    from probe.names import VARIANTS

    from .console import out

    rows = comparison_rows(datasets, threshold)
    variants = [v for v in VARIANTS if any(v in row["final"] for row in rows)]
    table = Table(
        title="across models",
        title_justify="left",
        caption=f"r after the last layer (mean over sequences; '<' marks a value under the "
        f"run's precision floor); SAN<{threshold:g}: the first layer where SAN's r is below "
        "it; order: SAN's fitted order of collapse (± its standard error, layer pairs fitted)",
        caption_justify="left",
    )
    for column in ("model", "init", "layers", *variants, f"SAN<{threshold:g}", "order"):
        table.add_column(column, justify="left" if column in ("model", "init") else "right")
    for row in rows:
        table.add_row(
            row["model"],
            row["init"],
            str(row["layers"]),
            *(row["final_text"].get(v, "—") for v in variants),
            "—" if row["san_below"] is None else str(row["san_below"]),
            "—" if row["order"] is None else f"{row['order']:.2f} ({row['order_note']})",
        )
    out.print(table)
    for row in rows:  # why an order is missing, once per model and init
        if row["order"] is None and row["order_note"]:
            out.print(f"{row['model']} {row['init']}: no SAN order ({row['order_note']})")


def write_comparison(datasets: list[xr.Dataset], files: list[Path], out_dir: Path) -> Path:
    name = comparison_name(datasets)
    html = render_comparison(
        datasets, [relative_to_folder(f, out_dir) for f in files], created=utc_now()
    )
    return write_page(out_dir / f"{name}.html", html)


def write_index(out_dir: Path) -> Path:
    """Rewrite DIR/index.html from the reports in DIR.  Listing and writing happen under the
    folder's lock: a concurrent run's report, put in place meanwhile, is never dropped."""
    make_parent(out_dir / "index.html")
    with folder_lock(out_dir):
        return write_page(out_dir / "index.html", render_index(index_entries(out_dir)))


def write_page(path: Path, page: str) -> Path:
    """One HTML page, atomically, recorded as written the moment it is in place."""
    write_together(
        {path: lambda tmp: Path(tmp).write_text(page, encoding="utf-8")},
        committed=lambda paths: wrote(*paths),
    )
    return path


def relative_to_folder(path: Path, folder: Path) -> str:
    """``path`` as a report in ``folder`` links it: relative where it lies below, else a URI."""
    try:
        return Path(path).resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        return Path(path).resolve().as_uri()
