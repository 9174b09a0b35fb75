"""examples/paths.ipynb runs top to bottom, offline, and shows its figures."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_notebook import CELL_TIMEOUT, IMAGES, KERNEL, _data, kernel_env  # noqa: F401

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "paths.ipynb"


@pytest.mark.slow  # a kernel and every analysis at notebook size; each is tested on its own
def test_paths_notebook_runs_offline(kernel_env):  # noqa: F811
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:  # committed without outputs
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source
    client = NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT,
        startup_timeout=60,
        allow_errors=True,
        resources={"metadata": {"path": str(kernel_env)}},
    )
    client.execute()
    errors = [
        f"{cell.source}\n{out.ename}: {out.evalue}"
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors, "\n\n".join(errors)
    total = [c for c in nb.cells if c.cell_type == "code" and "layers=12, heads=12" in c.source]
    assert _data(total[0], "text/plain") == ["23298085122481"]
    figures = [
        c
        for c in nb.cells
        if c.cell_type == "code" and c.source.startswith(("count_", "sample_", "decompose_"))
    ]
    assert len(figures) == 3
    for cell in figures:
        assert any(_data(cell, mime) for mime in IMAGES), f"{cell.source} displayed no figure"
    assert not any(kernel_env.iterdir())  # nothing written to the working directory
