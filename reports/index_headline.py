"""The headline of a run for the index: the one number (per variant or init) that came out.

Each analysis has its own: a collapse result the last layer's relative residual per variant,
an attention result its sink rate, a sweep the range of its final residual over the points,
the path analyses, toy tasks and trainings their main measure (:data:`KINDS` words each).
A headline is a small JSON-able dict, so the index can keep it between rewrites:

    {"lines": [[head, [[label, value], ...]], ...], "note": str, "sort": float | None,
     "problem": str}

``lines``: one line per init (or hidden size, or depth), each a few (label, value) pairs;
``sort``: the number the index sorts the column by; ``problem``: why the result could not be
read (one line), the rest then empty.  Result files are opened lazily and only the slices a
headline needs are read: the index is rewritten after every command.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import xarray as xr

from probe import registry
from probe.files.results import ENGINE
from probe.measures.stats import floor, ordered, shown
from probe.names import INITS, VARIANTS
from probe.registry import ANALYSES, find, resolve

from .tables import fmt

#: Part of every cache stamp: a change to how headlines are computed invalidates them all.
HEADLINE_VERSION = "1"

#: analysis -> (section title, headline column, what the headline is), as
#: ``probe.registry`` declares them, in the order of the index's sections: comparisons
#: (of collapse results: no analysis of their own) follow the collapse section; analyses
#: not listed follow, alphabetically.
KINDS: dict[str, tuple[str, str, str]] = {ANALYSES[0].name: ANALYSES[0].section}
KINDS["comparison"] = (
    "Comparisons across models",
    "compared",
    "How many results each comparison reads; its report holds the numbers.",
)
KINDS |= {a.name: a.section for a in ANALYSES[1:]}


def kind_words(analysis: str) -> tuple[str, str, str]:
    """Section title, headline column and explanation of an analysis (known or not)."""
    if analysis in KINDS:
        return KINDS[analysis]
    known = find(analysis)  # one registered after this module was read
    if known is not None:
        return known.section
    if not analysis:
        return ("Other reports", "contents", "Reports that name no analysis.")
    return (analysis, "contents", f"probe has no headline for {analysis} results: what they hold.")


def sections(analyses: set[str]) -> list[str]:
    """The analyses of a folder in the order of the index's sections."""
    known = [*KINDS, *(a.name for a in registry.ANALYSES if a.name not in KINDS)]
    return [a for a in known if a in analyses] + sorted(analyses - set(known))


def result_path(result: str, folder: Path) -> Path:
    """The file a report's ``result`` meta names: relative to its folder, or a file: URI."""
    if result.startswith("file:"):
        return Path(unquote(urlparse(result).path))
    return folder / result


def stamp(path: Path) -> str:
    """What identifies a result file's content cheaply (results are replaced by a rename)."""
    stat = path.stat()
    return f"{HEADLINE_VERSION}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def problem(reason: str) -> dict:
    return {"lines": [], "note": "", "sort": None, "problem": _one_line(reason)}


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_headline(path: Path) -> dict:
    """The headline of the result file at ``path``, or a problem saying why there is none."""
    if not path.is_file():
        return problem(f"its result file {path.name} is missing")
    try:
        with xr.open_dataset(path, engine=ENGINE) as ds:
            return headline(ds)
    # A result that cannot be read must never break the index: any failure is its reason.
    except Exception as err:  # noqa: BLE001
        return problem(f"cannot read {path.name}: {type(err).__name__}: {err}")


def headline(ds: xr.Dataset) -> dict:
    """The headline of a result (lazily opened or in memory): see the module's docstring."""
    analysis = str(ds.attrs.get("analysis", ""))
    if not analysis:
        return problem("not a probe result (no 'analysis' attribute)")
    known = find(analysis)
    found = (resolve(known.headline) if known else _contents)(ds)
    found.setdefault("note", "")
    found.setdefault("problem", "")
    sort = found.get("sort")
    found["sort"] = float(sort) if sort is not None and math.isfinite(sort) else None
    return found


def comparison_headline(results: list[str], models: str) -> dict:
    """A comparison has no result of its own: what it compares, from its meta tags."""
    n = len(results)
    m = len([x for x in models.split(",") if x.strip()])
    items = [["results", str(n)]] + ([["models", str(m)]] if m and m != n else [])
    return {"lines": [["", items]], "note": "", "sort": float(n), "problem": ""}


