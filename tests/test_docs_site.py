"""The built documentation site: it teaches from stored outputs and fetches nothing.

The site is built once here (``mkdocs build --strict``, as ``make test`` builds it) into a
temporary folder, and read: every formula is MathML written at build time, no page loads
a script, a style sheet, a font or an image from another host, the tutorial notebooks are
pages with their outputs, and the getting-started page is the first after the home page.
The tutorial pages are the notebooks of examples/ as docs/data/notebooks.py executed them:
the same cells, every code cell run, none failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
NOTE_TAG = "docs-data-note"  # the cell docs/data/notebooks.py adds below the title


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may use !!python/name and !ENV tags; the keys read here use neither.
    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda path: path.name)
def test_tutorial_page_is_the_executed_notebook(source: Path) -> None:
    page = ROOT / "docs" / "examples" / source.name
    assert page.is_file(), f"run `python docs/data/notebooks.py` to write {page}"
    wanted = nbformat.read(source, as_version=4)
    shown = nbformat.read(page, as_version=4)
    cells = [c for c in shown.cells if NOTE_TAG not in c.metadata.get("tags", [])]
    assert [(c.cell_type, c.source) for c in cells] == [
        (c.cell_type, c.source) for c in wanted.cells
    ], f"{page} is not {source} as it stands: rerun `python docs/data/notebooks.py`"
    notes = [c for c in shown.cells if NOTE_TAG in c.metadata.get("tags", [])]
    assert len(notes) == 1 and "python docs/data/notebooks.py" in notes[0].source
    assert "transformers" in notes[0].source  # the versions it ran with
    code = [c for c in cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "a cell did not run"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "the page shows no figure"


def test_the_site_runs_no_notebook_when_built() -> None:
    plugins = _mkdocs_config()["plugins"]
    jupyter = [
        p["mkdocs-jupyter"] for p in plugins if isinstance(p, dict) and "mkdocs-jupyter" in p
    ]
    assert jupyter and jupyter[0]["execute"] is False


def test_getting_started_comes_first() -> None:
    nav = _mkdocs_config()["nav"]
    assert list(nav[0].values()) == ["index.md"]
    assert list(nav[1].values()) == ["getting-started.md"]
    tutorials = [entry for entry in nav if "Tutorials" in entry]
    assert tutorials
    pages = [next(iter(item.values())) for item in tutorials[0]["Tutorials"]]
    assert pages == [f"examples/{path.name}" for path in NOTEBOOKS]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    # `make test` builds the site with --strict just before pytest and names it here, so the
    # suite reads that build instead of making a second one of the same sources.
    built = os.environ.get("PROBE_BUILT_SITE")
    if built:
        return Path(built)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


class _Loads(HTMLParser):
    """What a page loads: (tag, attribute, value) of every resource reference."""

    LOADS = {
        "script": "src",
        "img": "src",
        "iframe": "src",
        "source": "src",
        "video": "src",
        "audio": "src",
        "embed": "src",
        "object": "data",
    }

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        if tag in self.LOADS and attrs.get(self.LOADS[tag]):
            self.found.append((tag, self.LOADS[tag], attrs[self.LOADS[tag]]))
        if tag == "link" and attrs.get("href") and attrs.get("rel") != "canonical":
            self.found.append((tag, f"href (rel={attrs.get('rel')})", attrs["href"]))


REMOTE = re.compile(r"^(https?:)?//", re.I)
#: An address an inline script would load: an import, a fetch, a script it adds.
SCRIPT_REMOTE = re.compile(r"""(?:import\(?|fetch\(|\.src\s*=)\s*['"`](?:https?:)?//[^'"`]+""")
CSS_REMOTE = re.compile(r"(@import\s+(url\()?|url\()\s*['\"]?(https?:)?//", re.I)


def test_no_page_fetches_anything(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    remote = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        parser = _Loads()
        parser.feed(text)
        remote += [(page.relative_to(site), *hit) for hit in parser.found if REMOTE.match(hit[2])]
        for script in re.findall(r"<script[^>]*>(.*?)</script>", text, flags=re.S):
            remote += [(page.relative_to(site), "script", m) for m in SCRIPT_REMOTE.findall(script)]
        for style in re.findall(r"<style[^>]*>(.*?)</style>", text, flags=re.S):
            remote += [
                (page.relative_to(site), "style", m.group(0)) for m in CSS_REMOTE.finditer(style)
            ]
    for sheet in site.rglob("*.css"):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        remote += [(sheet.relative_to(site), "css", m.group(0)) for m in CSS_REMOTE.finditer(text)]
    assert not remote, remote


def test_formulas_are_mathml(site: Path) -> None:
    for name in ("getting-started", "collapse", "paths", "examples/collapse"):
        text = (site / name / "index.html").read_text(encoding="utf-8")
        assert "<math" in text, name
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        # arithmatex's spans and divs, left unconverted, would show their LaTeX
        assert not re.search(r'class="arithmatex">\s*\\[(\[]', text), page
        assert "mathjax" not in text.lower(), page
    notebook = (site / "examples" / "collapse" / "index.html").read_text(encoding="utf-8")
    cells = re.split(r'(?=<div class="jp-Cell )', notebook)
    markdown = [c for c in cells if c.startswith('<div class="jp-Cell jp-MarkdownCell')]
    assert markdown
    assert not [c for c in markdown if re.search(r"\$[^$<]*\\[a-z]+", c)]  # raw TeX


def test_tutorial_pages_show_their_outputs(site: Path) -> None:
    for path in NOTEBOOKS:
        text = (site / "examples" / path.stem / "index.html").read_text(encoding="utf-8")
        assert "data:image/png;base64," in text, path.name
        assert "jp-OutputArea-output" in text, path.name
        assert (site / "examples" / path.stem / path.name).is_file()  # the download


def test_getting_started_shows_the_first_run(site: Path) -> None:
    text = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    for picture in ("first-run.png", "first-run-log.png"):
        assert f'src="../{picture}"' in text
        assert (site / picture).is_file()
    assert "python docs/data/first_run.py" in text  # where the table's numbers come from
    assert 'href="../examples/collapse/"' in text and 'href="../examples/paths/"' in text


def test_wide_tables_scroll_in_the_column(site: Path) -> None:
    css = (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"\.md-typeset__scrollwrap\s*{[^}]*overflow-x:\s*auto", css)
    assert re.search(r"table:not\(\[class\]\)\s*{[^}]*display:\s*table", css)
    page = (site / "collapse" / "index.html").read_text(encoding="utf-8")
    assert 'href="../stylesheets/extra.css"' in page
