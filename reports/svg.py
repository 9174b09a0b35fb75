"""Matplotlib figures as inline SVG strings, safe to put several on one HTML page.

Matplotlib writes ids like "figure_1", "axes_1" and one glyph id per
character ("DejaVuSans-30") in every file, so two inline SVGs on a page would
resolve each other's `url(#...)` and `xlink:href="#..."` references. Each
figure's ids therefore get a page-unique prefix. Text is drawn as paths so the
figure looks the same without any font on the reader's machine.
"""

from __future__ import annotations

import io
import re

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .page import esc

_ID = re.compile(r'\bid="([^"]+)"')
_REFERENCE = re.compile(r'(url\(#|href="#)([^)"]+)')
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)
_EMPTY_GROUP = re.compile(r'\s*<g id="[^"]*"/>')
_TICK_ID = re.compile(r' id="[xy]tick_\d+"')


def figure_svg(fig: Figure, prefix: str, label: str = "") -> str:
    """`fig` as an <svg> element (no XML prolog or doctype), its ids prefixed by `prefix`."""
    for ax in fig.axes:
        if _title_stays_put(ax):
            # matplotlib (3.11) otherwise measures the axis' tick labels at every layout pass
            # to see whether the title must move up: a third to a half of drawing a report's
            # figure.  Where nothing can rise above the axes the title stays at y = 1 anyway.
            ax._autotitlepos = False
        for axis in (ax.xaxis, ax.yaxis):
            if _minor_ticks_draw_nothing(axis):
                # A log axis over many decades has dozens of minor ticks with no line, grid or
                # label in this style; matplotlib still makes and measures each at every pass.
                axis.set_minor_locator(NullLocator())
    buffer = io.StringIO()
    # A fixed hash salt makes the output deterministic: same data, same report.
    with mpl.rc_context({"svg.hashsalt": "probe", "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    # The RDF metadata only names matplotlib; comments repeat the figure's text; an empty
    # group (a tick that draws nothing) holds nothing, and a tick's group id (a running
    # count, which the ticks drawing nothing also took) is never referred to.
    text = _EMPTY_GROUP.sub("", _METADATA.sub("", _COMMENT.sub("", text)))
    text = _TICK_ID.sub("", text)
    ids = set(_ID.findall(text))
    text = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = _REFERENCE.sub(
        lambda m: m.group(1) + (prefix + m.group(2) if m.group(2) in ids else m.group(2)), text
    )
    attributes = ' role="img"' + (f' aria-label="{esc(label)}"' if label else "")
    return text.replace("<svg ", f"<svg{attributes} ", 1).strip()


def _title_stays_put(ax) -> bool:
    """Is ``ax``'s title where matplotlib's search would leave it, at the top of the axes?

    The search lifts a title above x tick labels or an x label at the top, above another
    axes sharing its place (twins, inset children), and above the y axis' offset text
    ("1e-8" over the axis) where they meet; what lies at the bottom is below the axes.
    None of these: it stays at y = 1."""
    if ax.xaxis.get_label_position() != "bottom":
        return False
    ticks = ax.xaxis.get_major_ticks(1) + ax.xaxis.get_minor_ticks(1)  # all alike: one each
    if any(tick.label2.get_visible() for tick in ticks):  # tick labels at the top
        return False
    if ax.child_axes or len(ax.get_shared_x_axes().get_siblings(ax)) > 1:
        return False
    if len(ax._twinned_axes.get_siblings(ax)) > 1:
        return False
    formatter = ax.yaxis.get_major_formatter()
    formatter.set_locs(ax.yaxis.get_majorticklocs())
    return not formatter.get_offset()


def _minor_ticks_draw_nothing(axis) -> bool:
    """Would ``axis``' minor ticks draw nothing: no tick line on either side, no grid line,
    and an empty label at every one of them (as matplotlib's log formatter leaves them
    over many decades)?"""
    params = axis.get_tick_params(which="minor")
    sides = ("left", "right") if axis.axis_name == "y" else ("bottom", "top")
    if params.get("gridOn") or any(params.get(side, True) for side in sides):
        return False
    locations = axis.get_minorticklocs()
    formatter = axis.get_minor_formatter()
    formatter.set_locs(locations)
    return not any(formatter(x, i) for i, x in enumerate(locations))
