"""examples/collapse.ipynb runs top to bottom, offline, and shows what it promises.

The notebook is executed with nbclient in a fresh kernel, in an empty temporary
working directory, with HF_HUB_OFFLINE=1.  The kernel must be this interpreter
(the one probe is installed in): when the ``python3`` kernelspec Jupyter finds
would start some other Python, a temporary kernelspec pointing at
``sys.executable`` is put first on JUPYTER_PATH for the test.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "collapse.ipynb"
CELL_TIMEOUT = 300  # seconds per cell; the whole notebook takes well under a minute
KERNEL = "python3"
IMAGES = ("image/png", "image/svg+xml")


def _kernel_runs_this_python() -> bool:
    """Would the python3 kernelspec Jupyter finds now start sys.executable?"""
    try:
        argv = KernelSpecManager().get_kernel_spec(KERNEL).argv
    except NoSuchKernel:
        return False
    # jupyter_client itself replaces a bare "python"/"python3"/"python3.X" by sys.executable.
    bare = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}
    return bool(argv) and (argv[0] in bare or Path(argv[0]) == Path(sys.executable))


@pytest.fixture
def kernel_env(tmp_path, monkeypatch) -> Path:
    """Offline, hermetic environment for the kernel; returns its working directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    if not _kernel_runs_this_python():
        spec = tmp_path / "jupyter" / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    "display_name": "Python 3 (probe tests)",
                    "language": "python",
                }
            )
        )
        monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
        assert _kernel_runs_this_python()
    workdir = tmp_path / "work"
    workdir.mkdir()
    return workdir


def _cell(nb, source: str):
    """The one code cell whose source is exactly `source` (ignoring surrounding blanks)."""
    found = [c for c in nb.cells if c.cell_type == "code" and c.source.strip() == source]
    assert len(found) == 1, f"expected one cell {source!r} in {NOTEBOOK.name}, found {len(found)}"
    return found[0]


def _data(cell, mime: str) -> list[str]:
    return [
        out["data"][mime]
        for out in cell.outputs
        if out.output_type in ("execute_result", "display_data") and mime in out.get("data", {})
    ]


def test_notebook_runs_offline(kernel_env):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The committed notebook carries no outputs, so the repository stays small.
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, cell.source
    assert nb.metadata["kernelspec"]["name"] == KERNEL

    # One extra cell, in memory only: which Python is the kernel?
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.prefix)"))
    client = NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT,
        startup_timeout=60,
        allow_errors=True,  # collect every error below instead of stopping at the first
        resources={"metadata": {"path": str(kernel_env)}},
    )
    client.execute()

    errors = [
        f"cell {i}:\n{cell.source}\n{out.ename}: {out.evalue}"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors, "\n\n".join(errors)

    prefix = "".join(o.get("text", "") for o in nb.cells[-1].outputs).strip()
    assert prefix == sys.prefix, f"the kernel ran {prefix}, not this environment ({sys.prefix})"

    summary = _data(_cell(nb, "ds.probe"), "text/html")
    assert summary and "probe collapse" in summary[0]
    assert '<img alt="' in summary[0] and 'src="data:image/png;base64,' in summary[0]

    for source in (
        "probe.plot.collapse(ds, log=True)",
        "probe.plot.collapse_order(ds)",
    ):
        cell = _cell(nb, source)
        assert any(_data(cell, mime) for mime in IMAGES), f"{source} displayed no figure"

    # Results went to a temporary folder, not to the working directory.
    assert not any(kernel_env.iterdir()), sorted(p.name for p in kernel_env.iterdir())
