"""The families page's table of what each layer reads, written from the registry at build time.

``docs/families.md`` holds the line ``<!-- registry: hidden states -->``; this hook replaces
it by the table ``docs/data/hidden_states.py`` makes from ``probe.models.families`` as the
code stands, so a family added to the registry is in the site's table without a file to
regenerate.  A page that names no such line is left as it is.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

MARKER = "<!-- registry: hidden states -->"
SCRIPT = Path(__file__).resolve().parents[1] / "data" / "hidden_states.py"


def table() -> str:
    """The table's Markdown, from the registry (``hidden_states.markdown_table``)."""
    spec = importlib.util.spec_from_file_location("hidden_states", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.markdown_table()


def on_page_markdown(markdown: str, **kwargs) -> str:
    return markdown.replace(MARKER, table()) if MARKER in markdown else markdown
