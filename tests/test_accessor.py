"""``ds.probe`` in notebooks: the compact HTML summary and the figure."""

from __future__ import annotations

import html

import xarray as xr
from matplotlib.figure import Figure

import probe  # noqa: F401  (registers the accessor)
from probe.measures import stats
from tests.datasets import make_collapse_dataset


def test_summary_html_has_the_numbers_and_the_figure():
    ds = make_collapse_dataset(model='odd<name>&"q"', layers=4)
    text = ds.probe._repr_html_()
    assert "probe collapse" in text and 'src="data:image/png;base64,' in text
    assert html.escape('odd<name>&"q"') in text and "odd<name>" not in text
    summary = stats.summarise(ds)
    san = summary["SAN"]["random"]
    assert (
        f"<td>SAN</td><td>random</td><td>{san['first_below']}</td><td>{san['final']:.3g}</td>"
        in text
    )
    assert "never" in text  # the transformer variant never falls under 1e-3


def test_plot_returns_a_figure_and_other_datasets_fall_back():
    ds = make_collapse_dataset(layers=3)
    fig = ds.probe.plot()
    assert isinstance(fig, Figure) and fig.axes[0].get_yscale() == "log"
    assert ds.probe.summary() == stats.summarise(ds)
    other = xr.Dataset({"x": ("a", [1.0])})
    fallback = other.probe._repr_html_()  # xarray's own repr (its ids are random)
    assert "xr-section-summary" in fallback and "probe collapse" not in fallback
