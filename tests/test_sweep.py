"""Sweeps (probe.analyses.sweep, ``probe sweep``): every point is one ``probe collapse`` run.

The oracle of a point is the collapse run with the point's settings, run on its own: the
sweep's variables at that point must equal it bit for bit (``assert_array_equal``: exact),
and its attention summaries ``probe attention``'s.  The summaries are recomputed here by
hand from the point's own per-sequence values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from typer.testing import CliRunner

import probe
from probe import Inputs, Model
from probe.analyses import attention, collapse, sweep
from probe.analyses.sweep_points import Store, parse_counts, parse_setting
from probe.cli.app import app
from probe.errors import ProbeError
from probe.measures import bounds
from probe.reports.reproduce import command_line

METRICS = ("relative_residual", "mu", "effective_rank", "stable_rank", "cosine_similarity")
SIZES = {"sequences": 2, "batch_size": 2}
VARIANTS = "SAN,transformer"


@pytest.fixture(scope="module")
def gpt2(tiny_folders):
    return tiny_folders["gpt2"]


@pytest.fixture(scope="module")
def swept(gpt2):
    """tokens 8, 12 x seeds 0, 1 at random init: four points."""
    torch.set_num_threads(1)
    return sweep.run(Model(gpt2, init="random"), Inputs(**SIZES), tokens=[8, 12], seeds="0-1",
                     variants=VARIANTS)  # fmt: skip


def test_every_point_equals_its_collapse_run_bit_for_bit(swept, gpt2):
    assert list(swept.tokens.values) == [8, 12] and list(swept.seed.values) == [0, 1]
    assert swept["done"].all() and swept.attrs["points"] == swept.attrs["points_done"] == 4
    for tokens in (8, 12):
        for seed in (0, 1):
            model, inputs = Model(gpt2, init="random", seed=seed), Inputs(tokens=tokens, **SIZES)
            alone = collapse.run(model, inputs, variants=VARIANTS)
            point = swept.sel(tokens=tokens, seed=seed)
            for name in (*METRICS, *bounds.VARIABLES):
                assert point[name].dims == alone[name].dims
                np.testing.assert_array_equal(point[name].values, alone[name].values)
            assert point["request"].item() == alone.attrs["request"]
            assert f"--seed {seed}" in command_line(alone.attrs)
            measured = attention.run(model, inputs)
            np.testing.assert_array_equal(point["sink_rate"].values, measured["sink_rate"].values)
            np.testing.assert_array_equal(
                point["massive_ratio"].values, measured["massive_ratio"].values
            )


def test_config_and_branch_scale_points_equal_their_collapse_runs(gpt2):
    ds = sweep.run(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES),
                   config={"n_layer": [1, 3]}, branch_scale="1,1/sqrt(L)", variants=VARIANTS)  # fmt: skip
    assert ds.sizes["layer"] == 4 and list(ds.branch_scale.values) == ["1", "1/sqrt(L)"]
    for layers in (1, 3):
        for scale in ("1", "1/sqrt(L)"):
            model = Model(gpt2, init="random", config={"n_layer": layers})
            alone = collapse.run(model, Inputs(tokens=8, **SIZES), variants=VARIANTS,
                                 branch_scale=scale)  # fmt: skip
            point = ds.sel(n_layer=layers, branch_scale=scale, layer=range(layers + 1))
            for name in (*METRICS, *bounds.VARIABLES):
                np.testing.assert_array_equal(point[name].values, alone[name].values)
            assert point["request"].item() == alone.attrs["request"]
            assert float(point["branch_scale_value"]) == alone.attrs["branch_scale_value"]
            assert int(point["n_layers"]) == layers
            measured = attention.run(model, Inputs(tokens=8, **SIZES), branch_scale=scale)
            np.testing.assert_array_equal(
                point["massive_ratio"].values, measured["massive_ratio"].values
            )
    assert float(ds["branch_scale_value"].sel(n_layer=3, branch_scale="1/sqrt(L)")) == 1 / np.sqrt(
        3
    )
    assert np.isnan(ds["relative_residual"].sel(n_layer=1, layer=[2, 3])).all()  # padded


def test_the_summaries_by_hand(swept):
    point = swept.sel(tokens=12, seed=1)
    r = point["relative_residual"].sel(fit="mean", norm="l1inf")  # variant, init, layer, sequence
    for variant in point.variant.values:
        values = r.sel(variant=variant, init="random").values
        final = float(np.median(values[-1]))
        assert float(point["final_residual"].sel(variant=variant, init="random")) == final
        mean = values.mean(axis=-1)
        below = [layer for layer, m in enumerate(mean) if m < 1e-3]
        expected = below[0] if below else -1
        assert int(point["first_below"].sel(variant=variant, init="random")) == expected
        rank = point["effective_rank"].sel(variant=variant, init="random").values[-1]
        assert float(point["final_effective_rank"].sel(variant=variant, init="random")) == float(
            np.median(rank)
        )
        # the rate of mu: log of the mean mu over sequences against the layer, through the
        # layers whose mean relative distance (fit mean, Frobenius) is above 10 float32 eps
        mu = point["mu"].sel(variant=variant, init="random").values.mean(axis=-1)
        fro = point["relative_residual"].sel(fit="mean", norm="fro", variant=variant)
        above = np.flatnonzero(fro.sel(init="random").values.mean(axis=-1) >= 10 * 2.0**-23)
        at = point.sel(variant=variant, init="random")
        assert int(at["mu_rate_layers"]) == len(above) >= 3
        slope, intercept = np.polyfit(above, np.log(mu[above]), 1)
        assert float(at["mu_rate"]) == np.exp(slope)  # the same least squares: bit for bit
        y = np.log(mu[above])
        r2 = 1 - np.sum((y - intercept - slope * above) ** 2) / np.sum((y - y.mean()) ** 2)
        # the fit's R^2 from its own centred form: the same sums in another order
        assert float(at["mu_rate_r2"]) == pytest.approx(r2, abs=1e-13)
    massive = point["massive_ratio"].sel(init="random").values
    assert float(point["max_massive_ratio"].sel(init="random")) == massive[1:].max()
    assert swept["first_below"].dtype == np.int64


def test_points_of_different_depth_are_padded_with_nan(gpt2):
    ds = sweep.run(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES),
                   config={"n_layer": [2, 3]}, variants="SAN")  # fmt: skip
    assert list(ds.n_layer.values) == [2, 3] and ds.sizes["layer"] == 4
    r = ds["relative_residual"]
    assert np.isnan(r.sel(n_layer=2, layer=3)).all() and np.isfinite(r.sel(n_layer=3)).all()
    alone = collapse.run(Model(gpt2, init="random", config={"n_layer": 2}),
                         Inputs(tokens=8, **SIZES), variants="SAN")  # fmt: skip
    np.testing.assert_array_equal(r.sel(n_layer=2, layer=[0, 1, 2]).values, alone[r.name].values)
    assert list(ds["n_layers"].values) == [2, 3]


def test_checkpoint_steps_keep_their_folders(gpt2, tmp_path):
    from transformers import AutoConfig, GPT2Model

    torch.manual_seed(0)  # the same config, other weights: a later step of one run
    later = tmp_path / "later"
    GPT2Model(AutoConfig.from_pretrained(gpt2)).save_pretrained(later)
    ds = sweep.run(Model(gpt2, init="pretrained"), Inputs(tokens=8, **SIZES),
                   steps=[(0, gpt2), (50, str(later))], variants="SAN")  # fmt: skip
    assert list(ds.step.values) == [0, 50]
    alone = collapse.run(Model(gpt2, init="pretrained"), Inputs(tokens=8, **SIZES), variants="SAN")
    r = ds["relative_residual"]
    np.testing.assert_array_equal(r.sel(step=0).values, alone[r.name].values)
    assert list(ds["folder"].values) == [gpt2, str(later)]


@pytest.mark.slow  # seven checkpoints: over a minute on a shared CPU
def test_the_shipped_checkpoint_series_runs_offline(tmp_path, monkeypatch):
    shipped = pytest.importorskip("probe.loading.shipped")
    if not hasattr(shipped, "series"):
        pytest.skip("no checkpoint series ships with this version")
    steps = shipped.series("gpt2-tiny-steps")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    done = _cli(["sweep", "gpt2-tiny-steps", "--init", "pretrained", "--sequences", "2",
                 "--tokens", "8", "--variants", "SAN", "--no-attention", "--out", "r", "-q"],
                monkeypatch, tmp_path)  # fmt: skip
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("sweep-gpt2-tiny-steps-*.nc")
    ds = probe.open_result(nc)
    assert list(ds.step.values) == [step for step, _ in steps]
    assert list(ds.folder.values) == [str(folder) for _, folder in steps]
    step, folder = steps[-1]
    alone = collapse.run(Model(str(folder), init="pretrained"), Inputs(tokens=8, **SIZES),
                         variants="SAN")  # fmt: skip
    np.testing.assert_array_equal(
        ds["relative_residual"].sel(step=step).values, alone["relative_residual"].values
    )


def test_two_processes_split_the_points_and_gather_the_same(gpt2, tmp_path):
    plan = sweep.plan(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES), seeds="0-2",
                      variants="SAN")  # fmt: skip
    store = Store(tmp_path / "points", plan.fixed)
    mine = [sweep.execute(plan, store, part=(rank, 2)) for rank in (0, 1)]
    assert [ds is not None for ds in mine[0]] == [True, False, True]  # round robin
    assert [ds is not None for ds in mine[1]] == [False, True, False]
    assert sorted(p.name for p in (tmp_path / "points").iterdir()) == sorted(
        store.path(p).name for p in plan.points
    )
    split = sweep.gather(plan, [store.read(p) for p in plan.points])
    whole = sweep.gather(plan, sweep.execute(plan))
    for name in (*METRICS, "final_residual", "order", "order_pairs", "order_stderr", "sink_rate",
                 "command"):  # fmt: skip
        np.testing.assert_array_equal(split[name].values, whole[name].values)


def test_each_points_order_comes_with_its_quality(gpt2):
    from probe.measures import stats

    plan = sweep.plan(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES), seeds="0-1",
                      variants="SAN", attention=False)  # fmt: skip
    points = sweep.execute(plan)
    ds = sweep.gather(plan, points)
    for seed, point in zip((0, 1), points, strict=True):
        fitted = stats.order_fit(point).sel(variant="SAN", init="random")
        at = ds.sel(seed=seed, init="random", variant="SAN")
        assert int(at["order_pairs"]) == int(fitted["pairs"])
        np.testing.assert_array_equal(at["order_stderr"].values, fitted["stderr"].values)
        np.testing.assert_array_equal(at["order_spread"].values, fitted["spread"].values)
        text = stats.point_order_text(ds.sel(seed=seed, init="random"), "SAN", ds)
        if np.isfinite(float(fitted["order"])):
            assert text.startswith(f"{float(fitted['order']):.2f} (") and "pairs)" in text
        else:  # a dash and the reason, never a bare slope
            assert text == f"– ({fitted['reason'].item()})"


def test_a_partial_gather_says_which_points_it_holds(gpt2):
    plan = sweep.plan(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES), seeds="0,3,7",
                      variants="SAN", attention=False)  # fmt: skip
    first = sweep.execute(plan, part=(0, 3))
    ds = sweep.gather(plan, first)
    assert list(ds.seed.values) == [0, 3, 7]
    assert list(ds["done"].values) == [True, False, False]
    assert ds.attrs["points_done"] == 1 and ds.attrs["points"] == 3
    assert np.isnan(ds["final_residual"].sel(seed=3)).all()
    assert np.isnan(ds["sink_rate"]).all()  # attention=False measures none


def test_a_store_takes_a_point_only_with_its_own_settings(gpt2, tmp_path):
    plan = sweep.plan(Model(gpt2, init="random"), Inputs(tokens=8, **SIZES), seeds="0-1",
                      variants="SAN", attention=False)  # fmt: skip
    store = Store(tmp_path, plan.fixed, sweep.SUMMARIES)
    sweep.execute(plan, store)
    assert store.done(plan.points) == [True, True]
    other = Store(tmp_path, {**plan.fixed, "sequences": 3})
    assert other.done(plan.points) == [False, False]
    # a point written before a summary existed (here: the rate of mu) is run again
    first = store.read(plan.points[0])
    probe.save_result(first.drop_vars("mu_rate"), store.path(plan.points[0]))
    assert store.done(plan.points) == [False, True] and store.read(plan.points[0]) is None
    sweep.execute(plan, store)
    assert store.done(plan.points) == [True, True]
    store.path(plan.points[1]).write_bytes(b"not netCDF")  # damaged: run again
    assert store.done(plan.points) == [True, False] and store.read(plan.points[1]) is None


@pytest.mark.parametrize(
    ("text", "values"),
    [("64,256,1024", (64, 256, 1024)), ("0-4", (0, 1, 2, 3, 4)), ("0,3,7", (0, 3, 7)),
     (" 2 - 3 ,9", (2, 3, 9))],
)  # fmt: skip
def test_counts_and_ranges(text, values):
    assert parse_counts(text, "seeds", 0, 2000) == values


def test_settings_are_typed():
    assert parse_setting("n_layer=2,4") == ("n_layer", (2, 4))
    assert parse_setting("initializer_range=0.02,1e-1") == ("initializer_range", (0.02, 0.1))
    assert parse_setting("use_cache=true,false") == ("use_cache", (True, False))
    assert parse_setting("x=1.,.5,1_000,nan,0x10") == ("x", (1.0, 0.5, "1_000", "nan", "0x10"))
    assert parse_setting("activation_function=gelu,relu") == ("activation_function",
                                                               ("gelu", "relu"))  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"seeds": "0"}, "nothing to sweep"),
        ({"seeds": "0,0"}, "gives 0 more than once"),
        ({"seeds": "3-1"}, "runs backwards"),
        ({"seeds": "0-4", "max_points": 4}, "5 points"),
        ({"config": {"layer": "2,3"}}, "dimension of that name"),
    ],
)
def test_bad_sweeps_are_refused_before_any_point(gpt2, options, message):
    with pytest.raises(ProbeError, match=message):
        sweep.plan(Model(gpt2, init="random"), Inputs(**SIZES), **options)


# --- the command line -------------------------------------------------------------------


def _cli(args, monkeypatch, folder):
    from probe.cli.app import app

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(folder)
    return CliRunner().invoke(app, args)


def test_dry_run_prints_the_points_and_writes_nothing(gpt2, tmp_path, monkeypatch):
    done = _cli(["sweep", gpt2, "--init", "random", "--tokens", "8,16", "--seeds", "0-1",
                 "--sequences", "2", "--dry-run", "--out", "r"], monkeypatch, tmp_path)  # fmt: skip
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0].startswith("point 1/4: tokens=8, seed=0 · to run · 30,080 parameters")
    assert lines[3].startswith("point 4/4: tokens=16, seed=1 · to run")
    assert lines[4].startswith("total: 4 points (0 done), 4 to run, time >= ")
    assert lines[-1] == "dry run: nothing was run or written"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0,10"], "one step per MODEL folder: 1 folders"),
        (["--seeds", "0,x"], "--seeds must be a whole number from 0 to "),
        (["--seeds", "0-1", "--seed", "3"], "No such option: --seed"),  # --seeds takes one
        (["--set", "n_layer"], "KEY=V1,V2"),
        (["--tokens", "8,8"], "--tokens gives 8 more than once"),
        (["--seeds", "0-9", "--max-points", "5"], "10 points (10 seed), more than --max-points 5"),
        (["--tokens", "8"], "nothing to sweep"),
        # 1e-9 h is 3.6 microseconds: less than any point's forward passes take anywhere
        (
            ["--seeds", "0-1", "--tokens", "8", "--max-hours", "1e-9"],
            "of forward passes at this machine's",
        ),
        (["--seeds", "0-1", "--max-hours", "0"], "--max-hours must be"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(gpt2, tmp_path, monkeypatch, args, message):
    done = _cli(["sweep", gpt2, "--init", "random", *args, "--out", "r"], monkeypatch, tmp_path)
    assert done.exit_code == 2, done.output
    (line,) = done.stderr.splitlines()
    assert line.startswith("probe: error: ") and message in line, line
    assert list(tmp_path.iterdir()) == []


def test_the_command_writes_one_result_whose_points_equal_probe_collapse(
    gpt2, tmp_path, monkeypatch
):
    args = ["--init", "random", "--sequences", "2", "--batch-size", "2", "--variants", VARIANTS]
    done = _cli(["sweep", gpt2, *args, "--tokens", "8,12", "--out", "r", "-q"], monkeypatch,
                tmp_path)  # fmt: skip
    assert done.exit_code == 0, done.output
    (nc,) = (tmp_path / "r").glob("sweep-*.nc")
    assert nc.with_suffix(".html").is_file() and (tmp_path / "r" / "index.html").is_file()
    assert not (tmp_path / "r" / "sweep-points").exists()  # the result holds every point
    ds = probe.open_result(nc)
    assert ds.attrs["analysis"] == "sweep" and ds.attrs["points_done"] == 2
    alone = _cli(["collapse", gpt2, *args, "--tokens", "12", "--out", "c", "-q"], monkeypatch,
                 tmp_path)  # fmt: skip
    assert alone.exit_code == 0, alone.output
    (one,) = (tmp_path / "c").glob("collapse-*.nc")
    one = probe.open_result(one)
    for name in (*METRICS, *bounds.VARIABLES):
        np.testing.assert_array_equal(ds[name].sel(tokens=12).values, one[name].values)
    html = nc.with_suffix(".html").read_text()
    assert "sweep over tokens" in html and "<svg" in html
    nc.with_suffix(".html").unlink()  # `probe report build` renders it again from the result
    again = _cli(["report", "build", str(nc)], monkeypatch, tmp_path)
    assert again.exit_code == 0, again.output
    assert "sweep over tokens" in nc.with_suffix(".html").read_text()


def test_figures(swept):
    from probe.figures.plot_sweep import curves, figure, phase

    fig = curves(swept)
    first = fig.axes[0]
    assert first.get_xlabel() == "tokens" and first.get_ylabel().startswith("relative residual")
    assert len(first.lines) == 2  # SAN and transformer, mean over seeds
    with pytest.raises(ValueError, match="two swept values"):
        phase(swept)
    assert figure(swept).axes[0].get_xlabel() == "tokens"
    seeds = curves(swept.sel(tokens=8))  # only seeds swept: they are the x axis
    assert seeds.axes[0].get_xlabel() == "seed"
    np.testing.assert_array_equal(seeds.axes[0].lines[0].get_xdata(), [0, 1])
    two = xr.concat([swept.expand_dims(width=[w]) for w in (32, 64)], "width")
    two.attrs["sweep_dims"] = '{"width": ["32", "64"], "tokens": ["8", "12"], "seed": ["0", "1"]}'
    heat = phase(two)
    lines = curves(two).axes[0].lines  # SAN and transformer, at tokens 8 and 12
    assert [line.get_label() for line in lines] == [
        "SAN · tokens 8",
        "transformer · tokens 8",
        "SAN · tokens 12",
        "transformer · tokens 12",
    ]
    assert [line.get_linestyle() for line in lines] == ["-", "-", "--", "--"]
    assert [ax.get_title() for ax in heat.axes[:2]] == ["SAN", "transformer"]
    assert heat.axes[0].get_ylabel() == "width" and heat.axes[0].get_xlabel() == "tokens"
    assert swept.probe.plot().axes[0].get_xlabel() == "tokens"  # the notebook's figure
    assert two.probe.plot().axes[0].get_title() == "SAN"
    never = swept.copy()
    never["first_below"] = never["first_below"] * 0 - 1  # no point falls below the threshold
    panel = next(ax for ax in curves(never).axes if "first layer" in ax.get_ylabel())
    assert [t.get_text() for t in panel.texts] == ["never reached at any point"]
    assert list(panel.get_yticks()) == []


def test_the_report_draws_the_phase_diagram_of_two_swept_values(swept):
    from probe.reports.sweep_report import render_sweep

    page = render_sweep(swept, result_file="s.nc")
    assert "phase diagram" not in page and page.count("<svg") == 1
    assert '<meta name="probe:analysis" content="sweep">' in page
    assert "4 of 4 points" in page and page.count("probe collapse ") >= 4
    two = xr.concat([swept.expand_dims(width=[w]) for w in (32, 64)], "width")
    two.attrs["sweep_dims"] = '{"width": ["32", "64"], "tokens": ["8", "12"], "seed": ["0", "1"]}'
    page = render_sweep(two, result_file="s.nc")
    assert "The phase diagram" in page and page.count("<svg") == 2


def test_nothing_to_sweep_names_every_axis_a_grid_has():
    """The line lists the grid's own fields (the library's names; the command's options),
    so an axis added to the grid is named without editing the message."""
    import dataclasses

    from probe.analyses.sweep_axes import Grid

    with pytest.raises(ProbeError, match="nothing to sweep") as caught:
        sweep.plan("gpt2", init="random", tokens=8)
    for field in dataclasses.fields(Grid):
        assert f"`{field.name}`" in str(caught.value), field.name
    done = CliRunner().invoke(app, ["sweep", "gpt2", "--init", "random", "--tokens", "8"])
    assert done.exit_code == 2
    for option in ("--set", "--branch-scale", "--mask", "--revisions", "--tokens", "--seeds",
                   "--steps"):  # fmt: skip
        assert option in done.stderr, option
