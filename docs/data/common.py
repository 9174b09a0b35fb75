"""What the scripts writing docs/data's measured tables share.

Each keeps every result it computes as a file in its ``--out`` folder and reuses a file
already there, so an interrupted run picks up where it stopped (``kept``, and ``per_model``
for a table with one result per model), and heads each table with a note saying the
machine, the versions, the results' own date and the command that measured it (``note``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import xarray as xr


def kept(path: Path, make: Callable[[], xr.Dataset], label: str | None = None) -> xr.Dataset:
    """The result saved at ``path``; where there is none yet, ``make()``'s, saved there first
    (and, with ``label``, said on a line)."""
    from probe import open_result, save_result

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_result(make(), path)
        if label is not None:
            print(f"{label}: {path}", flush=True)
    return open_result(path)


def per_model_arguments(doc: str, models: Iterable[str], out: Path, table: Path):
    """The parser of a one-result-per-model table: ``--models``, ``--from`` (tabulate
    existing results), ``--out`` (where results are kept), ``--table`` (the Markdown)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(models))
    parser.add_argument("--from", dest="results", nargs="+", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--table", type=Path, default=table)
    return parser


def per_model(args, run_model: Callable[[str], xr.Dataset]) -> list[xr.Dataset]:
    """The results ``--from`` names; else ``run_model(name)``'s for each of ``--models``,
    each kept in ``--out`` as NAME.nc (a "/" in the name written "--")."""
    if args.results is not None:
        return [xr.load_dataset(p) for p in args.results]
    return [
        kept(args.out / (name.replace("/", "--") + ".nc"), partial(run_model, name), name)
        for name in args.models
    ]


def where() -> str:
    """The machine, its cores and the versions a table was measured with."""
    import os
    import platform
    from importlib import metadata

    versions = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("torch", "transformers", "nnsight")
    )
    cpu = platform.processor() or platform.machine()
    return (
        f"{platform.system()} {cpu}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {versions}"
    )


def note(command: str, datasets: list[xr.Dataset] = (), details: str = "", extra: str = "") -> str:
    """The line above a table: where it was measured, on the results' own date (UTC) when
    ``datasets`` are given, by ``command`` (with ``details`` in brackets), then ``extra``."""
    when = ""
    if datasets:
        when = f", on {max(ds.attrs['created'] for ds in datasets)[:10]} (UTC)"
    details = f" ({details})" if details else ""
    return f"*Measured on {where()}{when}, by `{command}`{details}.{extra}*\n\n"
