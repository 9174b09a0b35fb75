"""probe's cache folder: what a run may remember between runs of the same kind.

``PROBE_CACHE_DIR``, default ``~/.cache/probe``.  Everything kept there is a pure function
of its key, so removing the folder only means the work is done again; an unwritable
folder means it is done every time.  The self-test's passes (``verified/``) and the
theory constants (``theory/``) live there.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def root() -> Path:
    """The cache folder (it may not exist yet)."""
    return Path(os.environ.get("PROBE_CACHE_DIR") or Path.home() / ".cache" / "probe")


def read_json(path: Path | None):
    """What ``path`` holds, or None: no key, no file, or a damaged one."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path | None, value) -> None:
    """Keep ``value`` at ``path`` as a unit (staged beside it, then renamed), or nothing
    where the folder cannot be written."""
    if path is None:
        return
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(json.dumps(value), encoding="utf-8")
        os.replace(staged, path)
    except OSError:  # a read-only home: computed again next time
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
