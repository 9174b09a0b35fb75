"""The index: runs grouped by analysis and model, each with its headline number, sortable.

Every headline is checked against the number computed here from the Dataset the result file
holds; the sort script against the hash the page's Content-Security-Policy allows; a result
that cannot be read against its one-line reason; and, where Chromium is installed, the
sorting itself in the browser.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil

import numpy as np
import pytest
import xarray as xr

from probe import reports
from probe.files.results import save_result
from probe.measures import stats
from probe.measures.stats import shown
from tests.datasets import make_collapse_dataset
from tests.test_reports import assert_well_formed, hrefs

index, headlines, page = reports.index, reports.index_headline, reports.page.page
index_entries, render_index = reports.index_entries, reports.render_index


def write_run(folder, name: str, ds: xr.Dataset | None, **meta) -> None:
    """``name``.nc (``ds``, unless None) and ``name``.html with the meta tags a report has."""
    if ds is not None:
        save_result(ds, folder / f"{name}.nc")
        meta = {
            "model": str(ds.attrs.get("model", "")),
            "analysis": str(ds.attrs.get("analysis", "")),
            "created": str(ds.attrs.get("created", "")),
            **meta,
        }
    meta.setdefault("result", f"{name}.nc")
    (folder / f"{name}.html").write_text(page(name, "<p>report</p>", meta), encoding="utf-8")


def attention_ds() -> xr.Dataset:
    return xr.Dataset(
        {"sink_rate": (("init",), [0.4175, 0.03125])},
        coords={"init": ["random", "pretrained"]},  # stored out of the canonical order
        attrs={"analysis": "attention", "model": "minilm", "epsilon": 0.3,
               "created": "2025-02-01T00:00:00Z"},
    )  # fmt: skip


def sweep_ds() -> xr.Dataset:
    final = np.array(
        [  # step x variant (SAN, transformer) x init (pretrained)
            [[2e-9], [0.61]],
            [[3e-4], [0.52]],
            [[np.nan], [np.nan]],  # a point not finished
        ]
    )
    return xr.Dataset(
        {"final_residual": (("step", "variant", "init"), final)},
        coords={"step": [1, 10, 100], "variant": ["SAN", "transformer"], "init": ["pretrained"]},
        attrs={"analysis": "sweep", "model": "gpt2-tiny-steps", "dtype": "float32",
               "points": 3, "points_done": 2, "created": "2025-02-02T00:00:00Z"},
    )  # fmt: skip


def count_ds(names=("bert-base",), lengths=(11.0769,), totals=("23298085122481",)) -> xr.Dataset:
    return xr.Dataset(
        {
            "mean_length": (("architecture",), list(lengths)),
            "total": (("architecture",), list(totals)),
        },
        coords={"architecture": list(names)},
        attrs={"analysis": "paths-count", "model": "presets", "created": "2025-02-03T00:00:00Z"},
    )


def sample_ds() -> xr.Dataset:
    rng = np.random.default_rng(1)
    ratio = rng.uniform(0.01, 0.5, size=(2, 2, 3, 7, 2, 2))  # init order depth sample fit norm
    ratio[0, 0, -1, :, 1, 0] = 1e-9  # pretrained, earliest-left, deepest, svd, l1inf: rounding
    return xr.Dataset(
        {"ratio": (("init", "order", "depth", "sample", "fit", "norm"), ratio)},
        coords={"init": ["pretrained", "random"], "order": ["earliest-left", "latest-left"],
                "depth": [1, 2, 3], "sample": np.arange(7), "fit": ["mean", "svd"],
                "norm": ["l1inf", "fro"]},
        attrs={"analysis": "paths-sample", "model": "minilm", "dtype": "float32",
               "created": "2025-02-04T00:00:00Z"},
    )  # fmt: skip


def decompose_ds() -> xr.Dataset:
    rng = np.random.default_rng(2)
    eff = rng.uniform(1, 3, size=(1, 3, 4, 2))  # init layer sequence norm
    return xr.Dataset(
        {
            "effective_length": (("init", "layer", "sequence", "norm"), eff),
            "uniform_mean_length": (("layer",), [0.0, 0.92, 1.85]),
        },
        coords={"init": ["random"], "layer": [0, 1, 2], "sequence": np.arange(4),
                "norm": ["fro", "l1inf"]},
        attrs={"analysis": "paths-decompose", "model": "minilm", "created": "2025-02-05T00:00:00Z"},
    )  # fmt: skip


def toy_sort_ds() -> xr.Dataset:
    return xr.Dataset(
        {"full_accuracy": ((), 0.9375), "baseline_position": ((), 0.25),
         "train_loss": (("epoch",), [1.0, 0.5])},
        attrs={"analysis": "toy", "task": "sort", "model": "toy-sort",
               "created": "2025-02-06T00:00:00Z"},
    )  # fmt: skip


def toy_circle_ds() -> xr.Dataset:
    r = np.array([[[0.9, 0.5, 1e-20], [0.9, 0.8, 0.7]]])  # hidden x variant x step
    return xr.Dataset(
        {"relative_residual": (("hidden", "variant", "step"), r)},
        coords={"hidden": [8], "variant": ["SAN", "transformer"], "step": [0, 1, 2]},
        attrs={"analysis": "toy", "task": "circle", "model": "toy-circle",
               "created": "2025-02-07T00:00:00Z"},
    )  # fmt: skip


def training_ds() -> xr.Dataset:
    return xr.Dataset(
        {"final_val_bits_per_char": (("model",), [2.125, 1.875])},
        coords={"model": ["fastformer", "transformer"]},
        attrs={"analysis": "training", "model": "fastformer vs transformer",
               "created": "2025-02-08T00:00:00Z"},
    )  # fmt: skip


def collapse(model: str, created: str, seed: int = 0, **kwargs) -> xr.Dataset:
    return make_collapse_dataset(
        model=model, layers=3, sequences=4, seed=seed, created=created, **kwargs
    )


@pytest.fixture()
def folder(tmp_path):
    """A folder with a run of every analysis, two runs of one model, and broken results."""
    old = collapse("bert-a", "2025-01-01T00:00:00Z", dtype="float32")
    new = collapse("bert-a", "2025-01-05T00:00:00Z", seed=1, inits=("pretrained",))
    # The SAN of the old run under float32's precision floor at its last layer.
    old["relative_residual"].loc[dict(variant="SAN", init="pretrained", layer=3)] = 1e-8
    write_run(tmp_path, "collapse-bert-a-old", old, init="pretrained,random")
    write_run(tmp_path, "collapse-bert-a-new", new, init="pretrained")
    write_run(tmp_path, "collapse-albert", collapse("albert", "2025-01-03T00:00:00Z"))
    write_run(tmp_path, "attention", attention_ds())
    write_run(tmp_path, "sweep", sweep_ds())
    write_run(tmp_path, "count", count_ds())
    write_run(tmp_path, "sample", sample_ds())
    write_run(tmp_path, "decompose", decompose_ds())
    write_run(tmp_path, "toy-sort", toy_sort_ds())
    write_run(tmp_path, "toy-circle", toy_circle_ds())
    write_run(tmp_path, "training", training_ds())
    mystery = xr.Dataset({"a": ("x", [1.0]), "b": ("x", [2.0])}, attrs={"analysis": "mystery"})
    write_run(tmp_path, "mystery", mystery, model="m")
    write_run(tmp_path, "comparison", None, model="bert-a, albert", analysis="comparison",
              created="2025-01-06T00:00:00Z", result="collapse-bert-a-new.nc, collapse-albert.nc")  # fmt: skip
    (tmp_path / "garbage.nc").write_bytes(b"not a netCDF file\nsecond line")
    write_run(tmp_path, "garbage", None, model="broken", analysis="collapse", result="garbage.nc")
    write_run(tmp_path, "gone", None, model="gone", analysis="collapse", result="gone.nc")
    return tmp_path


def headline_of(entries, file: str) -> dict:
    (entry,) = [e for e in entries if e["file"] == file]
    return json.loads(entry["headline"])


def items(found: dict, line: int = 0) -> dict[str, str]:
    return dict(found["lines"][line][1])


def l1inf_mean_at_last(ds: xr.Dataset, variant: str, init: str) -> float:
    """By hand: fit mean, norm l1inf, the last layer, mean over sequences."""
    v, i = list(ds.variant.values).index(variant), list(ds.init.values).index(init)
    f, n = list(ds.fit.values).index("mean"), list(ds.norm.values).index("l1inf")
    return float(np.mean(ds["relative_residual"].values[v, i, -1, :, f, n]))


def test_collapse_headlines_are_the_last_layer_per_variant(folder):
    entries = index_entries(folder)
    old = xr.open_dataset(folder / "collapse-bert-a-old.nc", engine="h5netcdf").load()
    found = headline_of(entries, "collapse-bert-a-old.html")
    assert [line[0] for line in found["lines"]] == ["pretrained", "random"]
    pretrained, random = items(found, 0), items(found, 1)
    assert list(pretrained) == ["SAN", "SAN+MLP", "SAN+skip", "transformer"]
    assert pretrained["SAN"] == "< 1.2e-6 (float32)"  # 1e-8, under float32's floor
    for variant in ("SAN+skip", "transformer"):
        value = l1inf_mean_at_last(old, variant, "pretrained")
        assert value > 1e-3 and pretrained[variant] == f"{value:.3g}"
        assert random[variant] == shown(l1inf_mean_at_last(old, variant, "random"), old)
    # Values under the floor sort as the floor: their differences are rounding.
    assert found["sort"] == pytest.approx(stats.floor(old)) and not found["problem"]
    # One init: one line without a head.
    new = xr.open_dataset(folder / "collapse-bert-a-new.nc", engine="h5netcdf").load()
    found = headline_of(entries, "collapse-bert-a-new.html")
    assert [line[0] for line in found["lines"]] == [""]
    assert items(found)["SAN+skip"] == f"{l1inf_mean_at_last(new, 'SAN+skip', 'pretrained'):.3g}"


def test_headlines_of_the_other_analyses(folder):
    entries = index_entries(folder)
    found = headline_of(entries, "attention.html")
    assert found["lines"] == [["", [["pretrained", "0.0312"], ["random", "0.417"]]]]
    assert found["note"] == "ε = 0.3" and found["sort"] == 0.03125

    found = headline_of(entries, "sweep.html")  # float32 floor 1.19e-6; NaN points skipped
    assert items(found) == {"SAN": "< 1.2e-6 (float32) – 0.0003", "transformer": "0.52 – 0.61"}
    assert found["note"] == "2 of 3 points"

    assert items(headline_of(entries, "count.html")) == {
        "paths": "2.33e+13",  # 13^12, BERT-base's (H+1)^L
        "mean length": "11.1",
    }
    many = headlines.headline(count_ds(("a", "b"), (2.5, 7.25), ("10", "20")))
    assert items(many) == {"architectures": "2", "mean length": "2.5 – 7.25"}

    sample = sample_ds()
    found = headline_of(entries, "sample.html")
    random = float(np.median(sample["ratio"].values[1, 0, -1, :, 1, 0]))
    assert found["lines"] == [
        ["depth 3", [["pretrained", "< 1.2e-6 (float32)"], ["random", f"{random:.3g}"]]]
    ]

    dec = decompose_ds()
    found = headline_of(entries, "decompose.html")
    eff = float(np.mean(dec["effective_length"].values[0, -1, :, 0]))
    assert items(found) == {"random": f"{eff:.3g}", "by count": "1.85"}
    assert found["note"] == "layer 2"

    assert items(headline_of(entries, "toy-sort.html")) == {
        "accuracy": "0.938",
        "position baseline": "0.25",
    }
    found = headline_of(entries, "toy-circle.html")
    assert items(found) == {"SAN": "< 2.2e-15 (float64)", "transformer": "0.7"}
    assert found["note"] == "after 2 steps"

    found = headline_of(entries, "training.html")
    assert items(found) == {"fastformer": "2.12", "transformer": "1.88"}

    found = headline_of(entries, "mystery.html")
    assert found["lines"] == [] and found["note"] == "holds a, b"
    assert items(headline_of(entries, "comparison.html")) == {"results": "2"}
    three = headlines.comparison_headline(["a.nc", "b.nc", "c.nc"], "x, y")
    assert items(three) == {"results": "3", "models": "2"}


def test_unreadable_results_are_rows_with_their_reason(folder):
    entries = index_entries(folder)
    garbage = headline_of(entries, "garbage.html")["problem"]
    assert garbage.startswith("cannot read garbage.nc: ") and "\n" not in garbage
    assert headline_of(entries, "gone.html")["problem"] == "its result file gone.nc is missing"
    html = render_index(entries)
    assert_well_formed(html)
    assert "unreadable: cannot read garbage.nc" in html
    assert "unreadable: its result file gone.nc is missing" in html
    assert "2 unreadable" in html


def sections(html: str) -> dict[str, list[tuple[str, str]]]:
    """Section id -> (model, report file) of its rows, in the page's order."""
    found = {}
    for sid, body in re.findall(r'<section class="index-runs" id="([^"]+)">(.*?)</section>', html):
        found[sid] = re.findall(r'<td class="model"[^>]*><a href="([^"]+)">([^<]*)</a>', body)
        found[sid] = [(model, file) for file, model in found[sid]]
    return found


