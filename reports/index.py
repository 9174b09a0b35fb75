"""The index of a reports folder, rebuilt from the reports themselves.

Every report carries <meta name="probe:..."> tags in its <head>; reading them
back means the folder alone is the database: no manifest to keep in sync.
HTML files without those tags (anything else in the folder) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

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


def _when(created: str) -> datetime:
    """Parse an ISO 8601 time; naive times are UTC, unreadable ones sort last."""
    try:
        when = datetime.fromisoformat(created.strip().replace("Z", "+00:00"))
    except ValueError:
        return _OLDEST
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def index_entries(folder: str | Path) -> list[dict[str, str]]:
    """One dict per report in `folder` (keys: file and the probe:* keys), newest first."""
    entries = []
    for path in sorted(Path(folder).glob("*.html")):
        if path.name == "index.html":
            continue
        try:
            meta = read_meta(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if "analysis" not in meta:
            continue
        entries.append({"file": path.name, **{k: meta.get(k, "") for k in META_KEYS}})
    # Sorted by name above, so equal times keep a stable order.
    return sorted(entries, key=lambda e: _when(e["created"]), reverse=True)


def _date(created: str) -> str:
    when = _when(created)
    if when == _OLDEST:
        return created
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render_index(entries: Sequence[Mapping[str, str]], title: str = "probe reports") -> str:
    """index.html: every report with model, analysis, variants, init and date, linked."""
    if not entries:
        body = '<p class="empty">No reports yet.</p>'
    else:
        rows = []
        for e in entries:
            results = [r.strip() for r in str(e.get("result", "")).split(",") if r.strip()]
            data = ", ".join(f'<a href="{href(r)}">{esc(r)}</a>' for r in results)
            rows.append(
                f'<tr><td class="num">{esc(_date(str(e.get("created", ""))))}</td>'
                f'<td><a href="{href(e["file"])}">{esc(e.get("model", "") or e["file"])}</a></td>'
                f"<td>{esc(e.get('analysis', ''))}</td><td>{esc(e.get('family', ''))}</td>"
                f"<td>{esc(str(e.get('variants', '')).replace(',', ', '))}</td>"
                f"<td>{esc(str(e.get('init', '')).replace(',', ', '))}</td><td>{data}</td></tr>"
            )
        body = (
            '<div class="table-scroll"><table class="index"><thead><tr><th>created</th>'
            "<th>model</th><th>analysis</th><th>family</th><th>variants</th><th>init</th>"
            f"<th>data</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )
    header = (
        f"<header><h1>{esc(title)}</h1>"
        f'<p class="subtitle">{len(entries)} report{"s" if len(entries) != 1 else ""}, newest first</p></header>'
    )
    return page(title, header + body)
