"""The ``probe`` executable's first code: interrupts are one line from the very start.

The command line imports typer and rich before the command runs; a Ctrl-C in those first
few hundred milliseconds used to end in a ``KeyboardInterrupt`` traceback.  This module
imports nothing but ``probe.files.interrupts``, and sets its handler, which only records SIGINT,
SIGTERM and SIGHUP, for the life of the process: a signal during the imports stops the
command before it starts (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP; nothing was
written), one during the command is raised at its next safe point
(``cli.console.OneLineErrors``), one after the command has finished is said in a line that
names what it wrote (exit 0), and once the command has said its last line, signals are
ignored: a second Ctrl-C while the process exits prints nothing.

Before anything is imported, the current folder is checked (a deleted one ends torch's
import in "Intel oneMKL FATAL ERROR"), and matplotlib is given a writable configuration
folder where the user's is not (it would print two lines of its own on every run).
"""

from __future__ import annotations

import os
import signal

from probe.files import interrupts


def main() -> None:
    for signum in interrupts.EXIT_CODES:
        signal.signal(signum, interrupts.record)
    try:
        try:
            os.getcwd()
        except OSError as err:  # deleted, or no longer searchable
            os.write(2, f"probe: error: the current folder is gone ({err.strerror}); "
                     "cd to an existing folder\n".encode())  # fmt: skip
            raise SystemExit(2) from None
        writable_matplotlib_config()
        try:
            from .app import main as app_main

            interrupts.check_interrupt()
        except interrupts.Interrupted as exc:
            os.write(2, b"probe: error: interrupted; nothing was written\n")
            raise SystemExit(exc.code) from None
        app_main()
    finally:  # the command has said its line: a signal now would only add another
        for signum in interrupts.EXIT_CODES:
            signal.signal(signum, signal.SIG_IGN)


def writable_matplotlib_config() -> None:
    """Point matplotlib at a private temporary folder when its configuration folder (under
    HOME) cannot be written: it would say so on stderr, twice, on every run."""
    if os.environ.get("MPLCONFIGDIR"):
        return
    home = os.path.expanduser("~")
    bases = (  # matplotlib's configuration and cache folders (matplotlib.get_configdir)
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"),
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
    )
    if all(_can_make(os.path.join(base, "matplotlib")) for base in bases):
        return
    import atexit
    import shutil
    import tempfile

    try:
        private = tempfile.mkdtemp(prefix="probe-matplotlib-")
    except OSError:  # no writable temporary folder either: matplotlib will say so itself
        return
    atexit.register(shutil.rmtree, private, True)
    os.environ["MPLCONFIGDIR"] = private


def _can_make(folder: str) -> bool:
    """Whether ``folder`` is, or can be made, a folder this user writes in."""
    existing = folder
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    return os.path.isdir(existing) and os.access(existing, os.W_OK | os.X_OK)


if __name__ == "__main__":
    main()
