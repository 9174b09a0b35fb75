"""Where a result came from: the attrs table and the family's ablation table.

Every value is escaped: attrs hold user input (model paths, command lines)
that may contain any character. JSON attrs are pretty-printed inside a
<details> so the table stays compact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import xarray as xr

from probe.measures.stats import ordered

from .page import esc
from .reproduce import command_line

# attrs that hold JSON and are shown folded.
_JSON_ATTRS = ("config", "ablation_table", "deviations", "request")


def _folded(key: str, value: object) -> str:
    try:
        parsed = json.loads(str(value))
    except ValueError:
        return f"<code>{esc(value)}</code>"
    size = f"{len(parsed)} {'keys' if isinstance(parsed, dict) else 'entries'}"
    if not isinstance(parsed, dict | list):
        size = "value"
    pretty = json.dumps(parsed, indent=2, sort_keys=isinstance(parsed, dict), ensure_ascii=False)
    return f"<details><summary>{esc(key)} ({size})</summary><pre>{esc(pretty)}</pre></details>"


def _coordinate(values: list) -> str:
    """A coordinate's values; runs of integers (layers, sequences) as a range."""
    if len(values) > 2 and all(isinstance(v, int) for v in values):
        if values == list(range(values[0], values[0] + len(values))):
            return f"{values[0]}–{values[-1]} ({len(values)} values)"
    return ", ".join(str(v) for v in values)


def provenance_table(ds: xr.Dataset) -> str:
    """One row per attr (in the order the probe wrote them), then the coordinates."""
    rows = []
    for key, value in ds.attrs.items():
        shown = _folded(key, value) if key in _JSON_ATTRS else esc(value)
        if key == "command":
            shown = f"<code>{esc(command_line(ds.attrs))}</code>"
        rows.append(f"<tr><td>{esc(key)}</td><td>{shown}</td></tr>")
    for name in ("variant", "init", "layer", "sequence", "fit", "norm"):
        if name in ds.coords:
            values = _coordinate(ds[name].values.tolist())
            rows.append(f"<tr><td>{esc(name)} (coordinate)</td><td>{esc(values)}</td></tr>")
    return (
        '<div class="table-scroll"><table class="provenance"><tbody>'
        f"{''.join(rows)}</tbody></table></div>"
    )


def ablation_table(attrs: Mapping[str, object]) -> str:
    """What "no skip" / "no MLP" mean for this family, from attrs["ablation_table"]."""
    raw = attrs.get("ablation_table")
    if raw is None:
        return '<p class="empty">No ablation table was recorded.</p>'
    try:
        rows = json.loads(str(raw))
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValueError("not a list of rows")
    except ValueError:
        return f"<pre>{esc(raw)}</pre>"
    columns = ordered(dict.fromkeys(k for r in rows for k in r), ("ablation", "probe", "paper"))
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows
    )
    table = (
        '<div class="table-scroll"><table class="ablations">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )
    spec = str(attrs.get("spec") or "")
    if not spec:
        return table
    return (
        f"{table}<p>The family's spec, as the walker executes it on every layer in forward "
        "order (reads, and the edits each removal makes; <code>:name</code> is an operation "
        "of the layer's forward, as nnsight's <code>.source</code> names it). "
        "The self-test checked it on this model before the run.</p>"
        f'<pre class="spec">{esc(spec)}</pre>'
    )
