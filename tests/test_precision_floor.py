"""Values under the run's precision floor, and fits below their quality, are never shown as
measurements.

The floor is 10 machine epsilons of the run's dtype (``probe.measures.stats.FLOOR_FACTOR``, from
the float32/bfloat16 against float64 runs of ``docs/data/precision_floor.py``).  The
Dataset keeps every raw value; tables, reports and summaries write a value under the floor
as "< 1.2e-6 (float32)", and a slope with its quality or, where that is too poor, a dash
and the reason.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

from probe.measures import stats
from tests.test_plot import with_r as _one  # r at every layer and sequence

FLOAT32_FLOOR = 10 * 2.0**-23  # 10 float32 epsilons: 1.1920928955078125e-06


@pytest.mark.parametrize(
    ("dtype", "floor"),
    [
        ("float32", FLOAT32_FLOOR),
        ("float64", 10 * 2.0**-52),
        ("bfloat16", 10 * 2.0**-7),
        ("float16", 10 * 2.0**-10),
    ],
)
def test_the_floor_is_ten_epsilons_of_the_dtype(dtype, floor):
    assert stats.precision_floor(dtype) == floor


def test_a_value_under_the_floor_shows_as_below_it():
    ds = _one([0.5, 0.1], "float32")
    assert stats.shown(1.67e-7, ds) == "< 1.2e-6 (float32)"
    assert stats.shown(0.0, ds) == "< 1.2e-6 (float32)"
    assert stats.shown(1.2e-6, ds) == "1.2e-06"  # just above 1.19e-6: a measurement
    assert stats.shown(float("nan"), ds) == "–"
    assert stats.shown(0.123456, ds) == "0.123"
    assert stats.shown(1.67e-7, _one([0.5, 0.1], "float64")) == "1.67e-07"


def test_a_result_records_its_floor_and_keeps_the_raw_values(minilm_san):
    ds = minilm_san
    assert ds.attrs["precision_floor"] == FLOAT32_FLOOR
    mean = ds["relative_residual"].sel(fit="mean", norm="l1inf", variant="SAN").mean("sequence")
    # The pretrained MiniLM's SAN reaches float32 rounding at layers 5 and 6 (about 1.3e-7),
    # and the Dataset keeps those numbers as they came.
    low = mean.sel(layer=[5, 6]).values.ravel()
    assert (low > 0).all() and (low < FLOAT32_FLOOR).all()


def test_summaries_reports_and_the_cli_show_minilm_san_as_below_the_floor(minilm_san, tmp_path):
    from cli.app import app
    from probe.reports.render import render

    ds = minilm_san
    summary = stats.summarise(ds)["SAN"]["pretrained"]
    assert summary["final"] < FLOAT32_FLOOR
    assert summary["final_text"] == "< 1.2e-6 (float32)"
    html = render(ds)
    cells = re.findall(r'<td class="num" data-mean="([^"]+)" data-std="[^"]+">([^<]*)</td>', html)
    shown = {float(raw): text for raw, text in cells}
    mean = stats.stats(ds)["mean"].sel(variant="SAN", init="pretrained")
    for layer in (5, 6):
        assert shown[float(mean.sel(layer=layer))] == "&lt; 1.2e-6 (float32)"
    assert shown[float(mean.sel(layer=4))].startswith(f"{float(mean.sel(layer=4)):.3g} ± ")
    # no cell writes a value under the floor as digits
    for raw, text in shown.items():
        if 0 <= raw < FLOAT32_FLOOR:
            assert text == "&lt; 1.2e-6 (float32)", (raw, text)
    # the command line's table at the end of `probe collapse`
    files = [tmp_path / "a.nc", tmp_path / "b.nc"]
    for nc in files:
        ds.to_netcdf(nc)
    result = CliRunner().invoke(app, ["compare", *map(str, files), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    # a narrow terminal may fold the cell over two lines: the floor is there, the raw
    # digits are not
    assert "1.2e-6" in result.output and "(float32)" in result.output
    raw = f"{summary['final']:.3g}"
    assert raw not in result.output
    # the per-layer table `probe collapse` prints after its run
    from cli.collapse_run import print_table
    from cli.console import out

    with out.capture() as captured:
        print_table(ds, "relative_residual")
    table = captured.get()
    assert table.count("1.2e-6") == 2 and raw not in table
    assert f"{float(mean.sel(layer=4)):.3g} ± " in table


def test_a_two_point_slope_through_nearly_equal_residuals_is_missing_with_its_reason():
    # Two pairs of residuals 0.4615 and 0.4777 (a gpt2-tiny-steps checkpoint's SAN): their
    # slope is about -32, read off two points 0.015 decades apart.
    ds = _one([0.4777, 0.4615, 0.4777, 0.6, 0.7], "float32")
    found = stats.order_fit(ds).isel(variant=0, init=0)
    assert np.isnan(float(found["order"]))
    assert int(found["pairs"]) == 2
    x = np.log([0.4777, 0.4615])
    assert float(found["spread"]) == pytest.approx(abs(x[0] - x[1]) / np.log(10))
    assert str(found["reason"].item()) == "2 pairs spanning 0.015 decades; 0.5 needed for 2 pairs"
    summary = stats.summarise(ds)["SAN"]["random"]
    assert summary["order"] is None
    assert summary["order_note"] == str(found["reason"].item())


def test_a_fit_with_a_large_standard_error_is_missing():
    # Four pairs in the window whose slope scatters: the standard error is above 0.5.
    ds = _one([0.2, 0.3, 0.02, 0.4, 0.1], "float64")
    found = stats.order_fit(ds).isel(variant=0, init=0)
    from scipy.stats import linregress

    r = np.array([0.2, 0.3, 0.02, 0.4, 0.1])
    reference = linregress(np.log(r[:-1]), np.log(r[1:]))
    assert int(found["pairs"]) == 4
    assert float(found["stderr"]) == pytest.approx(reference.stderr, rel=1e-12)
    assert reference.stderr > stats.MAX_STDERR
    assert np.isnan(float(found["order"]))
    assert str(found["reason"].item()).startswith(f"standard error {reference.stderr:.2g}")


@pytest.fixture(scope="module")
def minilm_san():
    """The embedded pretrained MiniLM's SAN, float32, 4 x 32 tokens of the built-in text."""
    from probe import Inputs, Model
    from probe.analyses import collapse

    return collapse.run(
        Model("minilm", init="pretrained"),
        Inputs(sequences=4, tokens=32),
        variants="SAN",
        metrics="relative-residual",
    )
