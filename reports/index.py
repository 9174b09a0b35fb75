"""The index of a reports folder, rebuilt from the reports themselves.

Every report carries <meta name="probe:..."> tags in its <head>; reading them
back means the folder alone is the database: no manifest to keep in sync.
HTML files without those tags (anything else in the folder) are skipped.

The page answers "what did I run and what came out": one section per analysis,
within it one row per run, grouped by model (newest first), each with its headline
number (:mod:`probe.reports.index_headline`) read from its result file.  Headlines
are kept in the rows of the index itself, stamped with their file's size and time,
so a rewrite opens only the results that are new or changed; a result that cannot
be read is listed with the reason.  Columns sort on a click: one small inline
script, allowed by its hash in this page's Content-Security-Policy (nothing is
ever fetched).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

from . import index_headline as hl
from .page import META_KEYS, esc, href, page

_OLDEST = datetime.min.replace(tzinfo=timezone.utc)


class _MetaReader(HTMLParser):
    """Collects the content of <meta name="probe:KEY"> tags (entities already decoded)."""

    def __init__(self) -> None:
        super().__init__()
        self.meta: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag != "meta":
            return
        values = dict(attrs)
        name = values.get("name") or ""
        if name.startswith("probe:"):
            self.meta[name.removeprefix("probe:")] = values.get("content") or ""


def read_meta(text: str) -> dict[str, str]:
    """The probe:* meta tags of an HTML page (only its head is parsed: reports are large)."""
    end = text.lower().find("</head>")
    reader = _MetaReader()
    reader.feed(text if end < 0 else text[:end])
    reader.close()
    return reader.meta


class _KeptReader(HTMLParser):
    """The headlines an index kept in its rows: {data-stamp: data-headline}."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            values = dict(attrs)
            if values.get("data-stamp") and values.get("data-headline"):
                self.kept[values["data-stamp"] or ""] = values["data-headline"] or ""


def kept_headlines(folder: str | Path) -> dict[str, str]:
    """Headlines the folder's current index.html holds, by the stamp of their result file."""
    try:
        text = (Path(folder) / "index.html").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    reader = _KeptReader()
    reader.feed(text)
    reader.close()
    return reader.kept


def _when(created: str) -> datetime:
    """Parse an ISO 8601 time; naive times are UTC, unreadable ones sort last."""
    try:
        when = datetime.fromisoformat(created.strip().replace("Z", "+00:00"))
    except ValueError:
        return _OLDEST
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _results(entry: Mapping[str, str]) -> list[str]:
    return [r.strip() for r in str(entry.get("result", "")).split(",") if r.strip()]


def _headline(entry: Mapping[str, str], folder: Path, kept: Mapping[str, str]) -> dict[str, str]:
    """The "headline" (JSON, see index_headline) and "stamp" of one report's run."""
    results = _results(entry)
    if entry.get("analysis") == "comparison":
        return {"headline": hl.dumps(hl.comparison_headline(results, entry.get("model", "")))}
    if not results:
        return {"headline": hl.dumps(hl.problem("its report names no result file"))}
    path = hl.result_path(results[0], folder)
    try:
        stamp = hl.stamp(path)
    except OSError:
        return {"headline": hl.dumps(hl.problem(f"its result file {path.name} is missing"))}
    if stamp in kept and hl.loads(kept[stamp]) is not None:
        return {"headline": kept[stamp], "stamp": stamp}
    return {"headline": hl.dumps(hl.read_headline(path)), "stamp": stamp}


