"""File-name stems for reports: descriptive, stable and safe on every filesystem."""

from __future__ import annotations

import re
from collections.abc import Sequence

import xarray as xr

from probe.plot import INITS, ordered

_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_MAX_PART = 60


def model_stem(model: str) -> str:
    """The last path component of a hub id or local path, reduced to [a-z0-9._-]."""
    last = re.split(r"[/\\]+", str(model).strip().rstrip("/\\"))[-1]
    safe = _UNSAFE.sub("-", last.lower()).strip("-._")
    return safe[:_MAX_PART].rstrip("-._") or "model"


def report_name(ds: xr.Dataset) -> str:
    """E.g. "collapse-bert-base-uncased-random-float32": analysis, model, inits, dtype."""
    parts = [
        str(ds.attrs.get("analysis", "collapse")),
        model_stem(ds.attrs.get("model", "model")),
        *ordered(ds.init.values, INITS),
        str(ds.attrs.get("dtype", "")),
    ]
    return "-".join(p for p in (_UNSAFE.sub("-", p.lower()).strip("-") for p in parts) if p)


def comparison_name(datasets: Sequence[xr.Dataset]) -> str:
    """E.g. "comparison-bert-base-uncased-gpt2": the models in the order given."""
    stems = [model_stem(ds.attrs.get("model", "model")) for ds in datasets]
    return "-".join(["comparison", *stems])[:200].rstrip("-._")
