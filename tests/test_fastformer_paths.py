"""Attention paths on the Fastformer: its pooling matrices as the heads a path picks from.

A path picks, per layer, one of the H query-pooling or H key-pooling matrices
(2H choices); each is causal (lower triangular) and row-stochastic, so products
along a path are too.  The exact path-length decomposition is refused with the
reason (a Fastformer layer is multilinear, not affine, in its input).
"""

from __future__ import annotations

import pytest
import torch

import probe
from analyses.path_sample import chain
from probe.analyses import paths
from tests.fastformer_tiny import tiny_fastformer


def test_pooling_products_along_paths_are_causal_and_row_stochastic():
    probed = probe.wrap(tiny_fastformer())
    H = probed.adapter.n_heads(probed.config)
    assert probed.adapter.path_heads(probed.config) == 2 * H
    L = probed.n_layers
    ids = torch.randint(2, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    # Every layer through the last key-pooling head, and one path through query heads only.
    paths_ = [(tuple([2 * H - 1] * L), 0), (tuple([0] + [None] * (L - 1)), 1)]
    products = chain(probed, ids, mask, paths_)
    assert products.shape == (2, 9, 9)
    # float64 products of row-stochastic matrices: rows sum to 1 up to rounding.
    torch.testing.assert_close(products.sum(-1), torch.ones(2, 9, dtype=products.dtype))
    assert torch.equal(products, products.tril())  # causal: no token sees a later one


def test_sample_runs_and_decompose_is_refused(tmp_path):
    probed = probe.wrap(tiny_fastformer(dtype=torch.float32))
    ds = paths.sample(probed, init="pretrained", samples=3, sequences=2, tokens=8)
    assert ds.sizes["depth"] == probed.n_layers and ds.sizes["sample"] == 3
    with pytest.raises(probe.ProbeError, match="multilinear, not affine"):
        paths.decompose(probed, init="pretrained", sequences=2, tokens=8)