def index_entries(folder: str | Path, headlines: bool = True) -> list[dict[str, str]]:
    """One dict per report in `folder` (keys: file and the probe:* keys), newest first.

    With ``headlines``, also "headline" (JSON: :mod:`probe.reports.index_headline`) and,
    where the result file exists, "stamp" (what the next index checks its headline by).
    """
    folder = Path(folder)
    entries = []
    for path in sorted(folder.glob("*.html")):
        if path.name == "index.html":
            continue
        try:
            meta = read_meta(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if "analysis" not in meta:
            continue
        entries.append({"file": path.name, **{k: meta.get(k, "") for k in META_KEYS}})
    if headlines:
        kept = kept_headlines(folder)
        for entry in entries:
            entry.update(_headline(entry, folder, kept))
    # Sorted by name above, so equal times keep a stable order.
    return sorted(entries, key=lambda e: _when(e["created"]), reverse=True)


def _date(created: str) -> str:
    when = _when(created)
    if when == _OLDEST:
        return created
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# --- sorting ------------------------------------------------------------------------------

#: Makes every column of the runs tables sort on a click (again: the other way).  Cells sort
#: by their data-sort value where they have one, else by their text; numbers as numbers,
#: empty cells last; ties keep the page's order (by model, newest first).
SORT_SCRIPT = """
const compare = (a, b, dir) => {
  if (a === "" || b === "") return (a === "") - (b === "");
  const x = Number(a), y = Number(b);
  if (Number.isNaN(x) || Number.isNaN(y)) return dir * a.localeCompare(b, undefined, {numeric: true});
  return dir * (x - y);
};
for (const table of document.querySelectorAll("table.runs")) {
  const heads = Array.from(table.tHead.rows[0].cells);
  const body = table.tBodies[0];
  Array.from(body.rows).forEach((row, i) => { row.dataset.i = i; });
  heads.forEach((th, col) => {
    const button = document.createElement("button");
    button.type = "button";
    button.append(...th.childNodes);
    th.append(button);
    button.addEventListener("click", () => {
      const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      heads.forEach((h) => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      const key = (row) => row.cells[col].dataset.sort ?? row.cells[col].textContent.trim();
      const rows = Array.from(body.rows);
      rows.sort((a, b) => compare(key(a), key(b), dir) || a.dataset.i - b.dataset.i);
      body.append(...rows);
      table.classList.toggle("resorted", !(col === 0 && dir > 0));
    });
  });
}
"""

_CSP = re.compile(r'(<meta http-equiv="Content-Security-Policy" content=")([^"]*)(")')


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script: 'sha256-<base64>'."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def allow_script(html: str, script: str) -> str:
    """``html`` with its Content-Security-Policy extended by the hash of ``script``."""
    return _CSP.sub(
        lambda m: f"{m[1]}{m[2]}; script-src {script_hash(script)}{m[3]}", html, count=1
    )


# --- the page -----------------------------------------------------------------------------


def _slug(analysis: str) -> str:
    return "runs-" + (re.sub(r"[^a-z0-9]+", "-", analysis.lower()).strip("-") or "other")


def _headline_cell(entry: Mapping[str, str]) -> str:
    found = hl.loads(str(entry.get("headline", ""))) if entry.get("headline") else None
    if found is None:
        return '<td class="headline" data-sort="">–</td>'
    if found.get("problem"):
        return f'<td class="headline problem" data-sort="">unreadable: {esc(found["problem"])}</td>'
    lines = []
    for head, items in found.get("lines", []):
        parts = " · ".join(
            f'<span class="hl-item">{esc(label)} <span class="hl-value">{esc(value)}</span></span>'
            for label, value in items
        )
        head_html = f'<span class="hl-head">{esc(head)}</span> ' if head else ""
        lines.append(f'<span class="hl-line">{head_html}{parts}</span>')
    if found.get("note"):
        lines.append(f'<span class="hl-note">{esc(found["note"])}</span>')
    sort = found.get("sort")
    key = "" if sort is None else repr(float(sort))
    return f'<td class="headline" data-sort="{esc(key)}">{"".join(lines) or "–"}</td>'


#: The columns of a runs table besides model, headline, created and data: (meta key,
#: heading); each is left out where no run of the section has a value.
_COLUMNS = (("init", "init"), ("variants", "variants"), ("settings", "settings"))


def _listed(value: str, key: str) -> str:
    """Meta values that are comma-joined lists (init, variants), spaced for reading."""
    return value.replace(",", ", ") if key in ("init", "variants") else value


def _row(entry: Mapping[str, str], columns: Sequence[str], first: bool) -> str:
    when = _when(str(entry.get("created", "")))
    model = str(entry.get("model", "")) or str(entry["file"])
    results = _results(entry)
    data = " ".join(
        f'<a href="{href(r)}" title="{esc(r)}">{"netCDF" if len(results) == 1 else n}</a>'
        for n, r in enumerate(results, 1)
    )
    cells = [
        f'<td class="model" data-sort="{esc(model.casefold())}">'
        f'<a href="{href(entry["file"])}">{esc(model)}</a></td>',
        _headline_cell(entry),
        *(f'<td class="{k}">{esc(_listed(str(entry.get(k, "")), k))}</td>' for k in columns),
        f'<td class="created" data-sort="{"" if when == _OLDEST else esc(when.isoformat())}">'
        f"{esc(_date(str(entry.get('created', ''))))}</td>",
        f'<td class="data">{data}</td>',
    ]
    attrs = ' class="model-first"' if first else ""
    if entry.get("stamp") and not _unreadable(entry):  # a failure is tried again next time
        attrs += f' data-stamp="{esc(entry["stamp"])}" data-headline="{esc(entry["headline"])}"'
    return f"<tr{attrs}>{''.join(cells)}</tr>"


def _section(analysis: str, entries: Sequence[Mapping[str, str]]) -> str:
    title, column, words = hl.kind_words(analysis)
    # By model, newest first within each (the entries come newest first; the sort is stable).
    entries = sorted(entries, key=lambda e: str(e.get("model", "") or e["file"]).casefold())
    columns = [
        key
        for key, _ in _COLUMNS
        if not (key == "variants" and analysis == "collapse")  # its headline names them
        and any(str(e.get(key, "")).strip() for e in entries)
    ]
    rows, previous = [], None
    for entry in entries:
        model = str(entry.get("model", "") or entry["file"]).casefold()
        rows.append(_row(entry, columns, model != previous))
        previous = model
    models = len({str(e.get("model", "") or e["file"]).casefold() for e in entries})
    heads = ["model", esc(column), *(dict(_COLUMNS)[k] for k in columns), "created", "data"]
    count = f"{_plural(len(entries), 'run')} · {_plural(models, 'model')}"
    return (
        f'<section class="index-runs" id="{_slug(analysis)}">'
        f'<h2>{esc(title)} <span class="count">{count}</span></h2>'
        f'<p class="hint">{esc(words)}</p>'
        '<div class="table-scroll"><table class="index runs"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in heads)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div></section>"
    )


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _unreadable(entry: Mapping[str, str]) -> bool:
    found = hl.loads(str(entry.get("headline", ""))) if entry.get("headline") else None
    return bool(found and found.get("problem"))


def render_index(entries: Sequence[Mapping[str, str]], title: str = "probe reports") -> str:
    """index.html: every run, one section per analysis, by model, with its headline, linked."""
    header = f"<header><h1>{esc(title)}</h1>"
    if not entries:
        return page(title, header + '</header><p class="empty">No reports yet.</p>')
    groups: dict[str, list[Mapping[str, str]]] = {}
    for entry in entries:
        groups.setdefault(str(entry.get("analysis", "")), []).append(entry)
    order = hl.sections(set(groups))
    bad = sum(_unreadable(e) for e in entries)
    facts = [_plural(len(entries), "run"), f"{len(order)} analys{'i' if len(order) == 1 else 'e'}s"]
    if bad:
        facts.append(f"{bad} unreadable")
    nav = "".join(
        f'<a href="#{_slug(a)}">{esc(hl.kind_words(a)[0])} ({len(groups[a])})</a>' for a in order
    )
    header += (
        f'<p class="subtitle">{" · ".join(facts)}; by model, newest first; '
        "click a column heading to sort</p>"
        f'<nav class="toc">{nav}</nav></header>'
    )
    body = header + "".join(_section(a, groups[a]) for a in order)
    return allow_script(page(title, f"{body}<script>{SORT_SCRIPT}</script>"), SORT_SCRIPT)