def dumps(found: dict) -> str:
    return json.dumps(found, separators=(",", ":"), ensure_ascii=False)


def loads(text: str) -> dict | None:
    """A headline kept in an earlier index, or None where it is not one."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("lines"), list):
        return None
    return found


# --- one function per analysis ------------------------------------------------------------


def _mean(values: xr.DataArray, dim: str) -> np.ndarray:
    """Mean over ``dim`` of what is there (an all-NaN slice is NaN, without a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values.values, axis=values.dims.index(dim))


def _first(values: list[float]) -> float | None:
    return next((v for v in values if math.isfinite(v)), None)


def _key(value: float | None, ds: xr.Dataset) -> float | None:
    """The sort key of a distance to rank one: every value under the run's precision floor
    is that dtype's rounding, so all of them sort as the floor (ties keep the page's order)."""
    if value is None:
        return None
    low = floor(ds)
    return low if abs(value) < low else value


def collapse_headline(ds: xr.Dataset) -> dict:
    r = ds["relative_residual"]
    r = r.sel(fit="mean") if "fit" in r.dims else r
    r = r.sel(norm="l1inf") if "norm" in r.dims else r
    last = r.sel(layer=ds.layer.values.max())
    last = last.transpose("variant", "init", "sequence")
    mean = _mean(last, "sequence")  # (variant, init)
    variants = [str(v) for v in ds.variant.values]
    inits = [str(i) for i in ds.init.values]
    lines, firsts = [], []
    for init in ordered(inits, INITS):
        j = inits.index(init)
        items = [
            [v, shown(float(mean[variants.index(v), j]), ds)]
            for v in ordered(variants, VARIANTS)
            if np.isfinite(mean[variants.index(v), j])
        ]
        if items:
            lines.append([init if len(inits) > 1 else "", items])
            firsts.append(float(mean[variants.index(ordered(variants, VARIANTS)[0]), j]))
    return {"lines": lines, "sort": _key(_first(firsts), ds)}


def attention_headline(ds: xr.Dataset) -> dict:
    rate = ds["sink_rate"]
    values = [float(rate.sel(init=i)) for i in ordered(ds.init.values, INITS)]
    items = [
        [init, fmt(v) if math.isfinite(v) else "none"]
        for init, v in zip(ordered(ds.init.values, INITS), values, strict=True)
    ]
    note = f"ε = {ds.attrs['epsilon']}" if "epsilon" in ds.attrs else ""
    if not any(math.isfinite(v) for v in values):
        note = "no attention probabilities in this family"
    return {"lines": [["", items]], "note": note, "sort": _first(values)}


def _span(low: float, high: float, ds: xr.Dataset) -> str:
    a, b = shown(low, ds), shown(high, ds)
    return a if a == b else f"{a} – {b}"


def sweep_headline(ds: xr.Dataset) -> dict:
    final = ds["final_residual"]
    points = [d for d in final.dims if d not in ("variant", "init")]
    inits = ordered(ds.init.values, INITS)
    lines, lows = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low = final.min(points, skipna=True).transpose("variant", "init").values
        high = final.max(points, skipna=True).transpose("variant", "init").values
    variants = [str(v) for v in final.variant.values]
    all_inits = [str(i) for i in final.init.values]
    for init in inits:
        j = all_inits.index(init)
        items = [
            [v, _span(float(low[variants.index(v), j]), float(high[variants.index(v), j]), ds)]
            for v in ordered(variants, VARIANTS)
            if np.isfinite(low[variants.index(v), j])
        ]
        if items:
            lines.append([init if len(inits) > 1 else "", items])
            lows.append(float(low[variants.index(ordered(variants, VARIANTS)[0]), j]))
    done, total = ds.attrs.get("points_done"), ds.attrs.get("points")
    note = f"{done} of {total} points" if done is not None and total is not None else ""
    return {"lines": lines, "note": note, "sort": _key(_first(lows), ds)}


def _big(digits: str) -> str:
    """An exact count of any length, for reading: 3 significant digits."""
    digits = digits.strip()
    try:
        return f"{float(int(digits)):.3g}"
    except (ValueError, OverflowError):
        return f"~1e{len(digits) - 1}" if digits.isdigit() else digits


