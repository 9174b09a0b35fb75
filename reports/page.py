"""The HTML page every report shares: template, inlined CSS and probe:* meta tags.

Pages are self-contained: the stylesheet is package data read with
importlib.resources and inlined, and the template's Content-Security-Policy
refuses every fetch, so a report opened anywhere never makes a request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from html import escape
from importlib.resources import files
from string import Template
from urllib.parse import quote

from probe.files.names import as_bytes, readable

# The order of the meta tags, so pages diff cleanly; the index reads them back.
META_KEYS = (
    "model",
    "analysis",
    "family",
    "variants",
    "init",
    "created",
    "result",
    "settings",
    "id",
)


def esc(value: object) -> str:
    """HTML-escape anything shown on a page (attrs and coords may hold any character; a
    file name's bytes that are not UTF-8 show as ``\\xNN``)."""
    return escape(readable(str(value)), quote=True)


_CODE_SPAN = re.compile(r"`([^`]+)`")


def esc_code(value: object) -> str:
    """`esc`, with text between backticks (an option, a name) set as code."""
    return _CODE_SPAN.sub(r"<code>\1</code>", esc(value))


def href(name: str) -> str:
    """A link to a file relative to the page (or a local file: URI), escaped for an attribute.

    Percent-encoding ":" keeps a file name from ever reading as a scheme
    (http:, javascript:); "/" stays so relative paths like ../results/x.nc
    work, and a leading "//" (a protocol-relative, i.e. remote, URL) is cut
    to "/". A file: URI, for a result outside the report's folder, is local.
    """
    name = str(name)
    if name.startswith("file:/"):
        return esc(quote(as_bytes(name), safe="/:%"))
    url = quote(as_bytes(name), safe="/")  # a name's own bytes, %FF for a byte not UTF-8
    if url.startswith("//"):
        url = "/" + url.lstrip("/")
    return esc(url)


@cache
def _resource(folder: str, name: str) -> str:
    return files(__package__).joinpath(folder, name).read_text(encoding="utf-8")


def css() -> str:
    return _resource("static", "report.css")


def meta_tags(meta: Mapping[str, object]) -> str:
    """<meta name="probe:KEY" content="..."> for the keys the index understands."""
    return "\n".join(
        f'<meta name="probe:{key}" content="{esc(meta.get(key, ""))}">' for key in META_KEYS
    )


def page(title: str, body: str, meta: Mapping[str, object] | None = None) -> str:
    """A full HTML document; `title` is plain text, `body` is already HTML."""
    return Template(_resource("templates", "page.html")).substitute(
        title=esc(title),
        meta=meta_tags(meta) if meta is not None else "",
        css=css().strip(),
        body=body,
    )
