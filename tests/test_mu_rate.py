"""The fitted exponential rate of mu(X) per layer (probe.measures.stats.rate_fit, mu_rate):
hand-computed fits, an exact geometric sequence for any rate (hypothesis), the precision
floor, and the reasons a rate is missing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.measures import stats

FLOAT64 = stats.precision_floor("float64")
ABOVE = 0.5  # a relative distance far above every floor


def _fit(values, relative=None):
    values = np.asarray(values, float)
    relative = np.full(len(values), ABOVE) if relative is None else np.asarray(relative, float)
    return stats.rate_fit(values, relative, FLOAT64)


def test_a_halving_sequence_has_rate_one_half_and_a_perfect_fit():
    found = _fit([8.0, 4.0, 2.0, 1.0])
    # log y = log 8 - t log 2 exactly; polyfit's rounding: a few ulps of log 2
    assert found["rate"] == pytest.approx(0.5, rel=1e-14)
    assert found["r2"] == pytest.approx(1.0, abs=1e-14)
    assert found["layers"] == 4 and found["stderr"] < 1e-14


def test_a_zigzag_has_no_trend_and_r2_zero():
    # log y = 0, 1, 0 at t = 0, 1, 2: the least-squares line is flat at 1/3 (slope 0), so
    # the fit explains nothing: R^2 = 0, rate e^0 = 1.  Residuals -1/3, 2/3, -1/3: the
    # slope's standard error is sqrt((2/3) / (3 - 2) / 2) = sqrt(1/3).
    found = _fit([1.0, math.e, 1.0])
    assert found["rate"] == pytest.approx(1.0, abs=1e-15)
    assert found["r2"] == pytest.approx(0.0, abs=1e-15)
    assert found["stderr"] == pytest.approx(math.sqrt(1 / 3), rel=1e-14)


def test_a_constant_mu_has_rate_one_and_no_r2():
    found = _fit([3.0, 3.0, 3.0, 3.0])
    # polyfit's least squares leaves a slope of a few ulps on a constant
    assert found["rate"] == pytest.approx(1.0, abs=1e-15) and math.isnan(found["r2"])
    text = stats.rate_text(found, FLOAT64, "float64")
    assert text == "1 per layer (R² undefined: mu constant, 4 layers)"


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(1e-3, 3.0),
    scale=st.floats(1e-3, 1e3),
    layers=st.integers(3, 60),
)
def test_an_exact_geometric_sequence_gives_its_rate(rate, scale, layers):
    t = np.arange(layers)
    found = _fit(scale * rate**t)
    # log(scale rate^t) is rounded at each t (|log| up to ~420 here, so ~1e-13 absolutely);
    # the slope's error is that over the spread of t, well under 1e-12 relative in the rate.
    assert found["rate"] == pytest.approx(rate, rel=1e-12)
    assert found["layers"] == layers
    if abs(math.log(rate)) > 1e-6:  # a trend: the line explains all of it
        assert found["r2"] == pytest.approx(1.0, abs=1e-12)


def test_layers_below_the_floor_are_left_out_and_counted():
    values = [1.0, 0.5, 0.25, 0.125, 1e-30, 1e-31]  # the last two: rounding, not a distance
    relative = [0.5, 0.3, 0.2, 0.1, 1e-16, 1e-17]
    found = _fit(values, relative)
    assert found["layers"] == 4 and found["rate"] == pytest.approx(0.5, rel=1e-14)


def test_fewer_than_three_layers_above_the_floor_give_no_rate_and_say_why():
    found = _fit([1.0, 0.01, 1e-30, 1e-60], [0.5, 0.1, 1e-16, 1e-17])
    assert found["layers"] == 2 and math.isnan(found["rate"]) and math.isnan(found["r2"])
    text = stats.rate_text(found, FLOAT64, "float64")
    assert text == "– (2 layers above the float64 floor 2.2e-15; 3 needed)"
    one = stats.rate_text({**found, "layers": 1}, FLOAT64, "float64", missing="-")
    assert one == "- (1 layer above the float64 floor 2.2e-15; 3 needed)"


def test_a_zero_or_missing_mu_never_enters_the_fit():
    found = _fit([1.0, 0.5, np.nan, 0.125, 0.0, 0.03125])  # 2^-t at t = 0, 1, 3 and 5
    assert found["layers"] == 4 and found["rate"] == pytest.approx(0.5, rel=1e-14)


def test_a_shown_rate_reads_with_its_quality():
    found = {"rate": 0.8123, "r2": 0.99871, "layers": 12}
    assert stats.rate_text(found, FLOAT64, "float64") == "0.812 per layer (R² 0.999, 12 layers)"


def _result(mu=True):
    """A collapse-shaped result: SAN halves mu per layer, the transformer keeps it."""
    layers, sequences = 5, 2
    mu_values = np.empty((2, 1, layers, sequences))
    mu_values[0, 0] = (2.0 ** -np.arange(layers))[:, None] * [1.0, 3.0]
    mu_values[1, 0] = 2.0
    relative = np.full((2, 1, layers, sequences, 2, 5), 0.4)
    data = {
        "relative_residual": (("variant", "init", "layer", "sequence", "fit", "norm"), relative)
    }
    if mu:
        data["mu"] = (("variant", "init", "layer", "sequence"), mu_values)
    coords = {"variant": ["SAN", "transformer"], "init": ["random"], "layer": range(layers),
              "sequence": range(sequences), "fit": ["mean", "svd"],
              "norm": ["l1inf", "fro", "spectral", "l1", "linf"]}  # fmt: skip
    return xr.Dataset(data, coords=coords, attrs={"dtype": "float64"})


def test_mu_rate_fits_the_mean_over_sequences_per_variant():
    found = stats.mu_rate(_result())
    san = found.sel(variant="SAN", init="random")
    # mean over the sequences: 2 * 2^-l, a rate of exactly 1/2 through five layers
    assert float(san["rate"]) == pytest.approx(0.5, rel=1e-14) and int(san["layers"]) == 5
    kept = found.sel(variant="transformer", init="random")
    assert float(kept["rate"]) == pytest.approx(1.0, abs=1e-15) and np.isnan(float(kept["r2"]))


def test_a_result_without_mu_says_so():
    found = stats.mu_rate(_result(mu=False)).sel(variant="SAN", init="random")
    assert int(found["layers"]) == -1 and np.isnan(float(found["rate"]))
    one = {key: found[key].item() for key in ("rate", "r2", "layers")}
    assert stats.rate_text(one, FLOAT64, "float64") == "– (mu not measured)"
