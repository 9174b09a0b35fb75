"""The command's standard output and error as probe writes them: streams that survive a
reader that went away, a full device or a closed descriptor (:class:`Stream`)."""

from __future__ import annotations

import errno
import os
import sys


class Stream:
    """``sys.stdout`` or ``sys.stderr`` (looked up at each write: tests swap them) that
    survives a stream that cannot be written: a reader that went away (EPIPE), a full device
    (``>/dev/full``, ENOSPC), a closed descriptor (``1>&-``: Python then has no such
    stream).  The first failed write or flush points the stream's file descriptor at
    /dev/null (so Python's own flush at exit fails no more) and the rest of its output is
    dropped: the command's work goes on either way."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed_early = False
        self.why = ""  # the error's words; "" for a reader that went away

    def target(self):
        """The Python stream; OSError (EBADF) where Python has none (closed at start)."""
        stream = getattr(sys, self.name)
        if stream is None or stream is self:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return stream

    def write(self, text: str) -> int:
        if not self.closed_early:
            try:
                return self.target().write(text)
            except (OSError, ValueError) as exc:  # ValueError: a closed Python stream
                self.gone(exc)
        return len(text)

    def flush(self) -> None:
        if not self.closed_early:
            try:
                self.target().flush()
            except (OSError, ValueError) as exc:
                self.gone(exc)

    def isatty(self) -> bool:
        stream = getattr(sys, self.name)
        return stream is not None and stream is not self and stream.isatty()

    def fileno(self) -> int:
        return self.target().fileno()

    @property
    def encoding(self) -> str:
        return getattr(getattr(sys, self.name), "encoding", None) or "utf-8"

    def gone(self, exc: BaseException | None = None) -> None:
        self.closed_early = True
        broken = exc is None or isinstance(exc, BrokenPipeError | SystemExit)
        self.why = "" if broken else getattr(exc, "strerror", None) or str(exc)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.target().fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no file descriptor (a test's stream): nothing to flush
            pass

    def reset(self) -> None:
        self.closed_early, self.why = False, ""


STDOUT, STDERR = Stream("stdout"), Stream("stderr")


def stdout():
    """``sys.stdout``; OSError (EBADF) where Python has none (descriptor 1 closed at start)."""
    return STDOUT.target()
