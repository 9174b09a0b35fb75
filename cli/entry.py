"""The ``probe`` executable's first code: interrupts are one line from the very start.

The command line imports typer and rich before the command's own handlers are set
(``console.OneLineErrors``); a Ctrl-C in those first few hundred milliseconds used to
end in a ``KeyboardInterrupt`` traceback.  This module imports nothing: it sets
handlers that print the usual line and exit (130 for SIGINT, 143 for SIGTERM), imports
the app, and hands SIGINT back; SIGTERM comes back to this handler whenever the command
has none of its own, and its line then names what the command wrote.
"""

from __future__ import annotations

import os
import signal
import sys

_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _line() -> bytes:
    """The interrupt line: what the command wrote, once the console keeps count."""
    console = sys.modules.get(__package__ + ".console")
    line = getattr(console, "_interrupted_line", None)  # None while it is still imported
    words = line() if line is not None else "interrupted; nothing was written"
    return f"probe: error: {words}\n".encode()


def _early(signum, frame):
    for stream in (sys.stdout, sys.stderr):  # what the command printed, then the line
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 (interrupted inside a write: nothing more to do)
            pass
    os.write(2, _line())
    os._exit(_CODES.get(signum, 130))


def main() -> None:
    for signum in _CODES:
        signal.signal(signum, _early)
    from .app import main as app_main

    # From here on the app's own handling (KeyboardInterrupt -> one line) takes over; the
    # command sets its SIGTERM handler itself (console.OneLineErrors) and puts this one
    # back, which then says what was written if SIGTERM comes as the process ends.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app_main()
    except KeyboardInterrupt:  # outside the app's own handling, just before or after it
        os.write(2, _line())
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
