"""What a reader meets on a report page: colours that mean one thing, axes that show the
measured values, ticks that label every length, short tables, times and options in words."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import to_hex

from probe.figures import plot
from probe.figures.plot_paths import EVERY_LENGTH
from probe.reports import theory
from probe.reports.page import esc_code
from probe.reports.text import duration
from tests.datasets import make_collapse_dataset


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(7.654, "7.7 s"), (41.302, "41 s"), (185, "3 min 5 s"), (1002, "17 min"), (7450, "2 h 4 min"),
     (float("nan"), "?"), (None, "?"), ("?", "?")],
)  # fmt: skip
def test_a_duration_reads_as_a_person_writes_it(seconds, words):
    assert duration(seconds) == words


def test_backticks_become_code_and_the_rest_is_escaped():
    assert esc_code("lr 0.001 (`lr` 1e-05 runs it) <b>") == (
        "lr 0.001 (<code>lr</code> 1e-05 runs it) &lt;b&gt;"
    )


def test_no_model_line_borrows_a_variant_colour():
    variants = {to_hex(c) for c in plot.COLOURS.values()}
    assert not variants & {to_hex(c) for c in plot.MODEL_COLOURS}
    datasets = [make_collapse_dataset(model=f"m{i}", seed=i) for i in range(9)]
    fig = plot.across_models(datasets)
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in lines] == [f"m{i}" for i in range(9)]
    assert {to_hex(ln.get_color()) for ln in lines} == set(plot.MODEL_COLOURS)
    # The eighth model takes the first colour again, told apart by a marker.
    assert lines[7].get_color() == lines[0].get_color()
    assert lines[0].get_marker() in (None, "None") and lines[7].get_marker() == "o"


def test_the_theory_axis_spans_the_measured_values_not_the_bound():
    measured = np.array([[2.0, 0.5, 1e-3], [3.0, np.nan, 0.0]])
    low, high = theory._measured_range(measured)
    assert (low, high) == pytest.approx((1e-4, 30.0), rel=1e-15)  # a decade past 1e-3 and 3
    assert theory._measured_range(np.full((2, 3), np.nan)) == (0.1, 10.0)


def test_the_theory_figure_clips_a_bound_far_above_the_measured():
    layers, variants = np.arange(3), ["SAN", "SAN+MLP", "SAN+skip"]
    residual = np.array([[1.0, 0.1, 0.01], [1.0, 0.2, 0.03], [1.0, 0.9, 0.8]])
    bound = np.array([[1.0, 1e20, 1e49], [1.0, 1e21, 1e45], [np.nan] * 3])
    ds = xr.Dataset(
        {
            "panel_residual": (("init", "panel_variant", "layer"), residual[None]),
            "bound": (("init", "panel_variant", "layer"), bound[None]),
            "theorem": (("init", "panel_variant"), [["Theorem 2.2", "Corollary 3.2", ""]]),
        },
        coords={"init": ["random"], "panel_variant": variants, "layer": layers},
    )
    (ax,) = theory._figure(ds, ["random"]).axes
    assert ax.get_ylim() == pytest.approx((1e-3, 10.0), rel=1e-12)


def test_a_shifted_log_axis_labels_every_length_while_they_fit():
    from matplotlib.figure import Figure

    from probe.figures.plot_paths import _shifted_log_axis

    for longest, labels in [(6, list(range(7))), (EVERY_LENGTH + 4, [0, 1, 2, 3, 5, 10])]:
        ax = Figure().subplots()
        _shifted_log_axis(ax, longest)
        ticks = ax.xaxis.get_major_locator()()
        formatter = ax.xaxis.get_major_formatter()
        assert [formatter(t) for t in ticks] == [str(k) for k in labels]