def test_runs_grouped_by_analysis_then_model_newest_first(folder):
    html = render_index(index_entries(folder))
    assert_well_formed(html)
    found = sections(html)
    assert list(found) == [
        "runs-collapse", "runs-comparison", "runs-attention", "runs-sweep", "runs-paths-count",
        "runs-paths-sample", "runs-paths-decompose", "runs-toy", "runs-training", "runs-mystery",
    ]  # fmt: skip
    assert found["runs-collapse"] == [
        ("albert", "collapse-albert.html"),
        ("bert-a", "collapse-bert-a-new.html"),  # newest first within a model
        ("bert-a", "collapse-bert-a-old.html"),
        ("broken", "garbage.html"),
        ("gone", "gone.html"),
    ]
    assert found["runs-toy"] == [("toy-circle", "toy-circle.html"), ("toy-sort", "toy-sort.html")]
    collapse = html.split('id="runs-collapse"')[1].split("</section>")[0]
    assert collapse.count('class="model-first"') == 4  # albert, bert-a, broken, gone
    assert "5 runs · 4 models" in collapse
    assert "<th>r after the last layer</th>" in collapse
    assert "<th>variants</th>" not in collapse  # the headline names them
    assert 'SAN <span class="hl-value">&lt; 1.2e-6 (float32)</span>' in collapse
    assert '<a href="#runs-sweep">Sweeps (1)</a>' in html
    assert "15 runs · 10 analyses · 2 unreadable" in html
    assert set(hrefs(html)) >= {"collapse-albert.nc", "collapse-bert-a-new.nc", "gone.nc"}


