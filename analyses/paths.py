"""Attention paths (Dong, Cordonnier & Loukas 2021, Section 2.2): one function per question.

* [`count`][probe.analyses.paths.count] — how many paths of each length an architecture
  has (no model);
* [`sample`][probe.analyses.paths.sample] — how close to rank one the attention product
  along a sampled path of depth d is, in a real forward pass;
* [`decompose`][probe.analyses.paths.decompose] — the exact contribution of each path
  length to the output of a real model's SAN+skip variant, with attention and LayerNorm
  scales frozen.

Each returns an xarray.Dataset; [`probe.save_result`][probe.files.results.save_result] writes it
and ``probe.reports.paths_report.render_paths`` renders it.
"""

from __future__ import annotations

from .path_count import count
from .path_decompose import decompose
from .path_sample import sample

__all__ = ["count", "decompose", "sample"]
