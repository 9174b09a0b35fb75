"""The theory panel's numbers as variables of the result Dataset.

:func:`probe.measures.theory.panel` computes, per init, the constants of Dong, Cordonnier & Loukas
(2021) from the model's weights (Theorem 2.2's beta_l and c_l, Corollary 3.2's lambda_l),
the measured ||res(X_l)||_{1,inf} of SAN, SAN+MLP and SAN+skip, and the bounds run layer
by layer from the measured ||res(X_0)||.  :func:`variables` lays those out as Dataset
variables on the result's own ``init`` and ``layer`` coordinates, so that xarray can
select, align and save them like any other result (``ds.bound.sel(panel_variant="SAN")``),
and the report draws from them:

* ``panel_residual``, ``bound``, ``bound_ratio``, ``bound_vacuous``:
  (panel_variant, init, layer), over :data:`PANEL_VARIANTS`; the coordinate ``theorem``
  names the result that bounds each variant (Corollary 3.1 gives SAN+skip none: its
  bound is NaN);
* ``qk_norm``, ``vo_norm``, ``beta``, ``contraction``, ``lambda_mlp``: (init, layer), the
  constants of the layer that produces X_l (NaN at layer 0, the embeddings' output);
* ``heads``, ``d_qk``, ``activation_lipschitz``: (init,).

An init whose constants the family cannot give has NaN throughout (``heads`` included);
why is said, as every caveat of the panel, in the attributes ``theory_missing`` and
``theory_notes`` (one line each, newline-separated): strings about how the result was made.

Results written before these variables kept the same numbers as a JSON attribute,
``theory``; :func:`from_attribute` converts that form, through :func:`variables`, so a
report of an old file draws the same values (JSON keeps a float64 exactly).  Nothing here
imports torch: the report of a saved result does not need it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

#: The variants whose residuals the panel sets beside the bounds.
PANEL_VARIANTS = ("SAN", "SAN+MLP", "SAN+skip")
#: The result of the paper that bounds each (Corollary 3.1: skip connections, no bound).
THEOREMS = ("Theorem 2.2", "Corollary 3.2", "Corollary 3.1")
#: The attributes that carry the panel's lines of text.
MISSING, NOTES = "theory_missing", "theory_notes"

_BY_VARIANT = ("panel_variant", "init", "layer")
_BY_LAYER = ("init", "layer")
_LONG_NAMES = {
    "panel_residual": "measured ||res(X_l)||_{1,inf} (token-mean fit), median over the theory "
    "panel's sequences",
    "bound": "the paper's upper bound on ||res(X_l)||_{1,inf} (Theorem 2.2 for SAN, Corollary "
    "3.2 for SAN+MLP, gamma = 1), run layer by layer from the measured ||res(X_0)||, median "
    "over the panel's sequences; NaN where no theorem bounds the variant",
    "bound_ratio": "measured ||res(X_l)||_{1,inf} / bound, median over the panel's sequences",
    "bound_vacuous": "the bound is not below the median input residual ||res(X_0)|| (it "
    "certifies no decrease); False at layer 0 and where there is no bound",
    "qk_norm": "max over heads of ||W_QK,h||_1, W_QK,h = W_Q,h W_K,h^T",
    "vo_norm": "max over heads of ||W_h||_{1,inf}, W_h = W_V,h W_O,h",
    "beta": "Theorem 2.2's beta_l = max over heads of ||W_QK,h||_1 ||W_h||_{1,inf}",
    "contraction": "Theorem 2.2's c_l = 4 gamma beta_l H / sqrt(d_qk), gamma = 1: "
    "||res(X_l)|| <= c_l ||res(X_{l-1})||^3",
    "lambda_mlp": "Corollary 3.2's lambda_l, a Lipschitz constant of the MLP: "
    "lip(s) ||A_1||_{1,inf} ||A_2||_{1,inf}; NaN for a gated MLP (none exists)",
    "heads": "H, attention heads per layer",
    "d_qk": "d_qk, the width of a head's queries and keys",
    "activation_lipschitz": "lip(s), the largest slope of the MLP's activation on a grid of "
    "[-20, 20]",
}
#: Every variable of the panel.
VARIABLES = tuple(_LONG_NAMES)
#: panel()'s key of each per-layer constant.
_CONSTANTS = {
    "qk_norm": "qk",
    "vo_norm": "vo",
    "beta": "beta",
    "contraction": "c",
    "lambda_mlp": "lambda",
}
_SCALARS = {"heads": "heads", "d_qk": "d_qk", "activation_lipschitz": "lipschitz_activation"}


def variables(panels: Sequence[dict[str, Any]], layers: Sequence[int]) -> xr.Dataset:
    """The panels of :func:`probe.measures.theory.panel` (one per init, in the result's order) as a
    Dataset of the variables above on ``layers`` (the result's layer coordinate, 0..L)."""
    inits = [str(found["init"]) for found in panels]
    shape = (len(inits), len(layers))
    by_variant = {
        name: np.full((len(PANEL_VARIANTS), *shape), np.nan)
        for name in ("panel_residual", "bound", "bound_ratio")
    }
    vacuous = np.zeros((len(PANEL_VARIANTS), *shape), dtype=bool)
    constants = {name: np.full(shape, np.nan) for name in _CONSTANTS}
    scalars = {name: np.full(len(inits), np.nan) for name in _SCALARS}
    for i, found in enumerate(panels):
        for name, key in _CONSTANTS.items():
            if key in found:  # layer l's constants belong to X_l; X_0 has none
                constants[name][i, 1:] = found[key]
        for name, key in _SCALARS.items():
            if key in found:
                scalars[name][i] = found[key]
        for variant, values in found.get("measured", {}).items():
            by_variant["panel_residual"][PANEL_VARIANTS.index(variant), i] = values
        for bound in found.get("bounds", {}).values():
            v = PANEL_VARIANTS.index(bound["variant"])
            by_variant["bound"][v, i] = bound["bound"]
            by_variant["bound_ratio"][v, i] = bound["ratio"]
            vacuous[v, i] = [bool(flag) for flag in bound["vacuous"]]  # None (layer 0): False
    data = {
        **{name: (_BY_VARIANT, values) for name, values in by_variant.items()},
        "bound_vacuous": (_BY_VARIANT, vacuous),
        **{name: (_BY_LAYER, values) for name, values in constants.items()},
        **{name: (("init",), values) for name, values in scalars.items()},
    }
    ds = xr.Dataset(
        data,
        coords={
            "panel_variant": list(PANEL_VARIANTS),
            "theorem": ("panel_variant", list(THEOREMS)),
            "init": inits,
            "layer": np.asarray(layers),
        },
    )
    for name, long_name in _LONG_NAMES.items():
        ds[name].attrs = {"long_name": long_name, "units": "1"}
    ds.attrs = {
        MISSING: _lines(line for found in panels for line in found.get("missing", [])),
        NOTES: _lines(line for found in panels for line in found.get("notes", [])),
    }
    return ds


def empty(inits: Sequence[str], layers: Sequence[int]) -> xr.Dataset:
    """The variables with nothing measured (NaN; no bound is vacuous): a streamed result's
    placeholders, which :meth:`probe.files.stream.SequenceWriter.fill` overwrites at the end."""
    return variables([{"init": init} for init in inits], layers)


def _lines(lines) -> str:
    return "\n".join(dict.fromkeys(lines))


def lines(ds: xr.Dataset, name: str) -> list[str]:
    """The lines of the attribute ``name`` (:data:`MISSING` or :data:`NOTES`)."""
    return [line for line in str(ds.attrs.get(name, "")).split("\n") if line]


def from_attribute(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with the theory panel as variables, converted from the JSON attribute
    ``theory`` that results written before the variables kept it in; unchanged otherwise."""
    raw = ds.attrs.get("theory")
    if "beta" in ds.data_vars or not raw:
        return ds
    panel = variables(json.loads(raw), ds["layer"].values)
    out = ds.assign(panel.data_vars)
    out.attrs = {k: v for k, v in ds.attrs.items() if k != "theory"} | panel.attrs
    return out
