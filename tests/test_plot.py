"""probe.figures.plot: figure objects checked directly (axes, lines, limits), and the order fit."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_hex

from probe.figures import plot
from probe.measures import stats
from tests.datasets import VARIANTS, make_collapse_dataset


@pytest.fixture(scope="module")
def ds() -> xr.Dataset:
    return make_collapse_dataset(layers=6, sequences=5)


def labelled(ax) -> dict[str, mpl.lines.Line2D]:
    """Lines that carry a legend label (bands, floors and paths start with "_")."""
    return {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}


def means(ds: xr.Dataset, name="relative_residual", norm="l1inf", fit="mean") -> xr.DataArray:
    da = ds[name]
    if "norm" in da.dims:
        da = da.sel(norm=norm, fit=fit)
    return da.mean("sequence")


def with_r(values: np.ndarray, dtype: str = "float64") -> xr.Dataset:
    """A one-variant, one-init dataset whose relative residual is `values` at every sequence."""
    base = make_collapse_dataset(layers=len(values) - 1, sequences=3, dtype=dtype)
    base = base.sel(variant=["SAN"], init=["random"])
    r = np.broadcast_to(np.asarray(values, float)[:, None, None, None], (len(values), 3, 2, 5))
    base["relative_residual"] = (("layer", "sequence", "fit", "norm"), r.copy())
    base["relative_residual"] = base["relative_residual"].expand_dims(
        variant=["SAN"], init=["random"]
    )
    return base


# --- collapse -------------------------------------------------------------------------------


def test_collapse_layout_labels_and_limits(ds):
    fig = plot.collapse(ds)
    axes = fig.axes
    assert len(axes) == 2
    assert [ax.get_title() for ax in axes] == ["init: pretrained", "init: random"]
    for ax in axes:
        assert list(labelled(ax)) == list(VARIANTS)
        assert ax.get_xlabel() == "layer"
        assert ax.get_yscale() == "linear"
        assert ax.get_ylim() == (0.0, 1.0)
        assert ax.get_xlim() == (0.0, 6.0)
    assert "relative residual" in axes[0].get_ylabel()
    assert "1,∞ norm" in axes[0].get_ylabel()


def test_collapse_plots_the_sequence_means(ds):
    fig = plot.collapse(ds, norm="fro", fit="svd")
    expected = means(ds, norm="fro", fit="svd")
    for ax, init in zip(fig.axes, ["pretrained", "random"], strict=True):
        for variant, line in labelled(ax).items():
            np.testing.assert_array_equal(line.get_xdata(), ds.layer.values)
            np.testing.assert_allclose(line.get_ydata(), expected.sel(variant=variant, init=init))


def test_collapse_log_clips_at_the_floor(ds):
    fig = plot.collapse(ds, log=True)
    eps = np.finfo("float64").eps
    expected = np.clip(means(ds), eps, None)
    for ax, init in zip(fig.axes, ["pretrained", "random"], strict=True):
        assert ax.get_yscale() == "log"
        bottom, top = ax.get_ylim()
        assert bottom <= eps and top >= 1
        for variant, line in labelled(ax).items():
            y = np.asarray(line.get_ydata())
            assert (y >= eps).all()
            np.testing.assert_allclose(y, expected.sel(variant=variant, init=init))


def test_collapse_float32_floor():
    ds32 = make_collapse_dataset(dtype="float32", layers=8)
    ax = plot.collapse(ds32, log=True).axes[0]
    y = np.asarray(labelled(ax)["SAN"].get_ydata())
    assert y.min() == pytest.approx(np.finfo("float32").eps)


def test_one_panel_per_init_present():
    one = make_collapse_dataset(inits=("pretrained",), variants=("SAN", "transformer"))
    fig = plot.collapse(one)
    assert len(fig.axes) == 1
    assert fig.axes[0].get_title() == "init: pretrained"
    assert list(labelled(fig.axes[0])) == ["SAN", "transformer"]


def test_panels_and_variants_in_canonical_order():
    shuffled = make_collapse_dataset(
        inits=("pretrained", "random"), variants=("transformer", "SAN+skip", "SAN")
    )
    fig = plot.collapse(shuffled)
    assert [ax.get_title() for ax in fig.axes] == ["init: pretrained", "init: random"]
    assert list(labelled(fig.axes[0])) == ["SAN", "SAN+skip", "transformer"]


def test_variant_missing_for_one_init_is_left_out():
    ds = make_collapse_dataset(missing=(("SAN+MLP", "pretrained"),))
    pretrained, random = plot.collapse(ds).axes
    assert "SAN+MLP" in labelled(random)
    assert "SAN+MLP" not in labelled(pretrained)
    assert len(labelled(pretrained)) == 3


def test_partly_missing_layers_leave_gaps():
    ds = make_collapse_dataset()
    ds["relative_residual"][0, 0, 2] = np.nan  # SAN, random, layer 2, every sequence
    line = labelled(plot.collapse(ds).axes[0])["SAN"]
    y = np.asarray(line.get_ydata())
    assert np.isnan(y[2]) and np.isfinite(np.delete(y, 2)).all()


def test_colours_are_fixed_per_variant(ds):
    figs = [plot.collapse(ds), plot.metric(ds, "stable_rank"), plot.comparison([ds])]
    for fig in figs:
        for ax in fig.axes:
            for variant, line in labelled(ax).items():
                assert to_hex(line.get_color()) == plot.COLOURS[variant]
    assert len(set(plot.COLOURS.values())) == len(plot.COLOURS)  # one colour per variant


def test_no_pyplot_figures_and_no_rcparams_leak(ds):
    before = dict(mpl.rcParams)
    plot.collapse(ds, log=True)
    plot.collapse_order(ds)
    plot.metric(ds, "effective_rank")
    plot.comparison([ds, ds])
    assert plt.get_fignums() == []
    assert dict(mpl.rcParams) == before


# --- metric ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", plot.METRICS)
def test_metric_figures(ds, name):
    fig = plot.metric(ds, name)
    assert len(fig.axes) == 2
    expected = means(ds, name)
    for ax, init in zip(fig.axes, ["pretrained", "random"], strict=True):
        assert ax.get_ylabel() in ("", plot.metric_label(name))
        for variant, line in labelled(ax).items():
            np.testing.assert_allclose(line.get_ydata(), expected.sel(variant=variant, init=init))
    assert fig.axes[0].get_ylabel() == plot.metric_label(name)


def test_metric_is_not_clamped_to_unit_interval(ds):
    ax = plot.metric(ds, "effective_rank").axes[0]
    assert ax.get_ylim()[1] > 5  # effective ranks go far above 1


def test_metric_rejects_unknown_names(ds):
    with pytest.raises(ValueError, match="unknown metric"):
        plot.metric(ds, "relative_residual")


# --- order of collapse ----------------------------------------------------------------------


def test_fit_order_cubic_is_three():
    r = [0.5]
    for _ in range(5):
        r.append(r[-1] ** 3)
    order = stats.fit_order(with_r(np.array(r)))
    assert order.dims == ("variant", "init")
    assert float(order.sel(variant="SAN", init="random")) == pytest.approx(3.0)


def test_fit_order_geometric_is_one():
    r = 0.4 * 0.5 ** np.arange(8)
    assert float(stats.fit_order(with_r(r))[0, 0]) == pytest.approx(1.0)


def test_fit_order_ignores_pairs_outside_the_window():
    # 0.9 -> 0.729 is above 0.5 and the floor values are rounding noise: neither counts.
    eps = np.finfo("float64").eps
    r = np.array([0.9, 0.729, 0.4, 0.064, 2.62e-4, eps, eps])
    assert float(stats.fit_order(with_r(r))[0, 0]) == pytest.approx(3.0, rel=1e-3)


def test_fit_order_float32_floor():
    # In float32 1e-8 is below 10 * eps: the last pair is noise and is dropped.
    r = np.array([0.3, 0.027, 1.97e-5, 1e-8])
    order = stats.fit_order(with_r(r, dtype="float32"))
    assert float(order[0, 0]) == pytest.approx(3.0, rel=1e-3)
    r64 = stats.fit_order(with_r(r, dtype="float64"))
    assert float(r64[0, 0]) != pytest.approx(3.0, rel=1e-3)


def test_fit_order_nan_with_fewer_than_two_pairs(ds):
    assert np.isnan(stats.fit_order(with_r(np.array([0.4, 0.064, 1e-300, 0.0]))))[0, 0]
    assert np.isnan(stats.fit_order(with_r(np.full(5, 0.6))))[0, 0]  # all above 0.5
    assert np.isnan(stats.fit_order(with_r(np.full(5, 0.3))))[0, 0]  # no spread in r(l)
    assert np.isnan(stats.fit_order(with_r(np.full(5, np.nan))))[0, 0]
    order = stats.fit_order(ds)
    assert np.isnan(order.sel(variant="transformer")).all()  # ~0.6 throughout


def test_fit_order_on_the_synthetic_story(ds):
    order = stats.fit_order(ds)
    assert list(order.variant.values) == list(VARIANTS)
    assert list(order.init.values) == ["pretrained", "random"]
    assert (order.sel(variant="SAN") > 2.5).all()
    assert (abs(order.sel(variant="SAN+skip") - 1) < 0.2).all()


@settings(max_examples=40, deadline=None)
@given(
    k=st.floats(1.0, 3.0),
    c=st.floats(0.3, 0.9),
    r0=st.floats(0.05, 0.5),
)
def test_fit_order_recovers_power_laws(k, c, r0):
    r = [r0]
    for _ in range(5):
        r.append(c * r[-1] ** k)
    r = np.array(r)
    order = float(stats.fit_order(with_r(r))[0, 0])
    low = 10 * np.finfo("float64").eps
    window = (r[:-1] >= low) & (r[1:] >= low) & (r[:-1] <= 0.5) & (r[1:] <= 0.5)
    spread = np.log10(r[:-1][window].max() / r[:-1][window].min()) if window.any() else 0.0
    if window.sum() > 2 or (window.sum() == 2 and spread >= stats.MIN_SPREAD):
        assert order == pytest.approx(k, rel=1e-6, abs=1e-6)  # exact: no residual, no stderr
    else:  # too few pairs, or two that are too close to tell a slope
        assert np.isnan(order)


def test_collapse_order_figure(ds):
    fig = plot.collapse_order(ds)
    order = stats.fit_order(ds)
    assert len(fig.axes) == 2
    for ax, init in zip(fig.axes, ["pretrained", "random"], strict=True):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        lines = labelled(ax)
        slopes = {}
        for name in ("slope 1 (exponential)", "slope 3 (doubly exponential)"):
            x, y = np.log(lines[name].get_xdata()), np.log(lines[name].get_ydata())
            slopes[name] = np.polyfit(x, y, 1)[0]
        assert slopes["slope 1 (exponential)"] == pytest.approx(1.0)
        assert slopes["slope 3 (doubly exponential)"] == pytest.approx(3.0)
        san = float(order.sel(variant="SAN", init=init))
        quality = _expected_quality(means(ds).sel(variant="SAN", init=init).values)
        assert f"SAN: slope {san:.2f} ({quality})" in lines
        assert "transformer: slope n/a" in lines
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert f"SAN: slope {san:.2f} ({quality})" in legend


def _expected_quality(m: np.ndarray) -> str:
    """The quality a slope of the mean r (float64 floor) is shown with, from scipy's
    linregress: "2 pairs" from two pairs (no residual), else its standard error and count."""
    from scipy.stats import linregress

    x, y = m[:-1], m[1:]
    low = 10 * np.finfo("float64").eps
    window = (x >= low) & (x <= 0.5) & (y >= low) & (y <= 0.5)
    if window.sum() == 2:
        return "2 pairs"
    fit = linregress(np.log(x[window]), np.log(y[window]))
    return f"± {fit.stderr:.2g}, {window.sum()} pairs"


def test_collapse_order_points_are_consecutive_means(ds):
    ax = plot.collapse_order(ds).axes[0]  # panels in the order of probe.names.INITS
    m = means(ds).sel(variant="SAN+skip", init="pretrained").values
    x, y = m[:-1], m[1:]
    colour = plot.COLOURS["SAN+skip"]
    path, fitted = [ln for ln in ax.get_lines() if to_hex(ln.get_color()) == colour]
    # The faint path shows every transition, the labelled line only those in the fit window.
    assert path.get_label() == "_path"
    np.testing.assert_allclose(path.get_xdata(), x)
    np.testing.assert_allclose(path.get_ydata(), y)
    window = (x <= stats.FIT_UPPER) & (y <= stats.FIT_UPPER)
    np.testing.assert_allclose(fitted.get_xdata(), x[window])
    np.testing.assert_allclose(fitted.get_ydata(), y[window])
    assert fitted.get_label().startswith("SAN+skip: slope ")
    assert fitted.get_label().endswith(" pairs)")  # the fit's quality beside its slope


# --- comparison -----------------------------------------------------------------------------


def test_comparison_panels_share_axes():
    small = make_collapse_dataset(model="a", layers=3)
    big = make_collapse_dataset(model="org/b", layers=12, dtype="float32", seed=1)
    fig = plot.comparison([small, big], log=False)
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == ["a\ninit: pretrained", "org/b\ninit: pretrained"]
    assert fig.axes[0].get_shared_y_axes().joined(fig.axes[0], fig.axes[1])
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim() == (0.0, 1.0)
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim() == (0.0, 12.0)
    for ax, one in zip(fig.axes, [small, big], strict=True):
        for variant, line in labelled(ax).items():
            np.testing.assert_allclose(
                line.get_ydata(), means(one).sel(variant=variant, init="pretrained")
            )


def test_comparison_log_and_init_choice():
    a = make_collapse_dataset(model="a", inits=("random",))
    b = make_collapse_dataset(model="b")
    fig = plot.comparison([a, b])
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    assert [ax.get_title().split("\n")[1] for ax in fig.axes] == [
        "init: random",
        "init: pretrained",
    ]
    fig = plot.comparison([a, b], init="random")
    assert fig.axes[1].get_title().endswith("init: random")
    with pytest.raises(ValueError, match="no init"):
        plot.comparison([a, b], init="pretrained")
    with pytest.raises(ValueError):
        plot.comparison([])


def test_comparison_wraps_at_three_panels():
    datasets = [make_collapse_dataset(model=f"m{i}", layers=3, seed=i) for i in range(8)]
    fig = plot.comparison(datasets)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().split("\n")[0] for ax in visible] == [f"m{i}" for i in range(8)]
    assert len(fig.axes) == 9  # three rows of three, the last one hidden
    rows = sorted({round(ax.get_position().y0, 3) for ax in visible})
    assert len(rows) == 3


def test_across_models_one_line_per_model_and_variant():
    a = make_collapse_dataset(model="enc", layers=3)
    b = make_collapse_dataset(model="dec", layers=5, seed=1, dtype="float32")
    b.attrs["causal"] = 1
    fig = plot.across_models([a, b])
    assert [ax.get_title() for ax in fig.axes] == list(VARIANTS)
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        lines = labelled(ax)
        assert set(lines) == {"enc", "dec"}
        assert lines["enc"].get_linestyle() == "-" and lines["dec"].get_linestyle() == "--"
        for one, line in ((a, lines["enc"]), (b, lines["dec"])):
            expected = means(one).sel(variant=ax.get_title(), init="pretrained").values
            np.testing.assert_allclose(line.get_ydata(), np.clip(expected, stats.eps(one), None))
    with pytest.raises(ValueError):
        plot.across_models([])


# --- summarise and odd names ----------------------------------------------------------------


def test_summarise_numbers(ds):
    summary = stats.summarise(ds, threshold=1e-3)
    m = means(ds)
    for variant in VARIANTS:
        for init in ("random", "pretrained"):
            got = summary[variant][init]
            series = m.sel(variant=variant, init=init).values
            below = np.flatnonzero(series < 1e-3)
            assert got["first_below"] == (int(below[0]) if below.size else None)
            assert got["final"] == pytest.approx(series[-1])
            assert got["final_layer"] == 6
    assert summary["SAN"]["random"]["first_below"] is not None
    assert summary["transformer"]["random"]["first_below"] is None
    assert summary["transformer"]["random"]["order"] is None
    order = stats.fit_order(ds).sel(variant="SAN", init="random")
    assert summary["SAN"]["random"]["order"] == pytest.approx(float(order))


def test_summarise_skips_missing_and_uses_last_layer_with_data():
    ds = make_collapse_dataset(missing=(("SAN", "pretrained"),))
    ds["relative_residual"].loc[{"variant": "transformer", "init": "random", "layer": 4}] = np.nan
    summary = stats.summarise(ds)
    assert "pretrained" not in summary["SAN"]
    assert summary["transformer"]["random"]["final_layer"] == 3


def test_dollar_signs_in_model_names_are_not_mathtext():
    odd = make_collapse_dataset(model="/tmp/$x$_<b>&")
    fig = plot.collapse(odd)
    fig.canvas.draw()  # would raise on broken mathtext
    assert "\\$x\\$" in fig.get_suptitle()


def test_shared_log_range_covers_every_panel():
    # Only the random panel collapses; the pretrained panel must not cut it off.
    ds = make_collapse_dataset(layers=6, variants=("SAN", "transformer"))
    ds["relative_residual"].loc[{"variant": "SAN", "init": "pretrained"}] = 0.5
    pretrained, random = plot.collapse(ds, log=True).axes
    eps = np.finfo("float64").eps
    assert random.get_ylim() == pretrained.get_ylim()
    assert random.get_ylim()[0] <= eps
    floors = [ln for ln in random.get_lines() if ln.get_label() == "_eps"]
    assert len(floors) == 1 and floors[0].get_ydata()[0] == eps


def test_style_and_palette_are_seaborn_s():
    # probe.figures.plot_style writes seaborn's style and palette out so that reports need neither
    # seaborn nor scipy; they must stay what seaborn gives.
    import seaborn as sns
    from matplotlib.colors import to_hex

    from probe.figures import plot_style

    assert list(plot_style.PALETTE) == [to_hex(c) for c in sns.color_palette("colorblind")]
    expected = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", font_scale=0.85)}
    expected.pop("image.cmap")  # seaborn's own colormap; these figures draw no images
    assert plot_style.STYLE == expected


def test_collapse_command_path_does_not_import_seaborn():
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['probe']; import cli.collapse_run, probe.reports.render, "
        "probe.figures.plot; print(sorted(m for m in ('seaborn', 'scipy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------- log-axis tick labels


_SUPERSCRIPTS = dict(zip("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻", strict=True))


def _log_labels(low: float, high: float) -> tuple[list[str], list[str]]:
    fig = plt.figure()
    ax = fig.subplots()
    ax.plot([0, 1], [low, high])
    plot.log_axis(ax)
    ax.set_ylim(low, high)
    fig.canvas.draw()
    inside = [  # the labels of ticks inside the view (the locators also give a few outside)
        [t.label1.get_text() for t in ticks if low <= t.get_loc() <= high and t.label1.get_text()]
        for ticks in (ax.yaxis.get_major_ticks(), ax.yaxis.get_minor_ticks())
    ]
    major, minor = inside
    plt.close(fig)
    return major, minor


def test_log_ticks_are_plain_text_by_hand():
    major, _ = _log_labels(1e-3, 10)
    assert major == ["10⁻³", "10⁻²", "10⁻¹", "10⁰", "10¹"]
    # Less than a decade: matplotlib labels minor ticks too (a subset of them).
    _, minor = _log_labels(0.015, 0.06)
    assert minor[:3] == ["2×10⁻²", "3×10⁻²", "4×10⁻²"]


@given(st.integers(-300, 300))
@settings(max_examples=60, deadline=None)
def test_log_tick_label_is_the_decade_written_out(exponent):
    formatter = plot.PlainLogFormatter()
    fig = plt.figure()
    ax = fig.subplots()
    plot.log_axis(ax)
    ax.set_ylim(10.0 ** (exponent - 1), 10.0 ** (exponent + 1))
    formatter.set_axis(ax.yaxis)
    label = formatter(10.0**exponent)
    plt.close(fig)
    assert "$" not in label
    assert label == "10" + "".join(_SUPERSCRIPTS[c] for c in str(exponent))


def test_unrecognised_log_labels_stay_as_matplotlib_made_them(monkeypatch):
    from matplotlib.ticker import LogFormatterSciNotation

    odd = r"$\mathdefault{10^{0.5}}$"
    monkeypatch.setattr(LogFormatterSciNotation, "__call__", lambda self, x, pos=None: odd)
    assert plot.PlainLogFormatter()(3.16) == odd