def paths_count_headline(ds: xr.Dataset) -> dict:
    names = [str(a) for a in ds.architecture.values]
    length = ds["mean_length"].values.astype(float)
    if len(names) == 1:
        items = [["paths", _big(str(ds["total"].values.item()))], ["mean length", fmt(length[0])]]
        return {"lines": [["", items]], "sort": float(length[0])}
    items = [
        ["architectures", str(len(names))],
        ["mean length", f"{fmt(np.nanmin(length))} – {fmt(np.nanmax(length))}"],
    ]
    return {"lines": [["", items]], "sort": float(np.nanmax(length))}


def paths_sample_headline(ds: xr.Dataset) -> dict:
    ratio = ds["ratio"]
    ratio = ratio.sel(fit="svd") if "fit" in ratio.dims else ratio
    ratio = ratio.sel(norm="l1inf") if "norm" in ratio.dims else ratio
    if "order" in ratio.dims:
        ratio = ratio.sel(order=ds.order.values[0])  # the headline order comes first
    depth = int(ds.depth.values.max())
    deepest = ratio.sel(depth=depth).transpose("init", "sample").values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(deepest, axis=1)
    inits = [str(i) for i in ds.init.values]
    values = [float(median[inits.index(i)]) for i in ordered(inits, INITS)]
    items = [[i, shown(v, ds)] for i, v in zip(ordered(inits, INITS), values, strict=True)]
    return {"lines": [[f"depth {depth}", items]], "sort": _key(_first(values), ds)}


def paths_decompose_headline(ds: xr.Dataset) -> dict:
    last = ds.layer.values.max()
    eff = ds["effective_length"].sel(norm="fro", layer=last).transpose("init", "sequence")
    mean = _mean(eff, "sequence")
    inits = [str(i) for i in ds.init.values]
    values = [float(mean[inits.index(i)]) for i in ordered(inits, INITS)]
    items = [[i, fmt(v)] for i, v in zip(ordered(inits, INITS), values, strict=True)]
    items.append(["by count", fmt(float(ds["uniform_mean_length"].sel(layer=last)))])
    return {"lines": [["", items]], "note": f"layer {int(last)}", "sort": _first(values)}


def toy_headline(ds: xr.Dataset) -> dict:
    if "relative_residual" in ds and "hidden" in ds["relative_residual"].dims:  # circle
        r = ds["relative_residual"].isel(step=-1).transpose("hidden", "variant").values
        hidden = [int(h) for h in ds.hidden.values]
        variants = [str(v) for v in ds.variant.values]
        lines = [
            [
                f"hidden {h}" if len(hidden) > 1 else "",
                [
                    [v, shown(float(r[i, variants.index(v)]), ds)]
                    for v in ordered(variants, VARIANTS)
                ],
            ]
            for i, h in enumerate(hidden)
        ]
        steps = int(ds.step.values.max())
        first = ordered(variants, VARIANTS)[0]
        return {
            "lines": lines,
            "note": f"after {steps} steps",
            "sort": _key(float(r[0, variants.index(first)]), ds),
        }
    full = float(ds["full_accuracy"])
    items = [["accuracy", fmt(full)]]
    if "baseline_position" in ds:
        items.append(["position baseline", fmt(float(ds["baseline_position"]))])
    return {"lines": [["", items]], "sort": full}


def training_headline(ds: xr.Dataset) -> dict:
    if "final_val_bits_per_char" in ds:
        final = ds["final_val_bits_per_char"].values.astype(float)
    else:  # the last evaluation each model has
        bits = ds["val_bits_per_char"].transpose("model", "evaluation").values.astype(float)
        final = np.array([row[np.isfinite(row)][-1] if np.isfinite(row).any() else np.nan
                          for row in bits])  # fmt: skip
    items = [[str(m), fmt(float(v))] for m, v in zip(ds.model.values, final, strict=True)]
    return {"lines": [["", items]], "sort": _first([float(v) for v in final])}


def _contents(ds: xr.Dataset) -> dict:
    """No headline for this analysis: which variables the result holds."""
    names = [str(n) for n in ds.data_vars]
    shown_names = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return {"lines": [], "note": f"holds {shown_names}" if names else "holds no variables"}
