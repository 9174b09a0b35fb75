"""Training text that every machine with Python has: the standard library's docstrings.

The sources are parsed with :mod:`ast`, never imported (importing ``this`` or
``antigravity`` has side effects), in sorted path order, so one Python version
gives one text; its sha256 goes into the checkpoint folder.  Test suites, IDLE
and the bundled third-party code are left out.  Docstrings are cleaned with
``inspect.cleandoc`` and separated by blank lines.
"""

from __future__ import annotations

import ast
import functools
import inspect
import signal
import sysconfig
from pathlib import Path

from probe.files.interrupts import check_interrupt

from ..errors import ProbeError

STDLIB = "stdlib"
_SKIP = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "ensurepip",
    "turtledemo",
    "pydoc_data",
}


#: Signals whose handlers raise (Ctrl-C, SIGTERM, a caller's alarm).
_DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}


def _parse(source: str) -> ast.Module:
    """``ast.parse`` with those signals deferred to its end.

    CPython 3.11 replaces an exception that a signal handler raises inside ``compile``
    with ``SystemError: AST constructor recursion depth mismatch``: Ctrl-C while the
    standard library was gathered gave that traceback (found by the fuzzer's time limit).
    Held for one file's parse (milliseconds), the signal is handled right after it.
    """
    if not hasattr(signal, "pthread_sigmask"):
        return ast.parse(source)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        return ast.parse(source)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@functools.lru_cache(maxsize=4)  # one Python, one text: gathered once per process
def stdlib_docstrings(limit: int | None = None) -> str:
    """The docstrings of the standard library's modules, classes and functions, in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ProbeError(f"cannot find the standard library's sources at {root}")
    parts: list[str] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        if _SKIP.intersection(path.relative_to(root).parts):
            continue
        check_interrupt()  # gathering takes seconds: the command stops between two files
        try:
            tree = _parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue  # a few files are deliberately broken or not UTF-8
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=False)
                if doc and doc.strip():
                    text = inspect.cleandoc(doc)
                    parts.append(text)
                    size += len(text) + 2
        if limit is not None and size >= limit:
            break
    if not parts:
        raise ProbeError(f"found no docstrings under {root}")
    text = "\n\n".join(parts) + "\n"
    return text if limit is None else text[:limit]
