"""probe paths --count: exact counts, shares, the presets, the Dataset, the report and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import probe
from probe.analyses import paths
from probe.analyses.path_count import exact_counts, table
from probe.analyses.path_presets import PRESETS, all_presets, shipped_presets
from probe.cli.app import app
from probe.errors import ProbeError
from probe.files.results import open_result, save_result
from probe.reports.index import read_meta
from probe.reports.paths_report import render_paths


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
    assert len(ds.architecture) == len(all_presets()) > len(PRESETS)
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


CONFIGS = Path(probe.__file__).parent / "configs"


def _shape_from_json(path: Path) -> tuple[int, int]:
    """(L, H) straight from a config file, by the key each family's config.json uses."""
    data = json.loads(path.read_text())
    layers = next(
        data[k] for k in ("num_hidden_layers", "n_layer", "num_layers", "n_layers") if k in data
    )
    heads = next(
        data[k] for k in ("num_attention_heads", "n_head", "num_heads", "n_heads") if k in data
    )
    return layers, heads


def test_every_shipped_config_is_a_preset_with_its_files_shape():
    files = {p.stem.replace("--", "/"): p for p in CONFIGS.glob("*.json")}
    assert len(files) >= 28
    shipped = {p.name: p for p in shipped_presets()}
    stands_for = {hub_id: p for p in PRESETS for hub_id in p.configs}
    # Each file is counted once: its own row, or the paper's entry that stands for it.
    assert set(shipped) | set(stands_for) == set(files) and not set(shipped) & set(stands_for)
    for hub_id, path in files.items():
        preset = shipped.get(hub_id) or stands_for[hub_id]
        assert (preset.layers, preset.heads) == _shape_from_json(path), hub_id
        if hub_id in shipped:
            assert preset.group == "today" and path.name in preset.source
    ds = paths.count(command="probe paths --count")
    llama = ds.sel(architecture="meta-llama/Llama-3.2-1B")
    assert int(llama["total"].item()) == 33**16
    assert "8 key/value heads" in str(llama["source"].values)


@pytest.mark.parametrize(
    "hub_id",
    sorted(p.stem.replace("--", "/") for p in CONFIGS.glob("*.json")),
)
def test_count_reads_every_shipped_hub_id_offline(hub_id):
    ds = paths.count(hub_id, command="test")
    path = CONFIGS / f"{hub_id.replace('/', '--')}.json"
    assert (int(ds.layers[0]), int(ds.heads[0])) == _shape_from_json(path)
    assert "bundled with probe" in str(ds["source"].values[0])


def test_cli_count_a_hub_id_offline(tmp_path):
    result = CliRunner().invoke(
        app, ["paths", "--count", "meta-llama/Llama-3.2-1B", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "meta-llama/Llama-3.2-1B: L=16, H=32" in result.output
    assert f"{33**16} paths in total" in result.output


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
        ProbeError, match="not in the local HuggingFace cache.*`layers` L `heads` H"
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


def test_count_figure_draws_each_shape_once():
    from probe.figures.plot_paths import count_shares

    ds = paths.count(command="probe paths --count")
    shapes = {(int(a), int(b)) for a, b in zip(ds.layers.values, ds.heads.values, strict=True)}
    assert len(shapes) < ds.sizes["architecture"]  # a dozen shipped configs are 12 x 12
    [ax] = count_shares(ds).axes
    assert len(ax.lines) == len(shapes)
    labels = [line.get_label() for line in ax.lines]
    assert any("more (L=12, H=12)" in label for label in labels)
    # The paper's shapes are solid, even where a shipped config shares them.
    bert = next(line for line in ax.lines if "(L=12, H=12)" in line.get_label())
    assert bert.get_linestyle() == "-"