def csp(html: str) -> str:
    (policy,) = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]*)"', html)
    return policy


def test_the_one_script_is_allowed_by_its_hash_and_nothing_is_fetched(folder):
    html = render_index(index_entries(folder))
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S)
    assert len(scripts) == 1 and scripts[0][0] == ""  # inline, no src
    digest = base64.b64encode(hashlib.sha256(scripts[0][1].encode()).digest()).decode()
    # The reports' own policy (every fetch refused, no script), plus this one script.
    report = csp(page("r", "<p>x</p>", {"analysis": "collapse"}))
    assert report.startswith("default-src 'none'") and "script-src" not in report
    assert csp(html) == f"{report}; script-src 'sha256-{digest}'"
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\ssrc\s*=|@import", html, re.I)
    # An empty index has no script.
    empty = render_index([])
    assert "<script" not in empty and "script-src" not in csp(empty)


def test_headlines_kept_in_the_index_until_their_file_changes(folder, monkeypatch):
    (folder / "index.html").write_text(render_index(index_entries(folder)), encoding="utf-8")
    opened = []

    def read(path):
        opened.append(path.name)
        return headlines.problem("opened")

    monkeypatch.setattr(headlines, "read_headline", read)
    kept = {e["file"]: e["headline"] for e in index_entries(folder)}
    # Every readable result's headline came from the index; an unreadable one is tried again.
    assert opened == ["garbage.nc"]
    assert items(json.loads(kept["attention.html"]))["random"] == "0.417"
    changed = attention_ds()
    changed["sink_rate"][:] = [0.5, 0.5]
    save_result(changed, folder / "attention.nc")
    entries = index_entries(folder)
    assert sorted(opened) == ["attention.nc", "garbage.nc", "garbage.nc"]
    assert headline_of(entries, "attention.html")["problem"] == "opened"


