"""The site's tutorial pages: the notebooks of examples/, executed, with their outputs.

    python docs/data/notebooks.py [NAME ...]

Runs each notebook of ``examples/`` (``collapse``, ``paths``; all by default) top to bottom
in a fresh kernel of this interpreter, offline (``HF_HUB_OFFLINE=1``), in an empty temporary
working folder, and writes it with its outputs to ``docs/examples/NAME.ipynb``, where
mkdocs-jupyter renders it without running anything (``execute: false`` in mkdocs.yml).
A cell that raises stops the script.  Below the notebook's title a note names the machine,
the versions and the date of the run.  ``examples/`` keeps the notebooks without outputs;
tests/test_notebook.py and tests/test_paths_notebook.py execute those, and
tests/test_docs_site.py checks that the pages hold the same cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from common import where  # noqa: E402  (sibling scripts)

SOURCES = ROOT / "examples"
PAGES = ROOT / "docs" / "examples"
KERNEL = "probe-docs"
CELL_TIMEOUT = 600  # seconds per cell
#: The mark of the note this script adds below the title (tests/test_docs_site.py leaves it
#: out when it compares the page's cells with the notebook's).
NOTE_TAG = "docs-data-note"


def note(name: str) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return (
        f"*This page is `examples/{name}.ipynb` as `python docs/data/notebooks.py` ran it on "
        f"{where()}, on {when} (UTC); its numbers are that run's. "
        f"[Download the notebook]({name}.ipynb) or open `examples/{name}.ipynb` in Jupyter "
        "to run it yourself.*"
    )


def _widget_notice(output) -> bool:
    """tqdm's warning that a kernel without ipywidgets draws no progress bars: printed when
    a library imports tqdm.auto, it says nothing about the notebook."""
    return output.get("name") == "stderr" and "IProgress not found" in output.get("text", "")


def source_kernel(name: str) -> dict:
    import nbformat

    return dict(nbformat.read(SOURCES / f"{name}.ipynb", as_version=4).metadata["kernelspec"])


def execute(name: str, folder: Path) -> Path:
    """Run ``examples/NAME.ipynb`` in ``folder`` and write the page's copy."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(SOURCES / f"{name}.ipynb", as_version=4)
    work = folder / name
    work.mkdir()
    NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT,
        startup_timeout=120,
        record_timing=False,
        resources={"metadata": {"path": str(work)}},
    ).execute()
    for each in nb.cells:
        if each.cell_type == "code":
            each.outputs = [out for out in each.outputs if not _widget_notice(out)]
    left = sorted(p.name for p in work.iterdir())
    if left:
        raise SystemExit(f"examples/{name}.ipynb left files in its working folder: {left}")
    cell = nbformat.v4.new_markdown_cell(note(name), id=NOTE_TAG)
    cell.metadata["tags"] = [NOTE_TAG]
    nb.cells.insert(1, cell)
    # the source's kernel, not the temporary one this run started
    nb.metadata["kernelspec"] = source_kernel(name)
    PAGES.mkdir(exist_ok=True)
    out = PAGES / f"{name}.ipynb"
    nbformat.write(nb, out)
    return out


def main() -> None:
    names = sorted(p.stem for p in SOURCES.glob("*.ipynb"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(names)}")
    args = parser.parse_args()
    unknown = set(args.names) - set(names)
    if unknown:
        parser.error(f"no notebook examples/{sorted(unknown)[0]}.ipynb")
    args.names = args.names or names
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # A kernel that is this interpreter, whatever kernels Jupyter finds elsewhere.
        spec = folder / "jupyter" / "kernels" / KERNEL
        spec.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        spec.joinpath("kernel.json").write_text(
            json.dumps({"argv": argv, "display_name": "probe docs", "language": "python"})
        )
        os.environ["JUPYTER_PATH"] = str(folder / "jupyter")
        os.environ["IPYTHONDIR"] = str(folder / "ipython")
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        for name in args.names:
            print(f"{name}: {execute(name, folder)}", flush=True)


if __name__ == "__main__":
    main()
