"""How the CLI talks: one-line errors, clean interrupts, rich tables, progress.

Exit codes: 0 done, 2 a usage error (one line on stderr, ``probe: error: ...``),
130 interrupted by SIGINT (Ctrl-C), 143 stopped by SIGTERM, 129 by SIGHUP.  A signal is
recorded when it comes and raised at the command's next safe point (``probe.files.interrupts``);
the one line then says which files were written and that nothing else was: results and
their reports are written as one unit (``probe.files.results.write_together``), so a
result never appears without its report.  A signal that comes once the command has done
its work changes nothing: exit 0, and a line that names what was written.

Warnings of the libraries are not printed as they are: a numerical one becomes one probe
warning, the rest are dropped (``_as_note``).

Standard output that cannot be written (``probe collapse ... | head -1``, ``>/dev/full``,
``1>&-``) does not stop the command: its lines are dropped, its files still written, and one
warning says so at the end.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import typer
import typer.core
from rich.console import Console

from probe.errors import ProbeError, ProbeWarning
from probe.files.interrupts import (
    EXIT_CODES,
    Interrupted,
    check_at_module_calls,
    check_interrupt,
    handled,
    recorded,
)
from probe.files.names import command, quoted, readable

from .domains import OptionError, command_of, option_for, options_of
from .help import HelpGroup
from .streams import STDERR, STDOUT, stdout
from .tables import keep_whole


def _stdout_failed(exc: BaseException) -> bool:
    """Whether ``exc``, raised under a library's own print (click's help), means standard
    output cannot be written: a broken pipe (typer exits 1 for one, its streams wrapped), or
    a flush, or a write of no bytes, fails as it did (/dev/full refuses even that)."""
    if isinstance(exc, SystemExit):
        return exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper"
    try:
        stdout().flush()
        os.write(stdout().fileno(), b"")
    except io.UnsupportedOperation:  # a stream without a descriptor (a test's) took the text
        return isinstance(exc, BrokenPipeError)
    except (OSError, ValueError) as again:
        return getattr(again, "errno", None) == getattr(exc, "errno", None)
    return isinstance(exc, BrokenPipeError)


# Descriptor 1 closed before the start (``1>&-``): /dev/null takes it, so that no file the
# command opens gets number 1, where a stray write meant for the terminal would land.
if sys.stdout is None:
    try:
        os.fstat(1)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the lowest free descriptor: 1, or 0


class _Out(Console):
    """stdout's console: a table it prints never cuts a number, at any width (a pipe's 80
    columns, a narrow terminal).  Each column is at least as wide as its longest number
    (``0.00712``, ``1.2e-6``, ``71680361758720000000000``), each word of its header and
    its other words up to ``WORD`` cells (``float32``, ``pretrained``); a longer word folds
    onto the next line of its cell.  No cell ends in an ellipsis: a table whose numbers
    need more than the console's width is as wide as they need."""

    def print(self, *objects, **kwargs) -> None:
        from rich.table import Table

        for thing in objects:
            if isinstance(thing, Table):
                keep_whole(thing)
        super().print(*objects, **kwargs)


