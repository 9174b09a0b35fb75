"""Interrupts (SIGINT, SIGTERM, SIGHUP): recorded when they come, raised where stopping is clean.

A handler that raises does so wherever Python happens to be: in a finaliser (``__del__``,
a weakref callback), where the exception is printed as "Exception ignored" and dropped; in
``compile``, where CPython 3.11 makes it a ``SystemError``; between the renames that put a
result and its report in place.  So the handler, :func:`record`, never raises: it records
the signal, and :func:`check_interrupt` raises it (:class:`Interrupted`) where it is
called: between the steps of every analysis and after each model has loaded (the CLI's
progress), before and after a unit of files is put in place (``probe.files.results``), per layer
of the theory constants, and, once :func:`check_at_module_calls` is on, before every call
of a torch module, so that a forward pass stops within a layer, not at the end of a batch
that can take minutes.

SIGHUP (the terminal was closed) is one more way to ask a command to stop: it is treated
as SIGTERM, and exits 129.  Only the first signal counts: a second one, while the command
stops, is recorded over it and never raised again (the command says one line, once).

Only a program that sets :func:`record` as its handler (the ``probe`` command, through
:func:`handled`) records anything: for a library caller ``check_interrupt`` does nothing,
and Ctrl-C raises ``KeyboardInterrupt`` as usual.
"""

from __future__ import annotations

import contextlib
import signal
import sys

#: The exit code of each signal a command stops for (128 + the signal's number).
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
if hasattr(signal, "SIGHUP"):  # not on Windows
    EXIT_CODES[signal.SIGHUP] = 129


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived; carries the exit code.

    A BaseException, as KeyboardInterrupt: no ``except Exception`` on the way (a library's,
    or the guard around rendering a damaged file) may take it for an error and go on."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_pending: list[int] = []  # the exit code of the signal recorded and not yet raised


def record(signum: int, frame=None) -> None:
    """The signal handler: remember the signal; :func:`check_interrupt` raises it.  The
    first one is kept: a second Ctrl-C while the first stops the command changes nothing."""
    if not _pending:
        _pending.append(EXIT_CODES.get(signum, 130))


def recorded() -> int | None:
    """The exit code of the signal recorded and not yet raised, or None."""
    return _pending[0] if _pending else None


def check_interrupt() -> None:
    """Raise :class:`Interrupted` if a signal was recorded: call it where stopping is clean."""
    if _pending:
        raise Interrupted(_pending[0])


def clear() -> None:
    """Forget a signal recorded and not raised (the command it was meant for is over)."""
    _pending.clear()


@contextlib.contextmanager
def handled():
    """Record SIGINT, SIGTERM and SIGHUP inside the block; the handlers before it are set again
    after it, and a signal recorded but never raised is forgotten."""
    previous = {signum: _install(signum, record) for signum in EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            _install(signum, handler)
        clear()


def _install(signum, handler):
    """Set a signal handler where Python allows it (the main thread), returning the old one."""
    try:
        return signal.signal(signum, handler)
    except (ValueError, TypeError):  # not the main thread, or no previous Python handler
        return None


def check_at_module_calls() -> None:
    """From now on, also :func:`check_interrupt` before every call of a torch module (a
    global forward pre-hook: it changes no number).  Nothing is done before torch is
    imported: a command that never loads a model never imports it for this."""
    torch = sys.modules.get("torch")
    if torch is None or _hooked:
        return
    torch.nn.modules.module.register_module_forward_pre_hook(_at_module_call)
    _hooked.append(True)


_hooked: list[bool] = []


def _at_module_call(module, args) -> None:
    check_interrupt()
