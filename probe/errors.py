"""The one exception type that carries a message meant for the user.

Everything the user can get wrong (a model that cannot be loaded, a text that
is too short, an unknown variant name) raises :class:`ProbeError` with a single
line that says what happened and what to do.  The CLI prints that line and exits
with code 2; library users get an ordinary exception.
"""


class ProbeError(ValueError):
    """A usage error: one line, saying what went wrong and how to go on.

    Everything the user can get wrong (a model that cannot be loaded, a text that is too
    short, an unknown variant name) raises it.  The `probe` command prints the line and
    exits with code 2; library callers get it as a `ValueError`.
    """


class NothingToMeasure(ProbeError):
    """A run stopped because a layer gave values no statistic can be computed from (NaN or
    inf, or a sequence of zeros): the model's numbers, not probe's code, are at fault
    (:mod:`probe.measures.overflow`)."""


class ProbeWarning(UserWarning):
    """A line for the user that does not stop the run (a damaged cache entry recomputed):
    the `probe` command prints it as ``probe: warning: ...``; library callers get a Python
    warning."""


def one_line(err: BaseException) -> str:
    """``err``'s message on one line of at most 300 characters, to quote inside a ProbeError;
    a longer one is cut at the last whole word that fits (never mid-word)."""
    text = " ".join(str(err).split())
    if len(text) <= 300:
        return text
    cut = text[:301].rsplit(" ", 1)[0] if " " in text[:301] else text[:300]
    return cut.rstrip(",;:") + " ..."
