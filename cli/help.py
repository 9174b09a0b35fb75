"""How ``--help`` lays a command out: its options in panels, each entry one sentence and one
bracket of facts.

Every option names its panel where it is declared (``rich_help_panel=MODEL``; the shared
options once, in :mod:`cli.options`), so an option reads the same in every command that
takes it.  The panels come in the order of :data:`PANELS`, after the arguments; within a
panel the options keep the command's order.  An entry reads::

    --tokens N          Real tokens per sequence.  [≥ 2; default: 128]

the option and its metavar (the domain's: ``N``, ``SEED``, ``DIR``, ``FILE``, never click's
``INTEGER`` or a Python type), its help sentence, then one bracket: the values it takes
(:meth:`cli.domains.Domain.describe`), its default (shown once: the value the command
starts from, or the words a declaration gives in ``show_default`` where the default
depends on other options) and whether it is required.
"""

from __future__ import annotations

import copy
import inspect
import textwrap
import typing
from enum import Enum
from typing import Annotated

import typer
import typer.core

from .domains import domain_of

MODEL = "Model"
INPUTS = "Inputs"
GRID = "Grid"
ANALYSIS = "Analysis"
TRAINING = "Training"
RUNNING = "Running"
OUTPUT = "Output"
#: The panels, in the order ``--help`` lists them; options without one come last.
PANELS = (MODEL, INPUTS, GRID, ANALYSIS, TRAINING, RUNNING, OUTPUT)
OTHER = "Options"
#: The widest option column; a longer option starts its own line, its help below it.
COLUMN = 24


def facts(param, ctx) -> str:
    """``[≥ 2; default: 128]``: the domain, the default and whether it is required."""
    found = []
    domain = domain_of(param)
    if domain is not None and domain.describe():
        found.append(domain.describe())
    default = _default(param, ctx)
    if default:
        found.append(f"default: {default}")
    if param.required:
        found.append("required")
    return f"[{'; '.join(found)}]" if found else ""


def _default(param, ctx) -> str:
    shown = getattr(param, "show_default", True)
    if isinstance(shown, str):
        return shown
    if not shown:
        return ""
    value = param.get_default(ctx, call=False)
    if value is None or callable(value):
        return ""
    if getattr(param, "is_bool_flag", False):
        if param.secondary_opts:  # --sub-path / --no-sub-path: the one in effect
            return (param.opts if value else param.secondary_opts)[0].lstrip("-")
        return ""  # a lone flag is off unless given
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value.value if isinstance(value, Enum) else value)


def entry(param, ctx) -> tuple[str, str] | None:
    """(the option or argument as typed, its help and facts) for one row of the help."""
    if getattr(param, "hidden", False):
        return None
    if param.param_type_name == "argument":
        name = (param.metavar or param.name.upper()) + ("..." if param.nargs != 1 else "")
    else:
        name = _joined(param.opts)
        if param.secondary_opts:
            name += " / " + _joined(param.secondary_opts)
        if not param.is_flag and not param.count:
            name += f" {param.metavar or param.make_metavar(ctx)}"
    return name, "  ".join(part for part in ((param.help or "").strip(), facts(param, ctx)) if part)


def _joined(opts) -> str:
    """``-q, --quiet``: the short spelling first."""
    return ", ".join(sorted(opts, key=lambda opt: len(opt) - len(opt.lstrip("-"))))


def panel(param) -> str:
    return getattr(param, "rich_help_panel", None) or OTHER


def write_sections(formatter, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
    """Each section under its title, the help of every section in one column, wrapped at
    spaces only: ``probe-reports``, ``relative-residual`` and ``≥ 1`` stay whole."""
    names = [name for _, rows in sections for name, _ in rows]
    column = min(COLUMN, max(map(len, names), default=0))
    for title, rows in sections:
        with formatter.section(title):
            lead = " " * formatter.current_indent
            room = max(formatter.width - formatter.current_indent - column - 2, 20)
            for name, text in rows:
                lines = textwrap.wrap(
                    text.replace("≥ ", "≥\0"),
                    room,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
                lines = [line.replace("\0", " ") for line in lines] or [""]
                if len(name) > column:  # the help starts below the option
                    formatter.write(f"{lead}{name}\n")
                    lines[0] = " " * (column + 2) + lines[0]
                else:
                    lines[0] = f"{name.ljust(column)}  {lines[0]}"
                for index, line in enumerate(lines):
                    pad = "" if index == 0 else " " * (column + 2)
                    formatter.write(f"{lead}{pad}{line}".rstrip() + "\n")


def described(annotation, words: str):
    """``annotation`` (``Annotated[type, typer.Option(...)]``) whose default ``--help`` gives
    as ``words``: a default the command resolves itself (None in the signature)."""
    base, info, *rest = typing.get_args(annotation)
    info = copy.copy(info)
    info.show_default = words
    return Annotated[(base, info, *rest)]


def defaults_in_words(**words: str):
    """A command whose ``--help`` gives the default of each named parameter as ``words``
    (``@defaults_in_words(width="2")``: a task's size, which the library resolves)."""

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        unknown = set(words).difference(signature.parameters)
        if unknown:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(unknown))}")
        params = [
            param.replace(annotation=described(param.annotation, words[param.name]))
            if param.name in words
            else param
            for param in signature.parameters.values()
        ]
        command.__signature__ = signature.replace(parameters=params)
        command.__annotations__ = {param.name: param.annotation for param in params}
        return command

    return decorate


class HelpCommand(typer.core.TyperCommand):
    """A command whose ``--help`` lists its options in panels (see the module)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["rich_markup_mode"] = None  # click's plain layout, with the sections below
        super().__init__(*args, **kwargs)

    def format_options(self, ctx, formatter) -> None:
        arguments, panels = [], {}
        for param in self.get_params(ctx):
            row = entry(param, ctx)
            if row is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(row)
            else:
                panels.setdefault(panel(param), []).append(row)
        order = {name: i for i, name in enumerate(PANELS)}
        ordered = sorted(panels.items(), key=lambda item: order.get(item[0], len(PANELS)))
        write_sections(formatter, ([("Arguments", arguments)] if arguments else []) + ordered)


class HelpGroup(typer.core.TyperGroup):
    """A group whose ``--help`` gives each command's first sentence whole, never cut."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class Typer(typer.Typer):
    """``typer.Typer`` whose commands are :class:`HelpCommand` and whose groups are
    :class:`HelpGroup` unless told otherwise."""

    def __init__(self, *args, cls=None, **kwargs) -> None:
        kwargs.setdefault("rich_markup_mode", None)
        super().__init__(*args, cls=cls or HelpGroup, **kwargs)

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or HelpCommand, **kwargs)
