"""Statistics of a "collapse" result: the numbers its figures, reports and the CLI print.

`stats` reduces the per-sequence metrics to mean, standard deviation and count over
sequences.  `fit_order` reads the *order* of the collapse off the mean relative residual
r: the least-squares slope of log r(l+1) against log r(l), where a slope of 1 is plain
exponential decay and a slope of 3 the cubic per-layer contraction that makes pure
attention lose rank doubly exponentially (Dong, Cordonnier & Loukas 2021).  `summarise`
and `comparison_rows` turn these into the plain Python values the reports' prose and
tables, the accessor and ``probe compare`` print.

Nothing here draws: ``probe.plot`` builds its figures from these functions, and a
caller that only wants numbers does not import matplotlib.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import xarray as xr

from .names import INITS, VARIANTS

# Only pairs with r in [FIT_FLOOR_FACTOR * eps, FIT_UPPER] enter the order fit:
# below, r is rounding noise; above, the cubic term does not dominate yet.
FIT_FLOOR_FACTOR = 10.0
FIT_UPPER = 0.5


def eps(ds: xr.Dataset) -> float:
    """Machine epsilon of the dtype the probe ran in: below it r is zero for all purposes."""
    name = str(ds.attrs.get("dtype", "float64"))
    if name == "bfloat16":  # unknown to NumPy: 8 significant bits
        return 2.0**-7
    try:
        return float(np.finfo(name).eps)
    except (TypeError, ValueError):  # an edited or foreign result: float64's
        return float(np.finfo(np.float64).eps)


def ordered(values: Sequence, canonical: Sequence[str]) -> list[str]:
    """Coordinate values in the canonical order, unknown ones appended as they come."""
    present = [str(v) for v in values]
    return [v for v in canonical if v in present] + [v for v in present if v not in canonical]


def stats(
    ds: xr.Dataset, name: str = "relative_residual", norm: str = "l1inf", fit: str = "mean"
) -> xr.Dataset:
    """Mean, standard deviation (ddof 0, like seaborn's "sd") and count over sequences.

    Returns a Dataset with variables mean, std, count over (variant, init, layer),
    variants and inits in canonical order, layers sorted. NaN entries are skipped.
    """
    da = ds[name]
    if "norm" in da.dims:
        da = da.sel(norm=norm)
    if "fit" in da.dims:
        da = da.sel(fit=fit)
    da = da.sortby("layer").sel(
        variant=ordered(da.variant.values, VARIANTS), init=ordered(da.init.values, INITS)
    )
    # All-NaN slices (a variant not run for an init) are expected, not worth a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return xr.Dataset(
            {
                "mean": da.mean("sequence", skipna=True),
                "std": da.std("sequence", skipna=True, ddof=0),
                "count": da.count("sequence"),
            }
        )


def has_data(values: np.ndarray) -> bool:
    """Whether any value is finite (a variant not run for an init is NaN throughout)."""
    return bool(np.isfinite(values).any())


def fit_order(
    ds: xr.Dataset, norm: str = "l1inf", fit: str = "mean", upper: float = FIT_UPPER
) -> xr.DataArray:
    """Least-squares slope of log r(l+1) against log r(l), per (variant, init).

    r is the mean relative residual over sequences. Only consecutive pairs whose
    both ends lie in [FIT_FLOOR_FACTOR * eps, upper] count; with fewer than two
    such pairs (or no spread in r(l)) the order is NaN.
    """
    st = stats(ds, "relative_residual", norm, fit)
    low = FIT_FLOOR_FACTOR * eps(ds)
    out = np.full((st.sizes["variant"], st.sizes["init"]), np.nan)
    for i, variant in enumerate(st.variant.values):
        for j, init in enumerate(st.init.values):
            m = st["mean"].sel(variant=variant, init=init).values.astype(float)
            x, y = m[:-1], m[1:]
            with np.errstate(invalid="ignore"):
                ok = (x >= low) & (x <= upper) & (y >= low) & (y <= upper)
            if ok.sum() < 2:
                continue
            lx, ly = np.log(x[ok]), np.log(y[ok])
            if np.ptp(lx) > 0:
                out[i, j] = np.polyfit(lx, ly, 1)[0]
    return xr.DataArray(
        out,
        coords={"variant": st.variant.values, "init": st.init.values},
        dims=("variant", "init"),
        name="order",
        attrs={"norm": norm, "fit": fit, "floor": low, "upper": upper},
    )


def pick_init(ds: xr.Dataset, init: str | None) -> str:
    """The init a comparison panel shows (see `comparison`)."""
    present = ordered(ds.init.values, INITS)
    if init is None:
        return "pretrained" if "pretrained" in present else present[0]
    if init not in present:
        raise ValueError(f"{ds.attrs.get('model', 'dataset')!r} has no init {init!r}")
    return init


def summarise(
    ds: xr.Dataset, threshold: float = 1e-3, norm: str = "l1inf", fit: str = "mean"
) -> dict[str, dict[str, dict]]:
    """Numbers for the report's prose, as {variant: {init: {...}}} of plain Python values.

    Per variant and init with data: "first_below" (first layer whose mean r is
    under `threshold`, None if never), "final" (mean r at the last layer with
    data), "final_layer", and "order" (`fit_order`, None where undefined).
    """
    st = stats(ds, "relative_residual", norm, fit)
    orders = fit_order(ds, norm, fit)
    layers = st.layer.values
    out: dict[str, dict[str, dict]] = {}
    for variant in st.variant.values:
        for init in st.init.values:
            m = st["mean"].sel(variant=variant, init=init).values.astype(float)
            finite = np.isfinite(m)
            if not finite.any():
                continue
            below = np.flatnonzero(finite & (m < threshold))
            last = np.flatnonzero(finite)[-1]
            order = float(orders.sel(variant=variant, init=init))
            out.setdefault(str(variant), {})[str(init)] = {
                "first_below": int(layers[below[0]]) if below.size else None,
                "final": float(m[last]),
                "final_layer": int(layers[last]),
                "order": order if np.isfinite(order) else None,
            }
    return out


def comparison_rows(
    datasets: Sequence[xr.Dataset], threshold: float = 1e-3, norm: str = "l1inf", fit: str = "mean"
) -> list[dict]:
    """One row per model and init for the table that opens a comparison.

    "final": {variant: mean r at the last layer}; "san_below": the first layer where the
    SAN's mean r is under ``threshold`` (None: never within the model's depth); "order":
    the SAN's fitted order of collapse (slope of log r(l+1) on log r(l), None if undefined).
    """
    rows = []
    for ds in datasets:
        found = summarise(ds, threshold, norm, fit)
        inits = ordered(dict.fromkeys(i for v in found.values() for i in v), INITS)
        for init in inits:
            san = found.get("SAN", {}).get(init, {})
            rows.append(
                {
                    "model": str(ds.attrs.get("model", "?")),
                    "family": str(ds.attrs.get("family", "")),
                    "init": init,
                    "layers": int(ds.sizes.get("layer", 1)) - 1,
                    "final": {
                        v: found[v][init]["final"] for v in VARIANTS if init in found.get(v, {})
                    },
                    "san_below": san.get("first_below"),
                    "order": san.get("order"),
                }
            )
    return rows
