"""The ``probe`` command: parse -> analysis -> result file -> report.

Thin on purpose: everything it does is a call a notebook can make too.  This module makes
the command tree, all of it in :data:`COMMANDS`; each command lives in a module of its own,
which imports the library's heavy parts (torch, transformers, xarray) only when it runs, so
``probe --help`` answers at once.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .attention_cmd import attention
from .check_cmd import check
from .collapse_cmd import Fit, Metric, Norm, Surgery, collapse
from .console import OneLineErrors, out
from .fastformer_cmd import fastformer_app
from .help import Typer
from .models_cmd import list_models
from .paths_cmd import paths
from .report_cmd import compare, report_app
from .sweep_cmd import sweep
from .toy_cmd import toy_app

#: Every command of ``probe`` by name, in the order ``probe --help`` lists them: a function
#: is a command, a Typer a group of subcommands.  Typer lists the commands before the groups
#: whatever the order here, so the groups come last.
COMMANDS = (
    ("collapse", collapse),
    ("check", check),
    ("models", list_models),
    ("compare", compare),
    ("paths", paths),
    ("attention", attention),
    ("sweep", sweep),
    ("report", report_app),
    ("fastformer", fastformer_app),
    ("toy", toy_app),
)

#: What other code takes from here: the app, its entry point, its commands, and the choices
#: ``probe collapse`` offers, in the CLI's spelling of the library's names (``relative-residual``).
__all__ = ["COMMANDS", "Fit", "Metric", "Norm", "Surgery", "app", "main"]

app = Typer(
    cls=OneLineErrors,
    name="probe",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


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


def _register() -> None:
    for name, command in COMMANDS:
        if isinstance(command, typer.Typer):
            app.add_typer(command, name=name)
        else:
            app.command(name)(command)


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
