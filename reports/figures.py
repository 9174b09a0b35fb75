"""A figure as an HTML <figure>: inline SVG plus a caption, numbered per page."""

from __future__ import annotations

from itertools import count

from matplotlib.figure import Figure

from .page import esc
from .svg import figure_svg


class Figures:
    """Numbers the figures of one page so their SVG ids and anchors never clash."""

    def __init__(self) -> None:
        self._count = count(1)

    def __call__(self, fig: Figure, caption: str, label: str) -> str:
        """`caption` is HTML (the caller escapes data in it); `label` is plain text."""
        n = next(self._count)
        svg = figure_svg(fig, prefix=f"f{n}-", label=label)
        return (
            f'<figure id="figure-{n}">{svg}'
            f"<figcaption><strong>Figure {n}.</strong> {caption}</figcaption></figure>"
        )


def numbers(table: str, what: str) -> str:
    """The table behind a figure, folded so the figures stay the page's backbone."""
    return f"<details><summary>{esc(what)}</summary>{table}</details>"
