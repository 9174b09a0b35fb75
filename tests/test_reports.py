"""probe.reports: self-contained, escaped, well-formed HTML with the right numbers in it."""

from __future__ import annotations

import re
from html import escape
from html.parser import HTMLParser

import numpy as np
import pytest
import xarray as xr

from probe import reports
from probe.measures import stats
from probe.models import ADAPTERS
from tests.datasets import VARIANTS, make_collapse_dataset

# Imported through the package: ruff files "probe.reports" (mapped from reports/) apart from probe.
comparison_name, index_entries = reports.comparison_name, reports.index_entries
render, render_comparison = reports.render, reports.render_comparison
render_index, report_name = reports.render_index, reports.report_name
read_meta, page, fmt = reports.index.read_meta, reports.page.page, reports.tables.fmt

ODD = "/tmp/a<b>&\"c'"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class Balance(HTMLParser):
    """Fails on an end tag that does not close the innermost open element."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-3:]}"
        self.stack.pop()


def assert_well_formed(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    parser = Balance()
    parser.feed(html)
    parser.close()
    assert parser.stack == []


def assert_self_contained(html: str) -> None:
    """No request can leave the page: no remote src/href/@import/url(), no scripts or links."""
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", html, re.I)
    assert not re.search(r"\ssrc\s*=", html, re.I)
    assert "@import" not in html
    for ref in re.findall(r"url\(([^)]*)\)", html):
        assert ref.startswith("#"), ref
    for ref in re.findall(r'href="([^"]*)"', html):
        assert not re.match(r"[a-z][a-z0-9+.-]*:|//", ref, re.I), ref
    assert "<?xml" not in html and "<!DOCTYPE svg" not in html


def hrefs(html: str) -> list[str]:
    return re.findall(r'(?<![:\w])href="([^"#][^"]*)"', html)


@pytest.fixture(scope="module")
def ds() -> xr.Dataset:
    return make_collapse_dataset(layers=4, sequences=5)


@pytest.fixture(scope="module")
def html(ds) -> str:
    return render(ds, result_file="tiny.nc")


@pytest.fixture(scope="module")
def odd_html() -> str:
    odd = make_collapse_dataset(
        model=ODD, layers=2, inits=("random",), created="2025-03-01T00:00:00+00:00"
    )
    odd.attrs["command"] = f"probe collapse '{ODD}' --init random"
    return render(odd, result_file="odd.nc")


# --- one report -----------------------------------------------------------------------------


def test_title_and_command(html):
    title = "Rank collapse in tiny-bert (bert, init: pretrained, random)"
    assert f"<title>{title}</title>" in html
    assert f"<h1>{title}</h1>" in html
    assert "<pre><code>probe collapse tiny-bert --init both</code></pre>" in html


def test_figures_are_inline_svg_with_unique_ids(html):
    assert html.count("<svg") == 6  # linear, log, order, three metrics
    assert html.count("<figure") == 6
    assert len(re.findall(r"<figure[^>]*><svg", html)) == 6
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    # Every in-page reference resolves to an id on this page.
    refs = re.findall(r'url\(#([^)]+)\)|href="#([^"]+)"', html)
    assert refs
    for ref in refs:
        assert (ref[0] or ref[1]) in set(ids)


def test_self_contained_and_well_formed(html):
    assert_self_contained(html)
    assert_well_formed(html)
    assert "<style>" in html and "tabular-nums" in html
    assert "Content-Security-Policy" in html
    assert hrefs(html) == ["tiny.nc", "tiny.nc"]


def test_default_result_file_is_the_report_name(ds):
    small = make_collapse_dataset(layers=1, sequences=2, inits=("random",), variants=("SAN",))
    assert f'href="{report_name(small)}.nc"' in render(small)


def test_metadata(html):
    assert read_meta(html) == {
        "model": "tiny-bert",
        "analysis": "collapse",
        "family": "bert",
        "variants": "SAN,SAN+MLP,SAN+skip,transformer",
        "init": "pretrained,random",
        "created": "2025-01-02T03:04:05Z",
        "result": "tiny.nc",
        "settings": "5x16 · seed 0 · float64 · text none · synthetic ids",
        "id": "00000000",
    }


def table(html: str, css_class: str, nth: int = 0) -> str:
    tables = re.findall(rf'<table class="{css_class}">.*?</table>', html, re.S)
    return tables[nth]


def test_stats_table_numbers(html, ds):
    expected = ds["relative_residual"].sel(norm="l1inf", fit="mean")
    mean, std = expected.mean("sequence"), expected.std("sequence")
    rr = table(html, "stats", 0)
    got = np.array([float(x) for x in re.findall(r'data-mean="([^"]+)"', rr)]).reshape(5, 2, 4)
    got_std = np.array([float(x) for x in re.findall(r'data-std="([^"]+)"', rr)]).reshape(5, 2, 4)
    want = mean.transpose("layer", "init", "variant").values
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got_std, std.transpose("layer", "init", "variant").values)
    m, s = (
        float(mean.sel(variant="SAN", init="random", layer=1)),
        float(std.sel(variant="SAN", init="random", layer=1)),
    )
    assert f"{fmt(m)} ± {fmt(s, 2)}</td>" in rr
    assert rr.count("<tr>") == 2 + 5  # two header rows, one row per layer


@pytest.mark.parametrize(("nth", "name"), [(1, "effective_rank"), (2, "stable_rank")])
def test_metric_tables(html, ds, nth, name):
    got = [float(x) for x in re.findall(r'data-mean="([^"]+)"', table(html, "stats", nth))]
    want = ds[name].mean("sequence").transpose("layer", "init", "variant").values.ravel()
    np.testing.assert_allclose(got, want)


def test_orders_table(html, ds):
    got = [float(x) for x in re.findall(r'data-order="([^"]+)"', table(html, "orders"))]
    want = stats.fit_order(ds).transpose("variant", "init").values.ravel()
    np.testing.assert_allclose(got, want)
    found = stats.order_fit(ds).isel(variant=0, init=0)
    assert int(found["pairs"]) == 2  # two pairs: the count is the fit's quality
    assert f"{float(found['order']):.2f} (2 pairs)</td>" in table(html, "orders")
    # a missing order says why
    assert "– (0 pairs between the float64 floor 2.2e-15 and 0.5; 2 needed)</td>" in table(
        html, "orders"
    )


def test_paragraph(html, ds):
    summary = stats.summarise(ds)
    first = summary["SAN"]["random"]["first_below"]
    assert first is not None
    assert f"At random init, SAN falls under 1e-3 at layer {first}" in html
    final = summary["transformer"]["pretrained"]["final"]
    assert f"the transformer variant stays above 1e-3 and ends at {final:.3g}" in html


def test_ablation_and_provenance(html, ds):
    ablations = table(html, "ablations")
    assert "<th>ablation</th><th>probe</th><th>paper</th>" in ablations
    no_skip = ADAPTERS["bert"].table[0]
    assert f"<td>no skip</td><td>{escape(no_skip['probe'])}</td>" in ablations
    provenance = table(html, "provenance")
    for key in ds.attrs:
        assert f"<td>{key}</td>" in provenance
    assert "<details><summary>config (3 keys)</summary>" in provenance
    assert "&quot;num_hidden_layers&quot;: 4" in provenance


def test_odd_model_names_are_escaped(odd_html):
    assert "<b>" not in odd_html
    assert escape(ODD, quote=True) in odd_html
    assert "a&lt;b&gt;&amp;&quot;c&#x27;" in odd_html
    assert read_meta(odd_html)["model"] == ODD
    assert_well_formed(odd_html)
    assert_self_contained(odd_html)


def test_broken_ablation_json_is_shown_escaped():
    ds = make_collapse_dataset(layers=1, sequences=2, inits=("random",), variants=("SAN",))
    ds.attrs["ablation_table"] = "not json <i>"
    html = render(ds)
    assert "<pre>not json &lt;i&gt;</pre>" in html
    assert_well_formed(html)


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inits", "dtype", "name"),
    [
        (
            "google-bert/bert-base-uncased",
            ("random",),
            "float32",
            "collapse-bert-base-uncased-random-float32-00000000",
        ),
        (
            "gpt2",
            ("pretrained", "random"),
            "float64",
            "collapse-gpt2-pretrained-random-float64-00000000",
        ),
        (
            "/models/My Model/",
            ("pretrained",),
            "float32",
            "collapse-my-model-pretrained-float32-00000000",
        ),
        ("C:\\runs\\xlnet", ("random",), "float64", "collapse-xlnet-random-float64-00000000"),
        (ODD, ("random",), "float64", "collapse-a-b-c-random-float64-00000000"),
        ("<>", ("random",), "float64", "collapse-model-random-float64-00000000"),
    ],
)
def test_report_name(model, inits, dtype, name):
    ds = make_collapse_dataset(model=model, inits=inits, dtype=dtype, layers=1, sequences=2)
    assert report_name(ds) == name
    assert re.fullmatch(r"[a-z0-9._-]+", name)


def test_comparison_name():
    a, b = make_collapse_dataset(model="org/a"), make_collapse_dataset(model="b")
    name = comparison_name([a, b])
    assert re.fullmatch(r"comparison-a-b-[0-9a-f]{8}", name)
    # Other results of the same models (another seed here): another comparison file.
    assert comparison_name([a, make_collapse_dataset(model="b", seed=1)]) != name


# --- index ----------------------------------------------------------------------------------


def test_index_newest_first_skipping_foreign_files(tmp_path, html, odd_html):
    (tmp_path / "old.html").write_text(html, encoding="utf-8")  # 2025-01-02
    (tmp_path / "odd.html").write_text(odd_html, encoding="utf-8")  # 2025-03-01
    newest = {"model": "gpt2", "analysis": "comparison", "created": "2025-06-01T12:00:00Z"}
    (tmp_path / "new.html").write_text(page("new", "<p>x</p>", newest), encoding="utf-8")
    undated = {"model": "m", "analysis": "collapse", "created": "yesterday"}
    (tmp_path / "undated.html").write_text(page("u", "", undated), encoding="utf-8")
    (tmp_path / "notes.html").write_text("<html><head><title>n</title></head></html>")
    (tmp_path / "index.html").write_text(page("i", "", {"analysis": "collapse"}))
    (tmp_path / "tiny.nc").write_bytes(b"")

    entries = index_entries(tmp_path)
    assert [e["file"] for e in entries] == ["new.html", "odd.html", "old.html", "undated.html"]
    assert entries[1]["model"] == ODD
    assert entries[2]["result"] == "tiny.nc"
    assert entries[2]["variants"] == "SAN,SAN+MLP,SAN+skip,transformer"

    index = render_index(entries)
    assert_well_formed(index)
    # Its one inline script, allowed by its hash: tests/test_reports_index.py.
    assert_self_contained(re.sub(r"<script>.*?</script>", "", index, flags=re.S))
    assert "<b>" not in index
    # By analysis (collapse, then comparisons), then by model.
    links = [h for h in hrefs(index) if h.endswith(".html")]
    assert links == ["odd.html", "undated.html", "old.html", "new.html"]
    assert "tiny.nc" in hrefs(index)
    assert "2025-06-01 12:00 UTC" in index
    # Each run's headline, or why there is none.
    assert "unreadable: cannot read tiny.nc: " in index
    assert "unreadable: its result file odd.nc is missing" in index
    assert "unreadable: its report names no result file" in index


def test_empty_index(tmp_path):
    assert index_entries(tmp_path) == []
    index = render_index([])
    assert "No reports yet." in index
    assert_well_formed(index)


@pytest.mark.parametrize(
    ("name", "link"),
    [
        ("a b:c.html", "a%20b%3Ac.html"),  # ":" encoded: never a scheme
        ("x?.nc", "x%3F.nc"),
        ("../results/x.nc", "../results/x.nc"),  # relative paths keep their slashes
        ("javascript:alert(1)", "javascript%3Aalert%281%29"),
        ("//example.com/x.nc", "/example.com/x.nc"),  # never protocol-relative
        ("file:///data/my run/x.nc", "file:///data/my%20run/x.nc"),  # local file URIs pass
    ],
)
def test_links(name, link):
    assert f'href="{link}"' in render_index([{"file": name, "model": "m", "result": name}])


# --- comparison -----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_comparison_report(n):
    layers = [3, 12, 6, 2][:n]
    models = ["bert-base", "org/gpt2", "albert", "xlnet"][:n]
    datasets = [
        make_collapse_dataset(model=m, layers=k, seed=i, dtype="float32" if i % 2 else "float64")
        for i, (m, k) in enumerate(zip(models, layers, strict=True))
    ]
    files = [f"{m.replace('/', '-')}.nc" for m in models]
    html = render_comparison(datasets, result_files=files)
    assert_well_formed(html)
    assert_self_contained(html)
    title = "Rank collapse compared: " + ", ".join(models[:-1]) + f" and {models[-1]}"
    assert f"<title>{title}</title>" in html
    # the across-models figure, then linear and log for each of the two shared inits
    assert html.count("<svg") == 5
    section = re.search(r'<section id="families">.*?</section>', html, re.S).group(0)
    assert section.count("<svg") == 1 and "one line per model" in section
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    for f in files:
        assert f'href="{f}"' in html
    meta = read_meta(html)
    assert meta["analysis"] == "comparison"
    assert meta["model"] == ", ".join(models)
    assert meta["created"] == "2025-01-02T03:04:05Z"

    final = table(html, "final")
    assert final.count("<tr>") == 1 + 2 * n
    got = np.array([float(x) for x in re.findall(r'data-mean="([^"]+)"', final)]).reshape(n, 2, 4)
    for i, one in enumerate(datasets):
        last = one["relative_residual"].sel(norm="l1inf", fit="mean").isel(layer=-1)
        want = last.mean("sequence").sel(variant=list(VARIANTS)).transpose("init", "variant")
        np.testing.assert_allclose(got[i], want.values)


def test_comparison_without_shared_init_and_default_files():
    a = make_collapse_dataset(model="a", layers=2, inits=("random",), variants=("SAN",))
    b = make_collapse_dataset(model="b", layers=5, inits=("pretrained",))
    html = render_comparison([a, b], created="2026-01-01T00:00:00Z")
    assert html.count("<svg") == 3
    assert f'href="{report_name(a)}.nc"' in html
    assert read_meta(html)["created"] == "2026-01-01T00:00:00Z"
    assert read_meta(html)["init"] == "pretrained,random"
    final = table(html, "final")
    assert final.count('data-mean="nan"') == 3  # a has only SAN
    with pytest.raises(ValueError):
        render_comparison([a, b], result_files=["only-one.nc"])


# --- the titles' fixed place (reports/svg.py) -----------------------------------------------


def test_fixed_titles_leave_every_figure_as_matplotlibs_search_would(monkeypatch):
    # The same report drawn with matplotlib's title search and every minor tick on every
    # axes, and with the shortcuts where they apply: the same bytes (two inits, log and
    # linear axes over many decades, legends).
    from probe.reports import svg

    ds = make_collapse_dataset(layers=4, sequences=5)
    fast = render(ds, result_file="tiny.nc")
    monkeypatch.setattr(svg, "_title_stays_put", lambda ax: False)
    monkeypatch.setattr(svg, "_minor_ticks_draw_nothing", lambda axis: False)
    assert render(ds, result_file="tiny.nc") == fast


def test_a_title_moves_where_something_rises_above_its_axes():
    from matplotlib.figure import Figure

    from probe.reports.svg import _title_stays_put

    def axes(y, top=False):
        ax = Figure(layout="constrained").subplots()
        ax.plot([0, 1, 2], y)
        ax.set_title("a title")
        if top:
            ax.xaxis.tick_top()
        return ax

    assert _title_stays_put(axes([0.1, 0.5, 0.9]))
    assert not _title_stays_put(axes([1.00001, 1.00002, 1.00003]))  # offset text over the axis
    assert not _title_stays_put(axes([0.1, 0.5, 0.9], top=True))  # tick labels at the top
    twin = axes([0.1, 0.5, 0.9])
    twin.twinx()
    assert not _title_stays_put(twin)


def test_minor_ticks_are_dropped_only_where_they_draw_nothing():
    import matplotlib as mpl
    from matplotlib.figure import Figure

    from probe.figures.plot import STYLE, log_axis
    from probe.reports.svg import _minor_ticks_draw_nothing

    def axis(low, grid=False):
        with mpl.rc_context(STYLE):
            ax = Figure().subplots()
            ax.plot([0, 1], [low, 1.0])
            log_axis(ax)
            if grid:
                ax.grid(True, which="minor")
            return ax.yaxis

    assert _minor_ticks_draw_nothing(axis(1e-16))  # 16 decades: unlabelled, no lines
    assert not _minor_ticks_draw_nothing(axis(0.2))  # under one decade: 0.3, 0.4 ... labelled
    assert not _minor_ticks_draw_nothing(axis(1e-16, grid=True))  # minor grid lines
