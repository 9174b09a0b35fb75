"""How the CLI talks: one-line errors with exit code 2, rich tables, a progress bar."""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager

import typer
import typer.core
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from probe.errors import ProbeError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

USAGE = 2

#: The arguments of the running command, for the "reproduce with" line of results.
invocation: list[str] = []


def fail(message: str, code: int = USAGE):
    """Print ``probe: error: message`` on one line and exit."""
    err.print(f"probe: error: {message}", markup=False)
    raise SystemExit(code)


def warn(message: str) -> None:
    err.print(f"probe: warning: {message}", markup=False)


class OneLineErrors(typer.core.TyperGroup):
    """A command group whose usage errors are one line and exit 2, never a traceback.

    ProbeError, the library's user-facing error, is turned into that line here,
    once, so commands call the library without wrapping it.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        invocation[:] = list(sys.argv[1:] if args is None else args)
        try:
            result = super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=False,
                **extra,
            )
        except typer.TyperException as exc:  # typer's own (vendored click) errors
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `probe`: the help is the answer
                out.print(exc.format_message(), markup=False)
                raise SystemExit(0) from None
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            fail(f"{exc.format_message()}{hint}", code=getattr(exc, "exit_code", USAGE))
        except ProbeError as exc:
            fail(str(exc))
        except typer.Exit as exc:
            raise SystemExit(exc.exit_code) from None
        except (typer.Abort, KeyboardInterrupt):
            fail("interrupted; nothing was written", code=130)
        raise SystemExit(result if isinstance(result, int) else 0)


@contextmanager
def progress_bar(enabled: bool = True):
    """Yield ``update(done, total, label)``; a bar on a terminal, silence elsewhere."""
    if not enabled or not err.is_terminal:
        yield lambda done, total, label: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("probing", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        yield update


def command_line() -> str:
    """The running command as a user would type it."""
    return shlex.join(["probe", *invocation])
