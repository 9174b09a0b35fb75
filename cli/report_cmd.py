"""``probe report list|open|build`` and ``probe compare``: reports from result files."""

from __future__ import annotations

import os
import sys
import webbrowser
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from probe.reports import index_entries
from probe.results import open_result

from .console import fail, out
from .output import write_comparison, write_index, write_report

DEFAULT_DIR = Path("probe-reports")

report_app = typer.Typer(help="List, open and rebuild reports.", no_args_is_help=True)


def _folder(folder: Path) -> Path:
    if not folder.is_dir():
        fail(f"no report folder {folder}; run `probe collapse ...` first or pass the folder")
    return folder


@report_app.command("list")
def list_reports(
    folder: Annotated[Path, typer.Argument(help="Folder of reports.")] = DEFAULT_DIR,
) -> None:
    """List the reports in a folder, newest first."""
    entries = index_entries(_folder(folder))
    if not entries:
        out.print(f"no reports in {folder}")
        return
    table = Table(title=f"reports in {folder}", title_justify="left")
    for column in ("created", "model", "analysis", "variants", "init"):
        table.add_column(column)
    table.add_column("file", overflow="fold")
    for e in entries:
        when = e["created"][:16].replace("T", " ")
        table.add_row(
            when, e["model"], e["analysis"], e["variants"].replace(",", ", "), e["init"], e["file"]
        )
    out.print(table)


@report_app.command("open")
def open_report(
    target: Annotated[
        str, typer.Argument(help="A report (.html), its result (.nc), or `latest`.")
    ] = "latest",
    folder: Annotated[
        Path, typer.Option("--dir", help="Folder searched for `latest`.")
    ] = DEFAULT_DIR,
) -> None:
    """Open a report in the default browser; where there is none, print its path."""
    path = _resolve(target, folder)
    out.print(str(path))
    if _has_display() and webbrowser.open(path.resolve().as_uri()):
        return
    out.print("(no browser here: open the file above)")


@report_app.command("build")
def build_report(
    result: Annotated[Path, typer.Argument(help="A result file written by probe (.nc).")],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for the report [default: the result's folder]."),
    ] = None,
) -> None:
    """Render a report again from its result file, and rewrite the folder's index."""
    ds = open_result(result)
    folder = out_dir or result.parent
    html = write_report(ds, result, folder)
    out.print(f"report: {html}")
    out.print(f"index: {write_index(folder)}")


def compare(
    results: Annotated[
        list[Path], typer.Argument(help="Result files (.nc) to compare.", metavar="RESULT")
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for the comparison report.")
    ] = DEFAULT_DIR,
) -> None:
    """Compare results of several models in one report, one panel per model."""
    datasets = [open_result(path) for path in results]
    analyses = {ds.attrs.get("analysis") for ds in datasets}
    if analyses != {"collapse"}:
        fail(f"can only compare collapse results; got {', '.join(sorted(map(str, analyses)))}")
    html = write_comparison(datasets, list(results), out_dir)
    out.print(f"comparison: {html}")
    out.print(f"index: {write_index(out_dir)}")


def _resolve(target: str, folder: Path) -> Path:
    if target == "latest":
        entries = index_entries(_folder(folder))
        if not entries:
            fail(f"no reports in {folder}; run `probe collapse ...` first")
        return folder / entries[0]["file"]
    path = Path(target)
    if path.suffix == ".nc":
        path = path.with_suffix(".html")
    if not path.is_file():
        fail(f"no such report: {path}")
    return path


def _has_display() -> bool:
    """A browser can only show something where there is a screen."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
