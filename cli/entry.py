"""The ``probe`` executable's first code: interrupts are one line from the very start.

The command line imports typer and rich before the command's own handlers are set
(``console.OneLineErrors``); a Ctrl-C in those first few hundred milliseconds used to
end in a ``KeyboardInterrupt`` traceback.  This module imports nothing: it sets
handlers that print the usual line and exit (130 for SIGINT, 143 for SIGTERM; nothing
can have been written yet), imports the app, and hands the signals back.
"""

from __future__ import annotations

import os
import signal

_LINE = b"probe: error: interrupted; nothing was written\n"
_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


def _early(signum, frame):
    os.write(2, _LINE)
    os._exit(_CODES.get(signum, 130))


def main() -> None:
    for signum in _CODES:
        signal.signal(signum, _early)
    from .app import main as app_main

    # From here on the app's own handling (KeyboardInterrupt -> one line) takes over; the
    # command sets its SIGTERM handler itself (console.OneLineErrors) and puts this one back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app_main()
    except KeyboardInterrupt:  # between the line above and the app's own handling
        os.write(2, _LINE)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    main()
