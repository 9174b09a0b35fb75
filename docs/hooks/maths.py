"""The site's formulas as MathML, written at build time: no script renders them at view time.

A page writes LaTeX between ``$...$`` (inline) or ``$$...$$`` (display);
``pymdownx.arithmatex`` in its generic mode (mkdocs.yml) leaves it in
``<span class="arithmatex">\\(...\\)</span>`` and ``<div class="arithmatex">\\[...\\]</div>``,
and this hook replaces each by the MathML ``latex2mathml`` writes, which browsers draw
natively. In a notebook page (mkdocs-jupyter) the Markdown cells keep their ``$...$``, and
nbconvert adds a script loading MathJax from a CDN and one that would import Mermaid from a
CDN for a diagram: the hook converts the formulas of the Markdown cells and removes both
scripts (the notebooks have no diagrams), so nothing is fetched when the page is read.

A formula latex2mathml cannot read fails the build, naming the page.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
BLOCK = re.compile(r'<div class="arithmatex">\s*\\\[(.*?)\\\]\s*</div>', re.S)
#: nbconvert's MathJax loader and its configuration, between the comments its template writes.
MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
#: nbconvert's loader of Mermaid, for the diagrams of a notebook.
MERMAID = re.compile(
    r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*?</script>', re.S
)
#: Where each notebook cell starts in nbconvert's HTML.
CELL = re.compile(r'(?=<div class="jp-Cell )')
NOTEBOOK_BLOCK = re.compile(r"\$\$(.+?)\$\$", re.S)
NOTEBOOK_INLINE = re.compile(r"(?<![\\$])\$(?!\s)([^$]+?)(?<![\s\\])\$(?!\$)")


#: A command latex2mathml does not know, which it would print as it is.
UNKNOWN = re.compile(r">(\\[A-Za-z]+)<")


def mathml(latex: str, display: bool, where: str) -> str:
    """``latex`` (HTML-escaped as the Markdown left it) as a <math> element."""
    text = html.unescape(latex).strip()
    braces = re.sub(r"\\[{}]", "", text)
    if braces.count("{") != braces.count("}"):
        raise ValueError(f"{where}: unbalanced braces in the formula {text!r}")
    try:
        out = convert(text, display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises its own errors and plain ones
        raise ValueError(f"{where}: cannot convert the formula {text!r}: {error}") from error
    unknown = UNKNOWN.search(out)
    if unknown:
        raise ValueError(
            f"{where}: {unknown.group(1)} is not a command latex2mathml knows: {text!r}"
        )
    return out


def markdown_maths(content: str, where: str) -> str:
    """The arithmatex spans and divs of a Markdown page's HTML as MathML."""
    content = BLOCK.sub(
        lambda m: f'<div class="arithmatex">{mathml(m.group(1), True, where)}</div>', content
    )
    return INLINE.sub(
        lambda m: f'<span class="arithmatex">{mathml(m.group(1), False, where)}</span>', content
    )


def notebook_maths(content: str, where: str) -> str:
    """The ``$...$`` and ``$$...$$`` of a notebook's Markdown cells as MathML, and neither
    MathJax nor Mermaid."""
    content = MERMAID.sub("", MATHJAX.sub("", content))
    cells = CELL.split(content)
    for i, cell in enumerate(cells):
        if cell.startswith('<div class="jp-Cell jp-MarkdownCell'):
            cell = NOTEBOOK_BLOCK.sub(
                lambda m: f'<div class="arithmatex">{mathml(m.group(1), True, where)}</div>', cell
            )
            cells[i] = NOTEBOOK_INLINE.sub(
                lambda m: f'<span class="arithmatex">{mathml(m.group(1), False, where)}</span>',
                cell,
            )
    return "".join(cells)


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs' signature)
    where = page.file.src_uri
    if where.endswith(".ipynb"):
        html = notebook_maths(html, where)
    return markdown_maths(html, where)
