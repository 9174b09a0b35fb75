"""How many attention paths of each length an architecture has (Dong et al. 2021, Section 2.2).

With skip connections an L-layer network with H heads per layer is a sum of
(H+1)^L paths; a path of length k goes through a head in k of the L layers and
through the skip connection in the others, so

    N_k = C(L, k) H^k,     sum_k N_k = (H+1)^L,     share_k = N_k / (H+1)^L,

a binomial distribution with mean length L H / (H+1): almost every path is
long, which is why the paper's finding that the output is carried by short
paths is a statement about the *weights*, not about the counts.

Counts are exact Python integers.  netCDF cannot hold integers of 191 digits
(GPT-3's 97^96), so the Dataset stores each count as its decimal string
(``count``, ``total``) beside float shares and log10 counts; ``int(ds.count[i, k])``
gives the exact number back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from probe.errors import ProbeError
from probe.files.results import command_line, utc_now, versions
from probe.measures.path_vocabulary import MAX_SHAPE, count_by_length, total_paths

from .path_presets import Preset, all_presets


def count(
    model: str | Path | None = None,
    *,
    layers: int | None = None,
    heads: int | None = None,
    presets: Sequence[Preset] | None = None,
    command: str | None = None,
) -> xr.Dataset:
    """Path counts per length for one shape, one model's config, or the presets.

    Parameters
    ----------
    model
        Reads the shape from its config: a bundled config name, `minilm`, a local folder,
        a hub id in the local cache, or a loaded model.  Not with `layers` and `heads`.
    layers
        L, with `heads`: one shape.
    heads
        H, with `layers`.
    presets
        The shapes counted when neither a model nor a shape is given; None: every preset.
    command
        The "reproduce with" line the result records; None: this process's command line.

    Returns
    -------
    xarray.Dataset
        Per architecture and path length: `share`, `cumulative_share`, `log10_count` and
        the exact `count` as a decimal string; per architecture `total` (a string) and
        `mean_length`.

    Raises
    ------
    ProbeError
        Only one of `layers` and `heads`, or them with a model; a count below 1; a shape
        beyond the exact counts' limit; a model whose config cannot be read.
    """
    if (layers is None) != (heads is None):
        raise ProbeError("give `layers` and `heads` together")
    if layers is not None and model is not None:
        raise ProbeError("give either a model or `layers`/`heads`, not both")
    if layers is not None:
        if layers < 1 or heads < 1:
            raise ProbeError(f"need `layers` >= 1 and `heads` >= 1, got {layers} and {heads}")
        rows = [
            Preset(f"L={layers}, H={heads}", layers, heads, "given", "layers and heads as given")
        ]
    elif model is not None:
        rows = [model_shape(model)]
    else:
        rows = list(all_presets() if presets is None else presets)
    for row in rows:
        if row.layers > MAX_SHAPE or row.heads > MAX_SHAPE:
            raise ProbeError(
                f"{row.name}: L={row.layers}, H={row.heads}; probe counts paths exactly up to "
                f"L and H of {MAX_SHAPE} (beyond, each count has millions of digits)"
            )
    return _dataset(rows, command)


def table(layers: int, heads: int) -> list[dict[str, object]]:
    """Per length k: the exact count, its share and the share of paths up to length k."""
    counts = count_by_length(layers, heads)
    total = total_paths(layers, heads)
    rows, running = [], 0
    for k, n in enumerate(counts):
        running += n
        # int / int is correctly rounded in Python, however large the integers.
        rows.append(
            {"path_length": k, "count": n, "share": n / total, "cumulative": running / total}
        )
    return rows


def mean_length(layers: int, heads: int) -> float:
    return layers * heads / (heads + 1)


def model_shape(model) -> Preset:
    """(L, H) from a model's config, offline where the config ships with probe.

    A name resolves as in every other command (:func:`probe.loading.read_config`): ``minilm``,
    the shipped checkpoints, local folders, bundled configs, then the local hub cache.
    """
    from probe.loading import check_config, read_config
    from probe.models import adapter_for

    config = getattr(model, "config", None)
    name = getattr(model, "name", None) or type(model).__name__
    if config is None:
        name = str(model)
        try:
            config, source = read_config(name, prefer_bundled=True)
        except ProbeError as err:
            raise ProbeError(f"{err}; or give `layers` L `heads` H") from None
    else:
        source = "the loaded model's config"
    adapter = adapter_for(getattr(config, "model_type", None) or "unknown")
    adapter.check(config)
    if source != "the loaded model's config":
        check_config(name, config, adapter)  # what collapse refuses, count refuses too
    return Preset(name, adapter.n_layers(config), adapter.n_heads(config), "model", source)


def _dataset(rows: Sequence[Preset], command: str | None) -> xr.Dataset:
    longest = max(row.layers for row in rows)
    k = np.arange(longest + 1)
    shape = (len(rows), longest + 1)
    share = np.full(shape, np.nan)
    cumulative = np.full(shape, np.nan)
    log10_count = np.full(shape, np.nan)
    counts = np.full(shape, "", dtype=object)  # exact decimal strings; "" past L
    for i, row in enumerate(rows):
        for entry in table(row.layers, row.heads):
            j = entry["path_length"]
            share[i, j] = entry["share"]
            cumulative[i, j] = entry["cumulative"]
            log10_count[i, j] = math.log10(entry["count"])  # exact for big ints too
            counts[i, j] = str(entry["count"])
    dims = ("architecture", "path_length")
    ds = xr.Dataset(
        {
            "share": (dims, share),
            "cumulative_share": (dims, cumulative),
            "log10_count": (dims, log10_count),
            "count": (dims, counts.astype(str)),
            "total": (("architecture",), [str(total_paths(r.layers, r.heads)) for r in rows]),
            "log10_total": (
                ("architecture",),
                [r.layers * math.log10(r.heads + 1) for r in rows],
            ),
            "mean_length": (("architecture",), [mean_length(r.layers, r.heads) for r in rows]),
        },
        coords={
            "architecture": [r.name for r in rows],
            "path_length": k,
            "layers": (("architecture",), [r.layers for r in rows]),
            "heads": (("architecture",), [r.heads for r in rows]),
            "group": (("architecture",), [r.group for r in rows]),
            "source": (("architecture",), [r.source for r in rows]),
        },
    )
    ds["share"].attrs["long_name"] = "share of paths C(L,k) H^k / (H+1)^L"
    ds["cumulative_share"].attrs["long_name"] = "share of paths of length <= k"
    ds["count"].attrs["long_name"] = "number of paths C(L,k) H^k, exact decimal string"
    ds["total"].attrs["long_name"] = "number of paths (H+1)^L, exact decimal string"
    ds["mean_length"].attrs["long_name"] = "mean path length L H / (H+1)"
    ds.attrs = {
        "analysis": "paths-count",
        "model": rows[0].name if len(rows) == 1 else "presets",
        "family": "",
        **versions(),
        "command": command or command_line(),
        "created": utc_now(),
    }
    return ds


def exact_counts(ds: xr.Dataset, architecture: str) -> list[int]:
    """The exact counts of one architecture back from a Dataset (strings -> ints)."""
    row = ds["count"].sel(architecture=architecture).values
    return [int(value) for value in row if str(value)]
