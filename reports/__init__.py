"""HTML reports for probe results: self-contained pages, figures inline as SVG.

    >>> from probe.reports import render, report_name
    >>> name = report_name(ds)                      # "collapse-gpt2-random-float32"
    >>> Path(f"{name}.html").write_text(render(ds, result_file=f"{name}.nc"))

Rendering is pure (Dataset in, str out); writing files is the caller's job.
`index_entries` reads a folder of reports back through their probe:* meta
tags and `render_index` lists them, so an index can always be rebuilt.
"""

from .comparison import render_comparison
from .index import index_entries, render_index
from .naming import comparison_name, report_name
from .render import render
from .toy import render_toy, toy_name

__all__ = [
    "comparison_name",
    "index_entries",
    "render",
    "render_comparison",
    "render_index",
    "report_name",
    "render_toy",
    "toy_name",
]
