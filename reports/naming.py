"""File-name stems for reports: descriptive, stable and safe on every filesystem."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import xarray as xr

from probe.measures.stats import ordered
from probe.names import INITS

_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_MAX_PART = 60


def model_stem(model: str) -> str:
    """The last path component of a hub id or local path, reduced to [a-z0-9._-]."""
    last = re.split(r"[/\\]+", str(model).strip().rstrip("/\\"))[-1]
    safe = _UNSAFE.sub("-", last.lower()).strip("-._")
    return safe[:_MAX_PART].rstrip("-._") or "model"


def report_name(ds: xr.Dataset) -> str:
    """E.g. "collapse-gpt2-random-float32-1a2b3c4d": analysis, model, inits, dtype, settings id.

    The settings id (``probe.files.results.settings_id``) hashes everything else that
    changes the numbers (seed, sizes, text, variants, surgery, ...), so two runs
    that differ in any of them never write the same file.
    """
    inits = ordered(ds.init.values, INITS) if "init" in ds.coords else []
    parts = [
        str(ds.attrs.get("analysis", "collapse")),
        model_stem(ds.attrs.get("model", "model")),
        *inits,
        str(ds.attrs.get("dtype", "")),
        str(ds.attrs.get("settings_id", "")),
    ]
    return "-".join(p for p in (_UNSAFE.sub("-", p.lower()).strip("-") for p in parts) if p)


def comparison_name(datasets: Sequence[xr.Dataset]) -> str:
    """E.g. "comparison-bert-base-uncased-gpt2-1a2b3c4d": the models in the order given,
    then a hash of the members' settings ids (another set of results, another file)."""
    stems = [model_stem(ds.attrs.get("model", "model")) for ds in datasets]
    members = ",".join(f"{report_name(ds)}" for ds in datasets)
    digest = hashlib.sha256(members.encode("utf-8")).hexdigest()[:8]
    return "-".join(["comparison", *stems])[:190].rstrip("-._") + f"-{digest}"


def settings_summary(attrs) -> str:
    """The settings that tell two results of one model apart, in a few words."""
    parts = [
        f"{attrs.get('sequences', '?')}x{attrs.get('tokens', '?')}",
        f"seed {attrs.get('seed', '?')}",
        str(attrs.get("dtype", "")),
    ]
    source = str(attrs.get("text_source", ""))
    if source and source != "probe sample text":
        parts.append("text " + re.split(r"[/\\]", source)[-1])
    if attrs.get("inputs") == "synthetic ids":
        parts.append("synthetic ids")
    if attrs.get("mask"):
        parts.append(f"mask {attrs['mask']}")
    if str(attrs.get("surgery", "probe")) != "probe":
        parts.append(f"{attrs.get('surgery')} surgery")
    if attrs.get("weights_warning"):
        parts.append("INCOMPLETE weights")
    return " · ".join(p for p in parts if p)
