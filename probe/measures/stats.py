"""Statistics of a "collapse" result: the numbers its figures, reports and the CLI print.

`stats` reduces the per-sequence metrics to mean, standard deviation and count over
sequences.  `fit_order` reads the *order* of the collapse off the mean relative residual
r: the least-squares slope of log r(l+1) against log r(l), where a slope of 1 is plain
exponential decay and a slope of 3 the cubic per-layer contraction that makes pure
attention lose rank doubly exponentially (Dong, Cordonnier & Loukas 2021).  `summarise`
and `comparison_rows` turn these into the plain Python values the reports' prose and
tables, the accessor and ``probe compare`` print.

Every fitted slope comes with its quality (`slope_fit`: the pairs it used, its standard
error, the decades its points span) and is missing, with the reason, below that quality.
Every distance to rank one below the run's precision floor (`precision_floor`: 10 machine
epsilons of its dtype, from measurement) is rounding, and `shown` writes it as below the
floor; the Dataset keeps the raw value.

Nothing here draws: ``probe.figures.plot`` builds its figures from these functions, and a
caller that only wants numbers does not import matplotlib.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import xarray as xr

from probe.names import INITS, VARIANTS

#: A distance to rank one below this many machine epsilons of the run's dtype is that dtype's
#: rounding, not a measurement: the same runs in float32 and in float64 differ by up to 5.6
#: float32 epsilons, and bfloat16 against float64 by up to 2.1 bfloat16 epsilons, over the
#: six models of ``docs/data/precision_floor.py``.
FLOOR_FACTOR = 10.0
#: Only pairs with r in [the precision floor, FIT_UPPER] enter the order fit: above, the
#: cubic term does not dominate yet.
FIT_UPPER = 0.5
#: A fit through two pairs has no residual to judge it by: its r(l) must then span this many
#: decades, so that the slope is not read off two nearly equal points (a cubic step from
#: r = 0.4 spans 0.8 decades; two residuals of 0.4615 and 0.4777, 0.015).
MIN_SPREAD = 0.5
#: A fit through three pairs or more is shown when the standard error of its slope is at
#: most this: an order of 1 and one of 3 are then four standard errors apart.
MAX_STDERR = 0.5
#: An exponential rate of mu(X) is fitted through at least this many layers above the
#: precision floor: through two, any curve is a line and the fit has no residual to judge.
MIN_RATE_LAYERS = 3


def dtype_eps(name: str) -> float:
    """Machine epsilon of a dtype by name (float64's for a name NumPy does not know)."""
    if name == "bfloat16":  # unknown to NumPy: 8 significant bits
        return 2.0**-7
    try:
        return float(np.finfo(name).eps)
    except (TypeError, ValueError):  # an edited or foreign result: float64's
        return float(np.finfo(np.float64).eps)


def eps(ds: xr.Dataset) -> float:
    """Machine epsilon of the dtype the probe ran in."""
    return dtype_eps(str(ds.attrs.get("dtype", "float64")))


def precision_floor(dtype: str) -> float:
    """The value below which a run in ``dtype`` measures its own rounding (FLOOR_FACTOR eps)."""
    return FLOOR_FACTOR * dtype_eps(dtype)


def floor(ds: xr.Dataset) -> float:
    """The precision floor of a result: its ``precision_floor`` attr, else its dtype's."""
    if "precision_floor" in ds.attrs:
        return float(ds.attrs["precision_floor"])
    return precision_floor(str(ds.attrs.get("dtype", "float64")))


def short(value: float) -> str:
    """Two significant digits with a bare exponent: 1.2e-6, 2.2e-15, 0.078."""
    text = f"{value:.2g}"
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def below_floor(floor_value: float, dtype: str) -> str:
    """How a value under the precision floor is shown: "< 1.2e-6 (float32)"."""
    return f"< {short(floor_value)} ({dtype})"


def shown(value: float, ds: xr.Dataset, digits: int = 3, missing: str = "–") -> str:
    """A distance to rank one of ``ds`` for reading: ``digits`` significant digits, the
    floor (:func:`below_floor`) where it is under the run's precision floor, ``missing``
    where it is NaN (not run, or no data).  The Dataset keeps the raw value."""
    if not np.isfinite(value):
        return missing
    low = floor(ds)
    if abs(value) < low:
        return below_floor(low, str(ds.attrs.get("dtype", "float64")))
    return f"{value:.{digits}g}"


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


def slope_fit(x: np.ndarray, y: np.ndarray, low: float, upper: float = FIT_UPPER) -> dict:
    """The least-squares slope of log y against log x over the pairs whose both ends lie in
    [low, upper], with its quality.

    Returns "slope" (NaN where the fit is below quality, see :func:`fit_reason`), "pairs"
    (how many pairs entered), "stderr" (the slope's standard error; NaN with two pairs, which
    leave no residual), "spread" (decades between the smallest and largest x fitted) and
    "raw" (the slope before the quality check; NaN with fewer than two pairs).
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    with np.errstate(invalid="ignore"):
        ok = (x >= low) & (x <= upper) & (y >= low) & (y <= upper)
    pairs = int(ok.sum())
    out = {"slope": np.nan, "pairs": pairs, "stderr": np.nan, "spread": np.nan, "raw": np.nan}
    if pairs < 2:
        return out
    lx, ly = np.log(x[ok]), np.log(y[ok])
    out["spread"] = float(np.ptp(lx) / np.log(10))
    if out["spread"] == 0:
        return out
    out["raw"], out["stderr"] = line(lx, ly)
    if fit_reason(out, low, "", upper) is None:
        out["slope"] = out["raw"]
    return out


def line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The least-squares slope of y against x (``np.polyfit``) and its standard error, NaN
    from two points, which leave no residual."""
    slope, intercept = np.polyfit(x, y, 1)
    if len(x) < 3:
        return float(slope), float("nan")
    residual = y - (slope * x + intercept)
    sxx = float(np.sum((x - x.mean()) ** 2))
    return float(slope), float(np.sqrt(np.sum(residual**2) / (len(x) - 2) / sxx))


def fit_reason(found: dict, low: float, dtype: str, upper: float = FIT_UPPER) -> str | None:
    """Why :func:`slope_fit`'s slope is missing (None: it is shown)."""
    pairs, spread, stderr = found["pairs"], found["spread"], found["stderr"]
    if pairs < 2:
        where = f"the {dtype} floor {short(low)}" if dtype else short(low)
        return f"{pairs} pair{'s' * (pairs != 1)} between {where} and {upper:g}; 2 needed"
    if not spread > 0:
        return "no spread in the fitted points"
    if pairs == 2 and spread < MIN_SPREAD:
        return f"2 pairs spanning {spread:.2g} decades; {MIN_SPREAD:g} needed for 2 pairs"
    if pairs > 2 and not stderr <= MAX_STDERR:
        return f"standard error {stderr:.2g} over {pairs} pairs; at most {MAX_STDERR:g} shown"
    return None


def fit_quality(found: dict) -> str:
    """A shown slope's quality: "2 pairs" or "± 0.12, 4 pairs"."""
    if found["pairs"] > 2:
        return f"± {found['stderr']:.2g}, {found['pairs']} pairs"
    return f"{found['pairs']} pairs"


def fit_text(found: dict, low: float, dtype: str, digits: int = 2, missing: str = "–") -> str:
    """A fitted slope for reading: "2.83 (± 0.12, 4 pairs)", or ``missing`` and why:
    "– (2 pairs spanning 0.015 decades; 1 needed for 2 pairs)".  ``found``: "slope",
    "pairs", "stderr" and "spread", as :func:`slope_fit` returns them."""
    if np.isfinite(found["slope"]):
        return f"{found['slope']:.{digits}f} ({fit_quality(found)})"
    return f"{missing} ({fit_reason(found, low, dtype)})"


def order_fit(
    ds: xr.Dataset, norm: str = "l1inf", fit: str = "mean", upper: float = FIT_UPPER
) -> xr.Dataset:
    """The order of collapse per (variant, init) with its quality (:func:`slope_fit`).

    The slope of log r(l+1) against log r(l), r the mean relative residual over sequences,
    over consecutive pairs whose both ends lie in [the precision floor, upper].  Variables:
    ``order`` (NaN below quality), ``pairs``, ``stderr``, ``spread`` and ``reason`` (why the
    order is missing; "" where it is shown).
    """
    st = stats(ds, "relative_residual", norm, fit)
    low, dtype = floor(ds), str(ds.attrs.get("dtype", "float64"))
    shape = (st.sizes["variant"], st.sizes["init"])
    found = {key: np.full(shape, np.nan) for key in ("order", "stderr", "spread")}
    pairs = np.zeros(shape, np.int64)
    reasons = np.full(shape, "", dtype=object)
    for i, variant in enumerate(st.variant.values):
        for j, init in enumerate(st.init.values):
            m = st["mean"].sel(variant=variant, init=init).values.astype(float)
            one = slope_fit(m[:-1], m[1:], low, upper)
            found["order"][i, j], pairs[i, j] = one["slope"], one["pairs"]
            found["stderr"][i, j], found["spread"][i, j] = one["stderr"], one["spread"]
            reasons[i, j] = fit_reason(one, low, dtype, upper) or ""
    dims = ("variant", "init")
    return xr.Dataset(
        {
            **{key: (dims, value) for key, value in found.items()},
            "pairs": (dims, pairs),
            "reason": (dims, reasons.astype(str)),
        },
        coords={"variant": st.variant.values, "init": st.init.values},
        attrs={"norm": norm, "fit": fit, "floor": low, "upper": upper},
    )


def rate_fit(values: np.ndarray, relative: np.ndarray, low: float) -> dict:
    """The exponential rate per layer of ``values`` (mu(X_l), layer l = 0, 1, ...), with its
    quality: exp of the least-squares slope of log mu against l, over the layers whose
    ``relative`` distance to rank one (mu(X_l) / ||X_l||_F) is at or above ``low``, the
    precision floor (below it mu is the dtype's rounding, whatever its size).

    Returns "rate" (rho: mu(X_l) ~ C rho^l; NaN through fewer than MIN_RATE_LAYERS layers),
    "layers" (how many entered), "r2" (the fit's coefficient of determination in log mu; NaN
    where log mu does not vary) and "stderr" (the standard error of log rho)."""
    values, relative = np.asarray(values, float), np.asarray(relative, float)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(values) & (values > 0) & (relative >= low)
    layers = int(ok.sum())
    out = {"rate": np.nan, "layers": layers, "r2": np.nan, "stderr": np.nan}
    if layers < MIN_RATE_LAYERS:
        return out
    t, y = np.flatnonzero(ok).astype(float), np.log(values[ok])
    slope, out["stderr"] = line(t, y)
    out["rate"] = float(np.exp(slope))
    if np.ptp(y) > 0:  # a constant log mu: nothing for a line to explain
        fitted = y.mean() + slope * (t - t.mean())
        total = float(np.sum((y - y.mean()) ** 2))
        out["r2"] = 1.0 - float(np.sum((y - fitted) ** 2)) / total
    return out


def rate_text(found: dict, low: float, dtype: str, missing: str = "–") -> str:
    """A fitted rate for reading: "0.812 per layer (R² 0.998, 12 layers)", or ``missing``
    and why: "– (2 layers above the float64 floor 2.2e-15; 3 needed)"."""
    layers = int(found["layers"])
    if layers < 0:
        return f"{missing} (mu not measured)"
    if not np.isfinite(found["rate"]):
        plural = "s" * (layers != 1)
        return (
            f"{missing} ({layers} layer{plural} above the {dtype} floor {short(low)}; "
            f"{MIN_RATE_LAYERS} needed)"
        )
    r2 = f"R² {found['r2']:.3f}" if np.isfinite(found["r2"]) else "R² undefined: mu constant"
    return f"{found['rate']:.3g} per layer ({r2}, {layers} layers)"


def mu_rate(ds: xr.Dataset) -> xr.Dataset:
    """The exponential rate per layer of mu(X) per (variant, init), :func:`rate_fit` of
    mu's mean over sequences, the floor judged on the mean relative residual (fit mean,
    norm fro), which is mu / ||X||_F.  Variables ``rate``, ``r2``, ``stderr`` and ``layers``
    (-1 where the result holds no mu: one written before probe measured it)."""
    relative = stats(ds, "relative_residual", "fro", "mean")["mean"]
    low = floor(ds)
    shape = (relative.sizes["variant"], relative.sizes["init"])
    found = {key: np.full(shape, np.nan) for key in ("rate", "r2", "stderr")}
    layers = np.full(shape, -1, np.int64)
    if "mu" in ds:
        mean = stats(ds, "mu")["mean"]
        for i, variant in enumerate(relative.variant.values):
            for j, init in enumerate(relative.init.values):
                one = rate_fit(
                    mean.sel(variant=variant, init=init).values,
                    relative.sel(variant=variant, init=init).values,
                    low,
                )
                layers[i, j] = one.pop("layers")
                for key, value in one.items():
                    found[key][i, j] = value
    dims = ("variant", "init")
    return xr.Dataset(
        {**{key: (dims, value) for key, value in found.items()}, "layers": (dims, layers)},
        coords={"variant": relative.variant.values, "init": relative.init.values},
        attrs={"floor": low},
    )


def fit_order(
    ds: xr.Dataset, norm: str = "l1inf", fit: str = "mean", upper: float = FIT_UPPER
) -> xr.DataArray:
    """The order of collapse per (variant, init): :func:`order_fit`'s ``order``, NaN where
    the fit is below quality or has fewer than two pairs."""
    found = order_fit(ds, norm, fit, upper)
    return found["order"].assign_attrs(found.attrs).rename("order")


def point_order_text(at: xr.Dataset, variant: str, result: xr.Dataset, missing: str = "–") -> str:
    """One point's fitted order of ``variant`` for reading, with its quality or why it is
    missing (:func:`probe.fit_text`); ``at``: the point at one init, ``result``: the
    sweep (its precision floor and dtype)."""
    if variant not in at.variant.values:
        return missing
    one = at.sel(variant=variant)
    if "order_pairs" not in one:  # a result that holds no quality of its fits
        order = float(one["order"])
        return f"{order:.2f}" if np.isfinite(order) else missing
    found = {
        "slope": float(one["order"]),
        "pairs": int(one["order_pairs"]),
        "stderr": float(one["order_stderr"]),
        "spread": float(one["order_spread"]),
    }
    dtype = str(result.attrs.get("dtype", "float64"))
    return fit_text(found, floor(result), dtype, missing=missing)


def point_rate_text(at: xr.Dataset, variant: str, result: xr.Dataset, missing: str = "–") -> str:
    """One point's fitted rate of mu(X) for ``variant`` (:func:`rate_text`), read from a
    sweep's summaries; ``at``: the point at one init, ``result``: the sweep."""
    if variant not in at.variant.values or "mu_rate" not in at:
        return missing
    one = at.sel(variant=variant)
    layers = float(one["mu_rate_layers"])  # NaN at a point not finished
    if not np.isfinite(layers):
        return missing
    found = {"rate": float(one["mu_rate"]), "r2": float(one["mu_rate_r2"]), "layers": layers}
    dtype = str(result.attrs.get("dtype", "float64"))
    return rate_text(found, floor(result), dtype, missing=missing)


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
    data; "final_text" is it for reading, :func:`shown`), "final_layer", "order"
    (`fit_order`, None where missing) and "order_note" (the order's quality where it is
    shown, why it is missing where not: :func:`fit_quality`, :func:`fit_reason`).
    """
    st = stats(ds, "relative_residual", norm, fit)
    orders = order_fit(ds, norm, fit)
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
            one = orders.sel(variant=variant, init=init)
            order = float(one["order"])
            quality = {key: one[key].item() for key in ("pairs", "stderr")}
            out.setdefault(str(variant), {})[str(init)] = {
                "first_below": int(layers[below[0]]) if below.size else None,
                "final": float(m[last]),
                "final_text": shown(float(m[last]), ds),
                "final_layer": int(layers[last]),
                "order": order if np.isfinite(order) else None,
                "order_note": fit_quality(quality)
                if np.isfinite(order)
                else str(one["reason"].item()),
            }
    return out


def comparison_rows(
    datasets: Sequence[xr.Dataset], threshold: float = 1e-3, norm: str = "l1inf", fit: str = "mean"
) -> list[dict]:
    """One row per model and init for the table that opens a comparison.

    "final": {variant: mean r at the last layer}; "san_below": the first layer where the
    SAN's mean r is under ``threshold`` (None: never within the model's depth); "order":
    the SAN's fitted order of collapse (slope of log r(l+1) on log r(l), None where missing)
    and "order_note" its quality or why it is missing; "final_text": "final" for reading
    (:func:`shown`).
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
                    "final_text": {
                        v: found[v][init]["final_text"]
                        for v in VARIANTS
                        if init in found.get(v, {})
                    },
                    "san_below": san.get("first_below"),
                    "order": san.get("order"),
                    "order_note": san.get("order_note", ""),
                }
            )
    return rows
