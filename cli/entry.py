"""The ``probe`` executable's first code: interrupts are one line from the very start.

The command line imports typer and rich before the command runs; a Ctrl-C in those first
few hundred milliseconds used to end in a ``KeyboardInterrupt`` traceback.  This module
imports nothing but ``probe.interrupts``, and sets its handler, which only records SIGINT
and SIGTERM, for the life of the process: a signal during the imports stops the command
before it starts (130 for SIGINT, 143 for SIGTERM; nothing was written), one during the
command is raised at its next safe point (``cli.console.OneLineErrors``), and one that comes
after the command has finished changes nothing.
"""

from __future__ import annotations

import os
import signal

from probe import interrupts


def main() -> None:
    for signum in interrupts.EXIT_CODES:
        signal.signal(signum, interrupts.record)
    try:
        from .app import main as app_main

        interrupts.check_interrupt()
    except interrupts.Interrupted as exc:
        os.write(2, b"probe: error: interrupted; nothing was written\n")
        raise SystemExit(exc.code) from None
    app_main()


if __name__ == "__main__":
    main()
