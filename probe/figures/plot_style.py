"""The look of probe's figures: the seaborn style, the colours, plain-text log axes.

Written out so that figures and reports need neither seaborn nor scipy
(tests/test_plot.py checks the style and the palette against seaborn's).  ``STYLE`` is
seaborn's whitegrid look as one rcParams dict, applied by :func:`styled`; ``COLOURS`` gives
each variant one colour in every figure and report, ``MODEL_COLOURS`` and
``MODEL_MARKERS`` one line per model; :func:`log_axis` puts an axis on a log scale with
plain-text tick labels (:class:`PlainLogFormatter`), and :func:`plain` keeps a model's name
from being read as mathtext.  ``probe.figures.plot`` re-exports them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib as mpl
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.ticker import LogFormatterSciNotation

# seaborn's "colorblind" palette, written out so the report needs neither seaborn nor scipy
# (tests/test_plot.py checks it against seaborn).
PALETTE = (
    "#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc",
    "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9",
)  # fmt: skip
#: seaborn's axes_style("whitegrid") with plotting_context("notebook", font_scale=0.85), as
#: one rcParams dict built once (tests/test_plot.py checks it against seaborn's).  Its
#: "image.cmap" (seaborn's own "rocket") is left out: these figures draw no images.
STYLE = {
    "figure.facecolor": "white", "axes.labelcolor": ".15", "xtick.direction": "out",
    "ytick.direction": "out", "xtick.color": ".15", "ytick.color": ".15",
    "axes.axisbelow": True, "grid.linestyle": "-", "text.color": ".15",
    "font.family": ["sans-serif"],
    "font.sans-serif": ["Arial", "DejaVu Sans", "Liberation Sans", "Bitstream Vera Sans",
                        "sans-serif"],
    "lines.solid_capstyle": "round", "patch.edgecolor": "w", "patch.force_edgecolor": True,
    "xtick.top": False, "ytick.right": False, "axes.grid": True, "axes.facecolor": "white",
    "axes.edgecolor": ".8", "grid.color": ".8", "axes.spines.left": True,
    "axes.spines.bottom": True, "axes.spines.right": True, "axes.spines.top": True,
    "xtick.bottom": False, "ytick.left": False, "axes.linewidth": 1.25, "grid.linewidth": 1,
    "lines.linewidth": 1.5, "lines.markersize": 6, "patch.linewidth": 1,
    "xtick.major.width": 1.25, "ytick.major.width": 1.25, "xtick.minor.width": 1,
    "ytick.minor.width": 1, "xtick.major.size": 6, "ytick.major.size": 6,
    "xtick.minor.size": 4, "ytick.minor.size": 4, "font.size": 10.2, "axes.labelsize": 10.2,
    "axes.titlesize": 10.2, "xtick.labelsize": 9.35, "ytick.labelsize": 9.35,
    "legend.fontsize": 9.35, "legend.title_fontsize": 10.2,
}  # fmt: skip
# Fixed per variant so a colour means the same ablation in every figure and report.
COLOURS = {
    "SAN": to_hex(PALETTE[3]),
    "SAN+MLP": to_hex(PALETTE[4]),
    "SAN+skip": to_hex(PALETTE[0]),
    "transformer": to_hex(PALETTE[2]),
    "LN-affine": to_hex(PALETTE[1]),
    "no-LN": to_hex(PALETTE[5]),
    "no-sink": to_hex(PALETTE[9]),
    "no-massive": to_hex(PALETTE[6]),
}
# One line per model (`across_models`): hues none of the variants above use, so on a page
# where a swatch means a variant no model's line borrows its colour (Paul Tol's muted
# scheme, less its green, teal, rose and pink, and a dark grey).
MODEL_COLOURS = ("#332288", "#88ccee", "#999933", "#882255", "#ddcc77", "#555555", "#aa4499")
# Past MODEL_COLOURS' length the colours repeat with the next of these markers.
MODEL_MARKERS = (None, "o", "s", "^")
# SAN and SAN+MLP often lie on top of each other: a dashed line keeps both visible.
LINESTYLES = {"SAN+MLP": "--"}
_OTHER_COLOUR = "#7f7f7f"
# Reference lines and shading beside the data: machine epsilon, the precision floor, slopes.
REFERENCE_COLOUR = "#555555"


def colour(variant: str) -> str:
    """The fixed colour of a variant (grey for variants this module does not know)."""
    return COLOURS.get(variant, _OTHER_COLOUR)


_SUPERSCRIPT = str.maketrans("0123456789-+", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺")
_MATH_TICK = re.compile(r"\$\\mathdefault\{(.*)\}\$")
_POWER = re.compile(r"\^\{([-+0-9]*)\}")


class PlainLogFormatter(LogFormatterSciNotation):
    """Log-axis tick labels as plain text, 10⁻³ and 2×10⁻³, where matplotlib writes mathtext.

    Mathtext is parsed again for each label at every draw (about 10 ms a label here); plain
    text with Unicode superscripts (in DejaVu Sans) looks the same and is measured at once.
    A label this does not recognise is left as matplotlib made it."""

    def __call__(self, x, pos=None):
        label = super().__call__(x, pos)
        match = _MATH_TICK.fullmatch(label)
        if match is None:
            return label
        body = _POWER.sub(lambda m: m.group(1).translate(_SUPERSCRIPT), match.group(1))
        body = body.replace("\\times", "×").replace("-", "−")
        return label if "\\" in body or "{" in body else body


def log_axis(ax: Axes, axis: str = "y") -> None:
    """Put ``ax``'s x or y axis on a log scale with plain-text tick labels."""
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    which = ax.xaxis if axis == "x" else ax.yaxis
    which.set_major_formatter(PlainLogFormatter())
    which.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


def plain(text: str) -> str:
    """Escape '$' so model names are never parsed as mathtext."""
    return text.replace("$", r"\$")


@contextmanager
def styled() -> Iterator[None]:
    """Draw inside this to get the STYLE rcParams (seaborn's look) for the figures made."""
    # Context managers restore rcParams on exit, so no global state leaks.
    with mpl.rc_context(STYLE):
        yield
