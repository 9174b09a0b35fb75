"""Tables on the terminal: numbers never cut, words folded only where they must be."""

from __future__ import annotations

import re

#: Words up to this many cells stay whole in a table cell; a longer word (not a number)
#: may fold across lines of its cell.
WORD = 12
#: A number as a table shows it: ``0.007``, ``-1.2e-06``, ``12,345``, ``(±0.01)``, ``4/8``.
NUMBER = re.compile(r"[(\[<>≤≥~±+−-]*\d[\d.,:/eE^+−-]*[%)\],;:]*")


def keep_whole(table) -> None:
    """Widen each column of ``table`` to what must stay whole in it (see ``_Out``)."""
    from rich.cells import cell_len

    for column in table.columns:
        header = getattr(column.header, "plain", column.header)
        need = [cell_len(w) for w in header.split()] if isinstance(header, str) else []
        for cell in column.cells:
            text = getattr(cell, "plain", cell)  # a rich Text, or a str
            if isinstance(text, str):
                need += [
                    cell_len(w) if NUMBER.fullmatch(w) else min(cell_len(w), WORD)
                    for w in text.split()
                ]
        column.min_width = max(column.min_width or 0, *need, 0)
        column.overflow = "fold"
