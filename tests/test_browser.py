"""Every kind of report, made by the CLI at tiny sizes and opened in a real headless Chromium.

The kinds: collapse, compare, attention, paths count/sample/decompose, sweep, toy, the
Fastformer's training report, and the folder's index.  A page fails on a console error, a
Content-Security-Policy violation, an image that does not load, an element outside the
page, a request for anything but the page itself, a figure too small to see, a blank
screenshot, or an empty axis in one of its figures (an axis with nothing drawn on it; a
panel with nothing to show says why in words instead).  The browser client is
``tests/browser.py``.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from cli.app import app
from probe.reports import figures as report_figures
from tests.browser import VIEWPORT, Browser, chromium, png_size

runner = CliRunner()
TINY = ("--init", "pretrained", "--sequences", "2", "--tokens", "16")
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def invoke(*args) -> None:
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def drawn(artist) -> bool:
    """Does a line, collection, image or patch of an axis put anything on the page?"""
    if hasattr(artist, "get_xydata"):  # a Line2D
        return bool(np.isfinite(artist.get_xydata()).all(axis=1).any())
    if hasattr(artist, "get_paths"):  # a collection: scatter, mesh, fill
        return bool(artist.get_paths()) or len(artist.get_offsets()) > 0
    return artist.get_visible()


def empty_axes(fig) -> list[str]:
    """The axes of `fig` that show ticks but nothing drawn: a panel with no data must say why
    in words and show no scale (its ticks would be matplotlib's defaults, about nothing)."""
    found = []
    for ax in fig.axes:
        if not ax.axison or not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        artists = [*ax.lines, *ax.collections, *ax.images, *ax.patches]
        said = any(text.get_visible() and text.get_text() for text in ax.texts)
        ticks = len(ax.get_xticks()) + len(ax.get_yticks())
        if not any(drawn(a) for a in artists) and (ticks or not said):
            xlim = ax.get_xlim()
            found.append(
                f"'{ax.get_title() or ax.get_ylabel()}' (x from {xlim[0]:g} to {xlim[1]:g})"
            )
    return found


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{kind: its HTML file} for one tiny run of every kind, and the empty axes met drawing them."""
    if chromium() is None:
        pytest.skip("no chromium on PATH (apt-get install chromium, or `make browser`)")
    out = tmp_path_factory.mktemp("reports")
    text = out / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    empty: list[str] = []
    draw = report_figures.figure_svg

    def checked(fig, prefix, label=""):
        empty.extend(f"{label or prefix}: {axis}" for axis in empty_axes(fig))
        return draw(fig, prefix, label)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_figures, "figure_svg", checked)
        invoke("collapse", "gpt2-tiny", *TINY, "--out", out)
        invoke("collapse", "fastformer-tiny", *TINY, "--out", out)
        invoke("compare", *sorted(out.glob("collapse-*.nc")), "--out", out)
        invoke("attention", "gpt2-tiny", *TINY, "--out", out)
        invoke("sweep", "gpt2-tiny-steps", *TINY, "--out", out)
        invoke("paths", "--count", "--out", out)
        invoke("paths", "--sample", "gpt2-tiny", *TINY, "--samples", 5, "--out", out)
        invoke("paths", "--decompose", "gpt2-tiny", *TINY, "--out", out)
        invoke("toy", "sort", "--quick", "--epochs", 1, "--train", 64, "--out", out)
        invoke("fastformer", "train", "--text", text, "--quick", "--steps", 4, "--out", out / "ff")
    pages = {
        "collapse": next(out.glob("collapse-gpt2-tiny-*.html")),
        "compare": next(out.glob("comparison-*.html")),
        "attention": next(out.glob("attention-*.html")),
        "sweep": next(out.glob("sweep-*.html")),
        "paths count": next(out.glob("paths-count-*.html")),
        "paths sample": next(out.glob("paths-sample-*.html")),
        "paths decompose": next(out.glob("paths-decompose-*.html")),
        "toy": next(out.glob("toy-*.html")),
        "training": out / "ff" / "training.html",
        "index": out / "index.html",
    }
    return pages, empty


def test_every_report_kind_in_a_real_browser(reports, tmp_path):
    pages, empty = reports
    assert not empty, "figures with an empty axis:\n" + "\n".join(empty)
    failures = []
    with Browser(tmp_path) as browser:
        for kind, page in pages.items():
            seen = browser.open(page)
            problems = seen.problems()
            html = page.read_text(encoding="utf-8")
            if len(seen.svg_boxes) != html.count("<svg "):
                problems.append("the browser dropped an SVG figure")
            if kind != "index" and not seen.svg_boxes:
                problems.append("no figure")
            assert png_size(seen.screenshot) == VIEWPORT
            with Image.open(io.BytesIO(seen.screenshot)) as image:
                low, high = image.convert("L").getextrema()
            if high - low <= 100:
                problems.append("the screenshot is nearly uniform")
            if problems:
                shot = tmp_path / f"{kind.replace(' ', '-')}.png"
                shot.write_bytes(seen.screenshot)
                failures.append(f"{kind} ({page.name}, screenshot {shot}):")
                failures += [f"  {p}" for p in problems]
    assert not failures, "\n".join(failures)


def test_an_empty_axis_is_found():
    from matplotlib.figure import Figure

    fig = Figure()
    full, nan, said, bars = fig.subplots(1, 4)
    full.plot([1, 2], [3, 4])
    nan.plot([math.nan], [math.nan])
    said.text(0.5, 0.5, "missing: no fit", transform=said.transAxes)
    bars.bar([1, 2], [3, 4])
    assert empty_axes(fig) == ["'' (x from -0.055 to 0.055)", "'' (x from 0 to 1)"]
    said.set_xticks([])
    said.set_yticks([])
    assert empty_axes(fig) == ["'' (x from -0.055 to 0.055)"]
