"""Matrix norms of batches of token matrices, rows = tokens, in float64.

``matrix_norm`` (re-exported by ``probe.measures.metrics``) is one norm of a batch; ``l1_linf`` and
``norm_table`` are what the collapse metrics build their residual tables from: the l1 and
linf norms in one pass, and every norm of ``probe.names.NORMS`` stacked in that order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probe.linalg.batch import frobenius
from probe.measures.metrics_input import check_name
from probe.names import NORMS

_F64 = torch.float64


def _tall(A: Tensor) -> Tensor:
    # LAPACK's divide-and-conquer SVD is 2-3x faster on tall matrices than on wide ones;
    # singular values are transpose-invariant.
    return A if A.shape[-2] >= A.shape[-1] else A.mT


def _l1(A: Tensor) -> Tensor:
    return A.abs().sum(-2).amax(-1)


def _linf(A: Tensor) -> Tensor:
    return A.abs().sum(-1).amax(-1)


def l1_linf(A: Tensor, scratch: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(l1, linf) of a batch, from one pass of |A| (into ``scratch`` where given)."""
    absolute = torch.abs(A, out=scratch)  # one pass shared by both sums
    return absolute.sum(-2).amax(-1), absolute.sum(-1).amax(-1)


def norm_table(l1: Tensor, linf: Tensor, fro: Tensor, spectral: Tensor) -> Tensor:
    """The norms of probe.names.NORMS stacked in its order (..., len(NORMS)); l1inf from l1
    and linf."""
    values = {
        "l1inf": torch.sqrt(l1 * linf),
        "fro": fro,
        "spectral": spectral,
        "l1": l1,
        "linf": linf,
    }
    return torch.stack([values[name] for name in NORMS], dim=-1)


def matrix_norm(A: Tensor, norm: str) -> Tensor:
    """Matrix norm of a batch A (..., token, hidden) with rows = tokens, in float64.

    Parameters
    ----------
    A
        (..., token, hidden), at least one row and one column.
    norm
        `"l1"`: largest absolute column sum; `"linf"`: largest absolute row sum; `"l1inf"`:
        sqrt(l1 * linf), the composite norm of Dong et al. (2021); `"fro"`: Frobenius;
        `"spectral"`: largest singular value.

    Returns
    -------
    Tensor
        float64, of shape A.shape[:-2].

    Raises
    ------
    ValueError
        An unknown norm, or A not a batch of matrices.
    """
    check_name(norm, NORMS, "norm")
    if A.ndim < 2:
        raise ValueError(f"A must have at least 2 dimensions (..., token, hidden), got {A.ndim}")
    if A.shape[-2] == 0 or A.shape[-1] == 0:
        raise ValueError(f"A must have at least one row and column, got shape {tuple(A.shape)}")
    A = A.to(_F64)
    if norm == "spectral":
        return torch.linalg.svdvals(_tall(A))[..., 0]
    if norm == "fro":
        return frobenius(A)
    l1, linf = _l1(A), _linf(A)
    return {"l1": l1, "linf": linf, "l1inf": torch.sqrt(l1 * linf)}[norm]
