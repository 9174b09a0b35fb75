"""Dense eigensolves: the top eigenvector by inverse iteration, and every singular value.

``top_vector``: the eigenvector of lambda_1 of a k x k Gram matrix by inverse iteration,
shifted just past lambda_1 (one LU factorisation, three solves reach rounding where the gap is
1e-4 lambda_1 or more).

``all_singular_values`` (the exact effective rank): the eigenvalues lambda_i of X's Gram
matrix G (eigvalsh: a tridiagonalisation, no eigenvectors).  sqrt(lambda_i) has relative
error ~eps lambda_1 / lambda_i: fine (<= ~1e-10) where every nonzero lambda_i >= RESOLVED
lambda_1 = 1e-6 lambda_1 (a sequence with n real tokens has at most n nonzero ones).
Elsewhere (rank deficiency) those sequences get s_i = ||X^T w_i|| over G's eigenvectors,
whose error is eps s_1 plus the square of the eigenvector error; and a nearly collapsed X
(s_2 < DEFLATE s_1 = 1e-2 s_1) takes s_2.. from the explicit R_1 = P X by the same method on
R_1's own Gram matrix: eps s_2 rather than eps s_1.  Relative error <= 1e-8 in the effective
rank against the SVD reference (tests/test_linalg.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .batch import fix_rows, take_rows
from .gram import gram
from .lapack import eigvalsh, lapack

# Exact effective rank: deflate (see all_singular_values) where s_2 / s_1 < DEFLATE: then
# lambda_2 / lambda_1 < 1e-4, and a trailing eigenvector mixed by rounding (eps lambda_1 / gap)
# could move s_2 by more than the 1e-10 relative accuracy asked for.
DEFLATE = 1e-2
# Below this lambda_i / lambda_1, sqrt(lambda_i) is not accurate enough for the effective rank.
RESOLVED = 1e-6


def top_vector(G: Tensor, lam1: Tensor, steps: int = 3) -> Tensor:
    """The eigenvector of lambda_1 by inverse iteration, shifted just past lambda_1.

    (G - sigma I)^-1 multiplies the lambda_1 component by 1 / (sigma - lambda_1) = 1e12 /
    lambda_1 and every other by at most 1 / (lambda_1 - lambda_2): with a gap of 1e-4
    lambda_1 each step shrinks the rest by 1e-8, so three steps reach rounding.  One LU
    factorisation serves all steps.
    """
    k = G.shape[-1]
    shift = torch.where(lam1 > 0, lam1 * (1 + 1e-12), 1.0)  # an all-zero G: any vector
    shifted = G.clone()
    shifted.diagonal(dim1=-2, dim2=-1).sub_(shift[:, None])
    if G.device.type == "cpu":  # one matrix at a time: see _valid
        factors = [torch.linalg.lu_factor(matrix) for matrix in shifted]
        LU = torch.stack([lu for lu, _ in factors])
        pivots = torch.stack([p for _, p in factors])
    else:
        LU, pivots = torch.linalg.lu_factor(shifted)
    if G.device.type == "cpu" and not _valid(pivots):
        return _top_by_eigh(G)
    # A fixed start with a component along every direction (all ones would miss a u_1 that
    # is orthogonal to it).
    start = 1.0 + 0.5 * torch.cos(torch.arange(k, dtype=G.dtype, device=G.device) * 2.3)
    x = start.expand(G.shape[0], k)[..., None]
    for _ in range(steps):
        x = torch.linalg.lu_solve(LU, pivots, x)
        x = x / torch.linalg.vector_norm(x, dim=-2, keepdim=True)
    return x[..., 0]


def _valid(pivots: Tensor) -> bool:
    """Are these LAPACK pivots possible (row i swapped with a row i..k)?

    MKL's batched LU in torch's CPU build (torch 2.13, oneMKL 2024.2) breaks after any call of
    torch.set_num_threads ("Parameter 6 was incorrect on entry to DLASWP"), reproduced
    outside probe: on an AMD EPYC it returned pivots of 0, on an Intel Xeon with AVX-512 it
    never returned.  The single-matrix LU, the symmetric eigensolvers, Cholesky and matmuls
    are unaffected.  probe never calls set_num_threads (probe.linalg.lapack.serial_threads)
    and factors each matrix on its own on a CPU; a user may call it, so the pivots are still
    checked."""
    k = pivots.shape[-1]
    first = torch.arange(1, k + 1, dtype=pivots.dtype, device=pivots.device)
    return bool(((pivots >= first) & (pivots <= k)).all())


def _top_by_eigh(G: Tensor) -> Tensor:
    """The eigenvector of lambda_1 from the full symmetric eigendecomposition: where the LU of
    the inverse iteration cannot be trusted.  Accurate to eps ||G|| / gap, as the iteration."""
    [(_, vectors)] = lapack(torch.linalg.eigh, G)
    return vectors[..., -1]


def _accurate(A: Tensor, G: Tensor, count: int, wide: bool) -> Tensor:
    """The top ``count`` singular values of A as ||A^T w_i|| over G's eigenvectors."""
    [(_, W)] = lapack(torch.linalg.eigh, G)
    return _row_norms(A, W.flip(-1)[..., :count], wide)