# Every line, table cell and label is printed as its text says: no rich markup ("[bold]")
# and no emoji codes (":-1:"), since model names, file names and values the user typed
# reach them verbatim.
out = _Out(file=STDOUT, highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(file=STDERR, highlight=False, soft_wrap=True, markup=False, emoji=False)

USAGE = 2

#: The arguments of the running command, for the "reproduce with" line of results.
invocation: list[str] = []
#: Files this command has put in place so far (results, reports, index), in order.
written: list[Path] = []
#: ``--quiet``: no progress output at all.
settings = {"quiet": False}


#: A library parameter as the library's messages name it: `tokens`, `batch_size`.
_PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")
#: Parameters the command line spells otherwise than --name-with-dashes.
_SPELLED = {"source": "MODEL", "ids": "token ids", "config": "--set"}
#: The command of the running command line (set while ``OneLineErrors.main`` runs).
running: list = []


def in_cli_words(message: str, command=None) -> str:
    """A library message as the command line says it: each `parameter` becomes the option of
    ``command`` (by default the running one; outside a command, the option of its name)
    that sets it (:func:`cli.domains.option_for`), so the library never names the CLI's
    flags and the user reads a flag the command has."""
    command = command if command is not None else (running[0] if running else None)
    flags = None if command is None else options_of(command)
    return _PARAMETER.sub(lambda m: option_for(m[1], flags, _SPELLED.get(m[1])), str(message))


def fail(message: str, code: int = USAGE):
    """Print ``probe: error: message`` on one line and exit.  In a torchrun job, an error
    met while the command still checks its input (every rank meets it alike) is printed by
    rank 0 alone; the other ranks exit with the same status, silent."""
    if held is None or _rank() == 0:
        # A name whose bytes are not UTF-8 shows them as \xNN (probe.files.names).
        line = " ".join(readable(in_cli_words(message)).split())
        err.print(f"probe: error: {line}", markup=False)
    raise SystemExit(code)


def _rank() -> int:
    """This process' rank in a torchrun job (0 outside one, or where RANK is not a number:
    the job's own checks say so)."""
    text = os.environ.get("RANK", "0").strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def warn(message: str) -> None:
    """A warning line; held while the command still checks its input (see ``checked``)."""
    say(f"probe: warning: {in_cli_words(message)}")


def say(line: str) -> None:
    """A line on stderr, held while the command still checks its input (see ``checked``)."""
    line = readable(line)  # a name whose bytes are not UTF-8: \xNN
    if held is not None:
        held.append(line)
    else:
        err.print(line, markup=False)


#: Warnings said while a command checks its input, printed once the checks have passed
#: (``checked``): a command refused after a warning prints only its error line.
held: list[str] | None = None


def checked() -> None:
    """The command's checks have passed: print the warnings held so far, hold no more."""
    global held
    lines, held = held or [], None
    for line in lines:
        err.print(line, markup=False)


def shown(path) -> str:
    """A path as printed: as it is when every character is printable and it neither
    starts nor ends with a space; otherwise in the shell's ``$'...'`` quoting (as ``ls``
    shows such a name; an undecodable byte as ``\\xNN``), so the name printed is the name
    written, and pastes back."""
    text = str(path)
    if text.isprintable() and text == text.strip() and readable(text) == text:
        return text
    return quoted(text)


def named(label: str, path) -> Path:
    """Print ``label: path`` on stdout (the path as ``shown``); returns the path."""
    out.print(f"{label}: {shown(path)}", markup=False)
    return path


def wrote(*paths: Path) -> None:
    written.extend(Path(p) for p in paths)


#: What the interrupt line adds after the files (a sweep's kept points), if anything.
kept: list[str] = []


def _interrupted_line() -> str:
    if not written:
        return "interrupted; nothing was written"
    names = ", ".join(shown(p) for p in dict.fromkeys(written))
    line = f"interrupted; written before the interrupt: {names}; nothing else was written"
    return "; ".join([line, *kept])


def _as_note(message, category, filename, lineno, file=None, line=None) -> None:
    """``warnings.showwarning`` while a command runs: a library's warning is not probe's
    line.  A numerical one (numpy's RuntimeWarning: a division by zero, an invalid value)
    matters, since numbers the user reads are NaN or infinite: it becomes one probe warning,
    the first time.  Everything else (deprecations, advice from matplotlib or transformers)
    is dropped: it is meant for probe's authors, who see it in the tests.  probe's own
    (:class:`probe.errors.ProbeWarning`) is its line, every time."""
    if issubclass(category, ProbeWarning):
        warn(str(message))
        return
    if not issubclass(category, RuntimeWarning) or _noted:
        return
    _noted.append(True)
    where = Path(filename).name
    warn(f"a computation gave NaN or infinite values ({message}, in {where}); "
         "the numbers it touched are NaN or infinite in the result")  # fmt: skip


_noted: list[bool] = []


def _finished_line() -> str:
    """A signal came after the command's last step: it stopped nothing."""
    names = ", ".join(shown(p) for p in dict.fromkeys(written)) or "nothing"
    return f"probe: interrupted after the command had finished; it wrote: {names}"


class OneLineErrors(HelpGroup):
    """A command group whose usage errors are one line and exit 2, never a traceback.

    ProbeError, the library's user-facing error, is turned into that line here,
    once, so commands call the library without wrapping it.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global held
        invocation[:] = list(sys.argv[1:] if args is None else args)
        running[:] = [command_of(self, invocation)]
        written.clear()
        kept.clear()
        held = []
        done = False
        STDOUT.reset()
        STDERR.reset()
        _noted.clear()
        try:
            with handled(), warnings.catch_warnings():
                warnings.simplefilter("default")  # each once per place, then to _as_note
                warnings.showwarning = (
                    _as_note  # SIGINT, SIGTERM, SIGHUP are recorded, raised at safe points
                )
                check_interrupt()  # one that came while the executable started
                result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
                late = recorded()  # one that came after the last safe point: all is done
            done = True
        except typer.TyperException as exc:  # typer's own (vendored click) errors
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `probe`: the help is the answer
                out.print(exc.format_message(), markup=False)
                raise SystemExit(0) from None
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            fail(f"{exc.format_message()}{hint}", code=getattr(exc, "exit_code", USAGE))
        except (ProbeError, OptionError) as exc:
            fail(str(exc))
        except typer.Exit as exc:
            raise SystemExit(exc.exit_code) from None
        except Interrupted as exc:
            fail(_interrupted_line(), code=exc.code)
        except (typer.Abort, KeyboardInterrupt):
            fail(_interrupted_line(), code=EXIT_CODES[signal.SIGINT])
        except (OSError, SystemExit) as exc:  # under a library's own print (click's help)
            if not _stdout_failed(exc):
                raise
            STDOUT.gone(exc)
            done, result, late = True, 0, None
        finally:
            running.clear()  # every way out passes here, its error line said
            if not done:
                held = None  # a failure's held warnings are dropped: its error is the line
        checked()
        if late is not None:
            err.print(_finished_line(), markup=False)
        if STDOUT.closed_early:
            what = f"could not be written ({STDOUT.why})" if STDOUT.why else (
                "was closed before the command ended")  # fmt: skip
            err.print(
                f"probe: warning: standard output {what}; "
                "the rest of its lines were dropped, the command went on",
                markup=False,
            )
        raise SystemExit(result if isinstance(result, int) else 0)


class Reporter:
    """Progress of one whole command: a spinner while models load, then one bar.

    On a terminal the bar counts every forward pass of the command (models x inits
    x variants x batches) with elapsed time and ETA.  Elsewhere (batch jobs, logs) it
    prints plain lines: with ``bar(total, summary=True)`` (collapse, whose batches
    cycle through the variants) one line per model and variant at the end, with the
    time summed over its batches, and at most one line every ``HEARTBEAT`` seconds
    saying how far the run is; otherwise one line each time the label changes.
    ``--quiet`` silences both; errors and warnings still go to stderr.
    """

    HEARTBEAT = 30.0

    def __init__(self, total: int = 0, quiet: bool | None = None) -> None:
        self.quiet = settings["quiet"] if quiet is None else quiet
        self.terminal = err.is_terminal
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self._label = ""
        self._bar = None
        self._task = None
        self._last = self.start
        self._summary: dict[str, list[float]] | None = None  # label -> [seconds, steps]
        self._said = self.start
        self._loaded: list[str] = []

    @contextmanager
    def loading(self, words: str):
        """A spinner with ``words`` while something slow without steps runs.

        Off a terminal the line is kept until :meth:`loaded` (after the last model of the
        command has loaded): a refusal of any of them stays the command's only line.
        """
        if self.quiet:
            yield
        elif not self.terminal:
            start = time.monotonic()
            yield
            self._loaded.append(f"probe: {words} done in {time.monotonic() - start:.1f} s")
        else:
            with err.status(words, spinner="dots"):
                yield
        check_at_module_calls()  # the next load's self-test stops within a layer
        check_interrupt()  # a load has no steps: Ctrl-C during it stops the command here

    def loaded(self) -> None:
        """Everything is loaded and checked: say what the loading took."""
        for line in self._loaded:
            err.print(line, markup=False)
        self._loaded = []

    @contextmanager
    def bar(self, total: int, summary: bool = False):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        check_at_module_calls()  # a forward pass stops within a layer (models are loaded)
        self.total, self.done, self.start = total, 0, time.monotonic()
        self._last = self._said = self.start
        self._summary = {} if summary else None
        if self.quiet or not self.terminal:
            yield self
            self._plain_line()
            self._summary_lines()
            return
        columns = (
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=err, transient=True) as progress:
            self._bar = progress
            self._task = progress.add_task("probing", total=total or None)
            try:
                yield self
            finally:
                self._bar = self._task = None

    def update(self, done_in_part: int, total_in_part: int, label: str) -> None:
        """Callback for an analysis: one more step of ``label`` finished.

        With a total given to :meth:`bar`, steps count across the whole command;
        with none (0), the analysis' own counts drive the bar.
        """
        check_interrupt()
        now = time.monotonic()
        if self._summary is not None:
            seconds_steps = self._summary.setdefault(label, [0.0, 0])
            seconds_steps[0] += now - self._last
            seconds_steps[1] += 1
        elif label != self._label:
            self._plain_line()
            # The step that just ended was this label's first: it began at the last update.
            self._label, self._label_start = label, self._last
        self._last = now
        self.done = self.done + 1 if self.total else done_in_part
        if self._bar is not None:
            total = self.total or total_in_part
            self._bar.update(self._task, completed=self.done, total=total, description=label)
        elif self._summary is not None and not self.quiet and now - self._said >= self.HEARTBEAT:
            total = self.total or total_in_part
            err.print(
                f"probe: {self.done}/{total} steps done in {now - self.start:.0f} s "
                f"(the last: {label})",
                markup=False,
            )
            self._said = now

    def _plain_line(self) -> None:
        if self.quiet or self.terminal or not self._label:
            return
        seconds = time.monotonic() - self._label_start
        err.print(f"probe: {self._label} done in {seconds:.1f} s", markup=False)
        self._label = ""

    def _summary_lines(self) -> None:
        if self.quiet or self.terminal or not self._summary:
            return
        for label, (seconds, steps) in self._summary.items():
            batches = f" ({steps} batches)" if steps > 1 else ""
            err.print(f"probe: {label} done in {seconds:.1f} s{batches}", markup=False)
        self._summary = {}


def command_line() -> str:
    """The running command as a user would type it."""
    return command(["probe", *invocation])
