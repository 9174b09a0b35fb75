"""probe paths --count: exact counts, shares, the presets, the Dataset, the report and the CLI."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from probe.analyses import paths
from probe.analyses.path_count import exact_counts, table
from probe.analyses.path_presets import PRESETS
from probe.cli.app import app
from probe.errors import ProbeError
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths
from probe.results import open_result, save_result


def test_hand_computed_small_shapes():
    # L=2, H=3: skip-skip (1), one head in one of 2 layers (2*3), heads in both (3*3).
    assert [row["count"] for row in table(2, 3)] == [1, 6, 9]
    assert [row["share"] for row in table(2, 3)] == [1 / 16, 6 / 16, 9 / 16]
    assert table(2, 3)[-1]["cumulative"] == 1.0
    # L=3, H=1: binomial(3, k).
    assert [row["count"] for row in table(3, 1)] == [1, 3, 3, 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(1, 130))
def test_counts_sum_to_total_exactly(layers, heads):
    ds = paths.count(layers=layers, heads=heads, command="test")
    name = str(ds.architecture.values[0])
    counts = exact_counts(ds, name)
    assert len(counts) == layers + 1
    assert sum(counts) == (heads + 1) ** layers == int(ds["total"].item())
    # The float shares are each correctly rounded, so their sum is 1 to a few ulps per term.
    assert math.isclose(float(ds["share"].sum()), 1.0, rel_tol=4 * (layers + 1) * 2**-52)
    assert float(ds["mean_length"].item()) == pytest.approx(layers * heads / (heads + 1), rel=1e-15)


def test_presets_exact_and_round_trip(tmp_path):
    ds = paths.count(command="probe paths --count")
    assert len(ds.architecture) == len(PRESETS)
    gpt3 = ds.sel(architecture="GPT-3 175B")
    assert int(gpt3["total"].item()) == 97**96
    assert (int(gpt3.layers), int(gpt3.heads)) == (96, 96)
    assert all(str(s) for s in ds["source"].values)  # every preset names its source
    # The exact 191-digit integers survive netCDF as strings.
    back = open_result(save_result(ds, tmp_path / "count.nc"))
    assert exact_counts(back, "GPT-3 175B") == [math.comb(96, k) * 96**k for k in range(97)]
    assert back["share"].sel(architecture="DistilBERT", path_length=6).item() == pytest.approx(
        12**6 / 13**6, rel=1e-15
    )


def test_model_config_offline():
    ds = paths.count("gpt2", command="test")
    assert (int(ds.layers[0]), int(ds.heads[0])) == (12, 12)
    ds = paths.count("albert-base-v2", command="test")
    assert (int(ds.layers[0]), int(ds.heads[0])) == (12, 12)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ProbeError, match="together"):
        paths.count(layers=3)
    with pytest.raises(ProbeError, match=">= 1"):
        paths.count(layers=0, heads=2)
    with pytest.raises(
        ProbeError, match="not in the local HuggingFace cache.*--layers L --heads H"
    ):
        paths.count("no-such-org/no-such-model")


def test_report_lists_itself_and_shows_exact_counts():
    ds = paths.count(command="probe paths --count")
    html = render_paths(ds, result_file="paths-count-presets.nc")
    meta = read_meta(html)
    assert meta["analysis"] == "paths-count" and meta["result"] == "paths-count-presets.nc"
    assert str(97**96) in html
    assert html.count("<svg") == 1


def test_cli_count_layers_heads(tmp_path):
    result = CliRunner().invoke(
        app, ["paths", "--count", "--layers", "12", "--heads", "12", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "23298085122481" in result.output
    (nc,) = tmp_path.glob("paths-count-l-12-h-12-*.nc")
    assert nc.with_suffix(".html").name in (tmp_path / "index.html").read_text()


def test_cli_count_presets_and_errors(tmp_path):
    result = CliRunner().invoke(app, ["paths", "--count", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert str(97**96) in result.output
    assert "Brown et al. 2020" in result.output
    result = CliRunner().invoke(app, ["paths", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "probe: error: choose one of --count" in result.output
    result = CliRunner().invoke(app, ["paths", "--count", "--layers", "3", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "together" in result.output