def _known_rows(
    known: tuple[Tensor, Tensor, Tensor] | None, index: Tensor
) -> tuple[Tensor, Tensor] | None:
    """The Gram matrices and eigenvalues of rows ``index`` out of ``known`` = (rows, Gram
    matrices, eigenvalues), where it holds every one of them (both row lists ascending)."""
    if known is None:
        return None
    rows, grams, values = known
    where = torch.searchsorted(rows, index).clamp(max=len(rows) - 1)
    if not torch.equal(rows[where], index):
        return None
    return grams[where], values[where]


def _spectrum(
    A: Tensor, G: Tensor, count: int, wide: bool, full: bool, lam: Tensor | None = None
) -> Tensor:
    """Top ``count`` singular values of A (Gram matrix G, eigenvalues ``lam`` descending where
    known), as in all_singular_values."""
    lam = (eigvalsh(G)[0] if lam is None else lam)[..., :count]
    S = lam.clamp(min=0.0).sqrt()
    if full and count > 1:
        S = fix_rows(
            lam[..., -1] < RESOLVED * lam[..., 0],
            S,
            lambda index: _accurate(take_rows(A, index), take_rows(G, index), count, wide),
        )
    return S


def _row_norms(A: Tensor, W: Tensor, wide: bool) -> Tensor:
    """||A^T w|| (wide) or ||A w|| for each column w of W: singular values of A (see above)."""
    if wide:
        return torch.linalg.vector_norm(W.mT @ A, dim=-1)
    return torch.linalg.vector_norm(A @ W, dim=-2)


def all_singular_values(
    Xm: Tensor,
    G: Tensor,
    s1: Tensor,
    R1: Tensor,
    rank: Tensor,
    wide: bool,
    lam: Tensor | None = None,
    r1: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """All k singular values of X, descending (the exact effective rank; module docstring).

    s_1 is the Rayleigh quotient from u_1.  The others are sqrt(lambda_i) where every nonzero
    lambda_i (i <= rank bound) is >= RESOLVED * lambda_1; elsewhere ||X^T w_i|| over the
    eigenvectors of G.  Where s_2 < DEFLATE * s_1 they are the singular values of the explicit
    R_1 instead, by the same method on R_1's Gram matrix.  ``lam``: G's eigenvalues,
    descending, where they are known already; ``r1``: (rows, R_1's Gram matrices, their
    eigenvalues) where those are known already.
    """
    lam = eigvalsh(G)[0] if lam is None else lam
    k = lam.shape[-1]
    if k == 1:
        return s1[:, None]
    S = torch.cat([s1[:, None], lam[..., 1:].clamp(min=0.0).sqrt()], dim=-1)
    lam1 = lam[..., 0]
    deflate = (lam[..., 1] < DEFLATE**2 * lam1) & (lam1 > 0)
    smallest = lam.gather(-1, (rank - 1)[:, None])[:, 0]
    S = fix_rows(
        (smallest < RESOLVED * lam1) & ~deflate,
        S,
        lambda index: _accurate(take_rows(Xm, index), take_rows(G, index), k, wide),
    )

    def deflated(index):
        rest = take_rows(R1, index)
        known = _known_rows(r1, index)
        G1, lam1 = known if known is not None else (gram(rest, wide), None)
        # R_1's Gram matrix has one more null direction (u_1): its top k - 1 values.
        values = _spectrum(rest, G1, k - 1, wide, True, lam1)
        return torch.cat([take_rows(S, index)[:, :1], values], dim=-1)

    S = fix_rows(deflate, S, deflated)
    # past the rank bound the values are zero (rounding aside)
    S = torch.where(torch.arange(k, device=S.device) < rank[:, None], S, 0.0)
    return torch.sort(S, dim=-1, descending=True).values
