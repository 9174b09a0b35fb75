"""Synthetic "collapse" datasets shaped like the ones `probe collapse` writes.

The numbers follow the paper's story so figures and reports look realistic:
pure attention (SAN) contracts cubically per layer, r_{l+1} = c * r_l**3, so it
collapses doubly exponentially until it hits the dtype's floor; SAN+MLP does
the same with a weaker constant; SAN+skip decays only geometrically and the
full transformer hovers around 0.6. Each sequence gets its own start and a
little multiplicative noise per layer.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from probe.models import ADAPTERS
from probe.names import FITS, INITS, NORMS, VARIANTS

# Different norms measure the same residual at slightly different scales.
_NORM_SCALE = {"l1inf": 1.0, "fro": 0.95, "spectral": 0.9, "l1": 1.05, "linf": 1.02}
# The best rank-one fit always leaves at most the residual to the mean.
_FIT_SCALE = {"mean": 1.0, "svd": 0.85}

# The ablation table a real BERT result carries (the adapter's own rows, never a paraphrase).
ABLATIONS = [dict(row) for row in ADAPTERS["bert"].table]


def _step(variant: str, r: np.ndarray, pretrained: bool) -> np.ndarray:
    """One layer of the idealised dynamics for a variant."""
    if variant == "SAN":
        return (1.2 if pretrained else 1.6) * r**3
    if variant == "SAN+MLP":
        return 2.2 * r**3
    if variant == "SAN+skip":
        return 0.9 * r
    return 0.6 + 0.5 * (r - 0.6)


def make_collapse_dataset(
    model: str = "tiny-bert",
    family: str = "bert",
    layers: int = 4,
    sequences: int = 5,
    inits: tuple[str, ...] = INITS,
    variants: tuple[str, ...] = VARIANTS,
    dtype: str = "float64",
    seed: int = 0,
    missing: tuple[tuple[str, str], ...] = (),
    created: str = "2025-01-02T03:04:05Z",
) -> xr.Dataset:
    """A realistic synthetic collapse dataset; `missing` lists (variant, init) left NaN."""
    rng = np.random.default_rng(seed)
    eps = float(np.finfo(dtype).eps)
    nv, ni, nl = len(variants), len(inits), layers + 1

    base = np.empty((nv, ni, nl, sequences))
    for i, variant in enumerate(variants):
        for j, init in enumerate(inits):
            # Start below 0.67, the unstable fixed point of 2.2 r^3, so SAN+MLP contracts.
            r = np.clip(0.55 * np.exp(0.08 * rng.standard_normal(sequences)), 0.3, 0.62)
            for layer in range(nl):
                base[i, j, layer] = r
                noise = np.exp(0.05 * rng.standard_normal(sequences))
                r = np.clip(_step(variant, r, init == "pretrained") * noise, eps, 1.0)

    scale = np.array([[_FIT_SCALE[f] * _NORM_SCALE[n] for n in NORMS] for f in FITS])
    relative = np.clip(base[..., None, None] * scale, eps, 1.0)
    for variant, init in missing:
        i, j = variants.index(variant), inits.index(init)
        relative[i, j] = np.nan
        base[i, j] = np.nan

    hidden, tokens = 32, 16
    dims4 = ("variant", "init", "layer", "sequence")
    config = {"model_type": family, "num_hidden_layers": layers, "hidden_size": hidden}
    ds = xr.Dataset(
        {
            "relative_residual": (dims4 + ("fit", "norm"), relative),
            "effective_rank": (dims4, 1.0 + (min(tokens, hidden) - 1) * base),
            "stable_rank": (dims4, 1.0 + 8.0 * base**2),
            "cosine_similarity": (dims4, 1.0 - base**2),
        },
        coords={
            "variant": list(variants),
            "init": list(inits),
            "layer": np.arange(nl),
            "sequence": np.arange(sequences),
            "fit": list(FITS),
            "norm": list(NORMS),
        },
    )
    ds.attrs = {
        "analysis": "collapse",
        "model": model,
        "family": family,
        "config": json.dumps(config),
        "weights": "synthetic",
        "inputs": "synthetic ids",
        "text_source": "none",
        "text_sha256": "0" * 64,
        "sequences": sequences,
        "tokens": tokens,
        "seed": seed,
        "dtype": dtype,
        "device": "cpu",
        "probe_version": "0.1.0",
        "torch_version": "2.5.0",
        "transformers_version": "5.0.0",
        "nnsight_version": "0.8.0",
        "command": f"probe collapse {model} --init {inits[0] if len(inits) == 1 else 'both'}",
        "created": created,
        "surgery": "probe",
        "ablation_table": json.dumps(ABLATIONS),
        "n_layers": layers,
        "n_heads": 2,
        "hidden_size": hidden,
        "settings_id": f"{seed:08x}",
    }
    return ds