def test_the_index_lists_the_demo_folder_shape(tmp_path):
    """Reports from probe's own renderers, with meta tags as they write them, are indexed."""
    ds = collapse("gpt2", "2025-03-01T00:00:00Z")
    save_result(ds, tmp_path / "c.nc")
    (tmp_path / "c.html").write_text(reports.render(ds, result_file="c.nc"), encoding="utf-8")
    (entry,) = index_entries(tmp_path)
    assert items(json.loads(entry["headline"]), 0)["SAN+skip"] == (
        f"{l1inf_mean_at_last(ds, 'SAN+skip', 'pretrained'):.3g}"
    )


# --- in the browser -------------------------------------------------------------------------

MODELS_JS = """JSON.stringify(Array.from(document.querySelectorAll("#runs-collapse tbody tr"))
  .map(row => row.cells[0].textContent))"""


def click_js(column: int) -> str:
    return f'document.querySelectorAll("#runs-collapse thead th")[{column}].querySelector("button").click()'


def test_columns_sort_in_a_real_browser(folder, tmp_path):
    from tests.browser import NO_CHROMIUM, WATCH_CSP_JS, DevTools, chromium

    binary = chromium()
    if binary is None:
        pytest.skip(NO_CHROMIUM)
    (folder / "index.html").write_text(render_index(index_entries(folder)), encoding="utf-8")
    profile = tmp_path / "profile"
    browser = DevTools(binary, profile, tmp_path / "chromium.log")
    try:
        browser.call("Browser.getVersion", timeout=20)
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session=session)
        browser.call(
            "Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_CSP_JS}, session=session
        )
        browser.events.clear()
        browser.call("Page.navigate", {"url": (folder / "index.html").as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired", session=session)

        def run(expression: str):
            answer = browser.call(
                "Runtime.evaluate",
                {"expression": expression, "returnByValue": True},
                session=session,
            )
            return answer["result"].get("value")

        order = [json.loads(run(MODELS_JS))]
        run(click_js(1))  # the headline: SAN's r, ascending, unreadable rows last
        order.append(json.loads(run(MODELS_JS)))
        run(click_js(1))  # again: descending, unreadable rows still last
        order.append(json.loads(run(MODELS_JS)))
        run(click_js(0))  # the model, ascending: the page's own order again
        order.append(json.loads(run(MODELS_JS)))
        violations = json.loads(run("JSON.stringify(window.__violations)"))
        sorted_by = run('document.querySelector("#runs-collapse th[aria-sort]").textContent')
        errors = [
            e for e in browser.events
            if e.get("method") in ("Runtime.exceptionThrown", "Log.entryAdded")
            and (e["method"] == "Runtime.exceptionThrown" or e["params"]["entry"]["level"] == "error")
        ]  # fmt: skip
    finally:
        browser.close()
        shutil.rmtree(profile, ignore_errors=True)
    page_order = ["albert", "bert-a", "bert-a", "broken", "gone"]
    assert order[0] == page_order
    sans = {m: headline_of(index_entries(folder), f)["sort"] for m, f in (
        ("albert", "collapse-albert.html"), ("new", "collapse-bert-a-new.html"),
        ("old", "collapse-bert-a-old.html"))}  # fmt: skip
    ascending = [m for m, _ in sorted(sans.items(), key=lambda kv: kv[1])]
    names = {"albert": "albert", "new": "bert-a", "old": "bert-a"}
    assert order[1][:3] == [names[m] for m in ascending] and order[1][3:] == ["broken", "gone"]
    assert order[2][:3] == [names[m] for m in reversed(ascending)]
    assert order[2][3:] == ["broken", "gone"]
    assert order[3] == page_order
    assert sorted_by.startswith("model")
    assert not errors, errors
    assert violations == [], violations
