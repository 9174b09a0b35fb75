"""``probe report list|open|build`` and ``probe compare``: reports from result files.

Heavy modules (xarray, matplotlib, seaborn) are imported inside the commands, so
``probe --help`` starts at once.
"""

from __future__ import annotations

import glob
import os
import sys
import webbrowser
from pathlib import Path
from typing import Annotated

from probe.errors import ProbeError
from probe.requests import checks

from .console import fail, named, out, shown
from .domains import InFolder, OutFolder, ResultFile, Text, argument, option
from .help import OUTPUT, Typer

DEFAULT_DIR = Path("probe-reports")

report_app = Typer(
    help="List, open and rebuild reports.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)

Folder = Annotated[
    Path | None,
    option(
        "--out",
        domain=InFolder("report folder"),
        help="Folder of reports.",
        show_default=str(DEFAULT_DIR),
        rich_help_panel=OUTPUT,
    ),
]


def _folder(folder: Path) -> Path:
    if not folder.is_dir():
        fail(f"no report folder {folder}; run `probe collapse ...` first or pass the folder")
    return folder


@report_app.command("list")
def list_reports(
    folder: Annotated[
        Path | None,
        argument(
            "FOLDER",
            InFolder("report folder"),
            help="Folder of reports.",
            show_default=str(DEFAULT_DIR),
        ),
    ] = None,
    out_dir: Folder = None,
) -> None:
    """List the reports in a folder, newest first, with the settings that tell them apart."""
    from rich.table import Table

    from probe.reports import index_entries
    from probe.reports.naming import model_stem

    if folder is not None and out_dir is not None and folder != out_dir:
        fail("give the folder once: as an argument or with --out")
    folder = _folder(folder or out_dir or DEFAULT_DIR)
    entries = index_entries(folder)
    if not entries:
        out.print(f"no reports in {shown(folder)}", markup=False)
        return
    table = Table(
        title=f"reports in {folder}",
        title_justify="left",
        caption="id: the settings hash at the end of each file name",
        caption_justify="left",
    )
    table.add_column("created", no_wrap=True)
    table.add_column("model", overflow="fold", ratio=2)
    table.add_column("init", overflow="fold")
    table.add_column("settings", overflow="fold", ratio=3)
    table.add_column("id", no_wrap=True)
    for e in entries:
        when = e["created"][5:16].replace("T", " ")  # MM-DD HH:MM
        what = e["settings"]
        if e["analysis"] != "collapse":
            what = e["analysis"] + (f" · {what}" if what else "")
        models = ", ".join(model_stem(m) for m in e["model"].split(",") if m.strip())
        table.add_row(when, models or e["file"], e["init"].replace(",", ", "), what, e["id"])
    out.print(table)


@report_app.command("open")
def open_report(
    target: Annotated[
        str,
        argument("TARGET", Text(), help="A report (.html), its result (.nc), or `latest`."),
    ] = "latest",
    out_dir: Folder = None,
) -> None:
    """Open a report in the default browser; where there is none, print its path."""
    path = _resolve(target, out_dir or DEFAULT_DIR)
    out.print(shown(path), markup=False)
    if _has_display() and webbrowser.open(path.resolve().as_uri()):
        return
    out.print("(no browser here: open the file above)")


@report_app.command("build")
def build_report(
    results: Annotated[
        list[Path],
        argument("RESULT", ResultFile(), help="Result files written by probe (.nc)."),
    ],
    out_dir: Annotated[
        Path | None,
        option(
            "--out",
            domain=OutFolder(),
            help="Folder for the reports.",
            show_default="each result's folder",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
) -> None:
    """Render reports again from their result files, and rewrite the folder's index."""
    from probe.files.results import check_schema, open_result

    from .output import check_out_dir, no_empty_folder, write_index, write_page

    results = _expand(results)
    folders = {result: check_out_dir(out_dir or result.parent) for result in results}
    targets = [(folders[r] / f"{r.stem}.html").resolve() for r in results]
    twice = sorted({str(r) for r, t in zip(results, targets, strict=True) if targets.count(t) > 1})
    if twice:
        raise ProbeError(
            f"{', '.join(twice)}: given more than once, or their reports would have one name; "
            "give each result once (or another --out)"
        )
    datasets = [open_result(result) for result in results]
    for ds, result in zip(datasets, results, strict=True):
        check_schema(ds, result)
    pages = [
        _rendered(ds, result, folder)
        for (result, folder), ds in zip(folders.items(), datasets, strict=True)
    ]
    with no_empty_folder(*dict.fromkeys(folders.values())):
        for html, page in pages:  # every page rendered before the first is written
            named("report", write_page(html, page))
        for folder in dict.fromkeys(folders.values()):
            named("index", write_index(folder))


def _rendered(ds, result: Path, folder: Path) -> tuple[Path, str]:
    """(the report's path, its page) for a result file that passed its schema check.

    A file can be damaged in more ways than a schema names (edited attributes, NaN where
    numbers belong); whatever rendering then trips on is said in one line.
    """
    from probe.reports import render

    from .output import relative_to_folder

    try:
        page = render(ds, result_file=relative_to_folder(result, folder))
    except ProbeError:
        raise
    except Exception as err:  # KeyError, ValueError, TypeError, ... from a damaged file
        raise ProbeError(
            f"cannot render {result}: it was damaged or edited ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:200]}); run the probe again"
        ) from None
    return folder / f"{result.stem}.html", page


def compare(
    results: Annotated[
        list[Path], argument("RESULT", ResultFile(), help="Result files (.nc) to compare.")
    ],
    out_dir: Annotated[
        Path,
        option(
            "--out",
            domain=OutFolder(),
            help="Folder for the comparison report.",
            rich_help_panel=OUTPUT,
        ),
    ] = DEFAULT_DIR,
) -> None:
    """Compare results of several models in one report, one panel per model."""
    from probe.files.results import open_result

    from .output import (
        check_out_dir,
        no_empty_folder,
        print_family_table,
        write_comparison,
        write_index,
    )

    results = _expand(results)
    if len(results) < 2:
        fail("compare needs at least two result files; `probe report build` renders one")
    resolved = [path.resolve() for path in results]
    twice = sorted({str(p) for p in results if resolved.count(Path(p).resolve()) > 1})
    if twice:
        fail(f"{', '.join(twice)} given more than once; compare different results")
    check_out_dir(out_dir)
    datasets = [open_result(path) for path in results]
    _require_collapse(datasets, results)
    with no_empty_folder(out_dir):
        html = write_comparison(datasets, list(results), out_dir)
        print_family_table(datasets)
        named("comparison", html)
        named("index", write_index(out_dir))


def _expand(paths: list[Path]) -> list[Path]:
    """Expand glob patterns the shell left alone (quoted, or on Windows), in sorted order."""
    expanded: list[Path] = []
    for path in paths:
        text = str(path)
        if not path.exists() and any(c in text for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(text))
            if not matches:
                raise ProbeError(f"no result file matches {text}")
            expanded += matches
        else:
            expanded.append(path)
    return expanded


def _require_collapse(datasets, paths) -> None:
    from probe.files.results import check_schema

    for ds, path in zip(datasets, paths, strict=True):
        if ds.attrs.get("analysis") != "collapse":
            raise ProbeError(
                f"{path} is a {ds.attrs.get('analysis')} result; this command renders collapse results"
            )
        check_schema(ds, path)


def _resolve(target: str, folder: Path) -> Path:
    from probe.reports import index_entries

    if target == "latest":
        entries = index_entries(_folder(folder))
        if not entries:
            fail(f"no reports in {folder}; run `probe collapse ...` first")
        return folder / entries[0]["file"]
    checks.path_length(target, "TARGET")
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
