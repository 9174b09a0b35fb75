"""The README and the docs site: their Python examples run, their links hold, and the
measured tables that are cheap to remeasure still hold under the pinned versions.

Shell examples (```bash blocks) run in tests/test_cli.py, the toy ones in
tests/test_toy_cli.py; tests/test_docs_shell.py checks every shell block as bash reads it,
and tests/test_docs_site.py the built site.  A ```python block is a runnable example and runs here as written;
a ```py block is a fragment of a file (a registry entry, a dict line), shown, not run.
`make test` builds the site with `mkdocs build --strict`, which fails on a broken link
between pages or an API reference to a name that no longer exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks() -> list[tuple[str, str]]:
    """(page name and block number, code) for every ```python block of the pages."""
    found = []
    for page in PAGES:
        blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
        found += [(f"{page.name}-{i}", code) for i, code in enumerate(blocks)]
    return found


def test_every_page_has_its_examples() -> None:
    names = [name for name, _ in python_blocks()]
    for page in ("README.md", "collapse.md", "paths.md", "toy.md", "fastformer.md"):
        assert any(name.startswith(page + "-") for name in names), page


#: toy.run's example trains four networks: tests/test_toy_cli.py runs it (slow) and checks
#: its results.  A model spread to disk by a device map takes minutes on a small CPU: slow
#: (the same run from the command line is a shell example of tests/test_cli.py).
EXAMPLES = [
    pytest.param(name, code, id=name, marks=[pytest.mark.slow] if "device_map" in code else [])
    for name, code in python_blocks()
    if "toy.run(" not in code
]


@pytest.mark.parametrize("name, code", EXAMPLES)
def test_python_example_runs(name, code, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__example__"}
    exec(compile(code, name, "exec"), scope)  # noqa: S102
    assert scope  # the example ran to its end without raising


def test_readme_links_reach_pages() -> None:
    """The README is not part of the site, so the build does not check its links."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(targets) >= 10
    for target in targets:
        assert (ROOT / target).is_file(), target


def test_site_pages_are_in_the_nav() -> None:
    """Every page under docs/ is reachable from the site's navigation."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f": {page.name}" in nav, page.name


def test_measured_tables_say_where_they_come_from() -> None:
    for name in (
        "cross_family.md",
        "paths_sample.md",
        "rotary.md",
        "attention_random.md",
        "attention_minilm.md",
        "precision_floor.md",
        "branch_scale.md",
        "removals_minilm.md",
        "first_run.md",
    ):
        text = (ROOT / "docs" / "data" / name).read_text()
        assert f"python docs/data/{name.removesuffix('.md')}.py" in text, name
        if "|" in text or "**" in text:  # numbers: the versions they were measured with
            assert "transformers" in text, name
    for name in ("sweep_checkpoints.md", "sweep_depth.md", "sweep_context.md"):
        text = (ROOT / "docs" / "data" / name).read_text()
        assert "python docs/data/sweep_studies.py" in text, name
        assert "transformers" in text, name


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] not in ("model", "") and not set(cells[0]) <= set("-"):
            rows[cells[0]] = cells
    return rows


@pytest.mark.parametrize("model", ["bert-base-uncased", "FacebookAI/roberta-base"])
def test_cross_family_row_holds(model) -> None:
    """A fresh `probe collapse MODEL --init random --sequences 8 --tokens 128` gives the row
    of docs/data/cross_family.md, so a pin change that moves the table fails here.

    Every cell must print the same: the values under float32's precision floor (the
    encoders' SAN and SAN+MLP, about 1e-7, whose digits are the CPU kernels') print as
    below the floor, whatever their digits.
    """
    sys.path.insert(0, str(ROOT / "docs" / "data"))
    try:
        import cross_family
    finally:
        sys.path.remove(str(ROOT / "docs" / "data"))
    table = _table_rows((ROOT / "docs" / "data" / "cross_family.md").read_text())
    assert model in table, f"{model} is not in the table"
    fresh = _table_rows(cross_family.markdown_table([cross_family.run_model(model)]))[model]
    written = table[model]
    assert len(fresh) == len(written)
    assert fresh == written
    assert "< 1.2e-6 (float32)" in written  # the SAN's r_L, under the floor


def _script(name: str):
    """A docs/data script as a module."""
    sys.path.insert(0, str(ROOT / "docs" / "data"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "docs" / "data"))


def _hook(name: str):
    """A docs/hooks module (mkdocs loads them by path, as this does)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_minilm_attention_table_is_the_scripts() -> None:
    """The attention page's MiniLM table is what its script writes from a fresh run of
    `probe attention minilm` (32 x 128, both inits), cell for cell, and the page includes
    that file instead of a table of its own."""
    script = _script("attention_minilm")
    written = (ROOT / "docs" / "data" / "attention_minilm.md").read_text()
    fresh = script.markdown_table(script.run())
    assert written.endswith(fresh + "\n")
    # the cells that a hand copy once rounded twice (8.1947, 2.4449, 3.7449)
    assert "| 1 | 0.024 | 0.066 | 3.91 | 0.55 | 8.19 |" in fresh
    page = (ROOT / "docs" / "attention.md").read_text()
    assert '--8<-- "attention_minilm.md"' in page
    assert "| 1 | 0.024" not in page


def test_no_page_types_a_measured_table() -> None:
    """Tables of measured numbers come from docs/data scripts (included as snippets); a page
    holds only tables of words, and the benchmark and training tables that name the script
    and machine they were measured by."""
    typed = {"performance.md", "toy.md", "beyond-one-machine.md"}  # benchmark/training runs
    number = re.compile(r"\|\s*-?\d+\.\d+\s*(\||±|\()")
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name in typed:
            continue
        rows = [line for line in page.read_text().splitlines() if line.startswith("|")]
        assert not [row for row in rows if number.search(row)], page.name


def test_the_hidden_state_table_is_the_registrys() -> None:
    """The families page's table of what each layer reads is written from the registry as it
    stands when the site is built (docs/hooks/registry.py): no file to regenerate when a
    family is added."""
    script = _script("hidden_states")
    hook = _hook("registry")
    page = (ROOT / "docs" / "families.md").read_text()
    assert page.count(hook.MARKER) == 1
    built = hook.on_page_markdown(page)
    assert hook.MARKER not in built and script.markdown_table() in built
    assert "| gpt2 | gpt2 | the residual stream after the MLP's addition" in built
    table = script.markdown_table().splitlines()
    assert len([line for line in table if line.startswith("| ")]) == len(script.rows()) + 1
