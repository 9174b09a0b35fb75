"""Rank-collapse metrics for batches of token representations.

Dong, Cordonnier & Loukas (2021), "Attention is not all you need: pure attention loses rank
doubly exponentially with depth" (ICML, arXiv:2103.03404), measure how far a layer's output
X (token x hidden) is from a matrix whose rows are all equal -- a "collapsed" representation.
Their residual is

    res(X) = X - 1 x^T,

where x is a single token vector shared by all rows.  The paper defines x as the minimiser of
the residual norm; its accompanying notebook uses the mean of the tokens, which we follow for
``fit="mean"``.  ``fit="svd"`` instead removes the best rank-one approximation
sigma_1 u_1 v_1^T of X (Eckart-Young), a lower bound on any rank-one residual.  The residual is
reported relative to X in one of several matrix norms; the paper's is the composite norm

    ||X||_{1,inf} = sqrt(||X||_1 ||X||_inf),

with ||X||_1 the largest absolute column sum and ||X||_inf the largest absolute row sum.

Complementary, fit-free measures of collapse, all computed from the singular values s_i of X:

* effective rank (Roy & Vetterli 2007, "The effective rank: a measure of effective
  dimensionality", EUSIPCO): exp(-sum_i p_i log p_i) with p_i = s_i / sum_j s_j, 0 log 0 = 0;
* stable rank (Rudelson & Vershynin 2007): sum_i s_i^2 / s_1^2 = ||X||_F^2 / ||X||_2^2.

And token uniformity, the mean cosine similarity over distinct pairs of tokens, which tends to 1
as the representation collapses.

Conventions.  X is (sequence, token, hidden) of any real dtype and device; ``mask`` is a bool
(sequence, token) tensor marking real tokens (None: all real).  Padded tokens may sit anywhere in
a row and may hold any value, NaN included: they are replaced by zero rows first, which change
neither column sums, row-sum maxima, the Frobenius norm, cosine sums nor nonzero singular
values, so the batch is processed at once while means, fits and counts use real tokens only.
Everything is computed in float64; per-sequence results are float64 (sequence,) tensors on X's
device.  Degenerate inputs:

* a sequence with fewer than 2 real tokens raises ValueError (no pairs, trivial residual);
* real tokens holding NaN or inf raise ValueError;
* a sequence whose real tokens are all exactly zero gives NaN relative residuals (0/0) and NaN
  effective and stable ranks (no singular-value distribution);
* a token with zero norm has cosine 0 with every other token (so an all-zero sequence has
  token uniformity 0);
* when s_1 = s_2 the best rank-one fit is not unique; ``fit="svd"`` then uses whichever top
  singular pair LAPACK returns (its Frobenius and spectral residuals are unaffected).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .names import FITS, NORMS

_F64 = torch.float64


def _check_name(name: str, valid: tuple[str, ...], what: str) -> None:
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid {what}s: {', '.join(valid)}")


def _tall(A: Tensor) -> tuple[Tensor, bool]:
    # LAPACK's divide-and-conquer SVD is 2-3x faster on tall matrices than on wide ones
    # (measured on 128 x 768 hidden states); singular values are transpose-invariant.
    if A.shape[-2] >= A.shape[-1]:
        return A, False
    return A.mT, True


def _svdvals(A: Tensor) -> Tensor:
    return torch.linalg.svdvals(_tall(A)[0])


def _svd_top(A: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """All singular values (..., k), top left (..., token) and right (..., hidden) vectors."""
    B, transposed = _tall(A)
    U, S, Vh = torch.linalg.svd(B, full_matrices=False)
    if transposed:  # A = B^T = Vh^T S U^T, so the roles of U and Vh swap
        return S, Vh[..., 0, :], U[..., :, 0]
    return S, U[..., :, 0], Vh[..., 0, :]


def _l1(A: Tensor) -> Tensor:
    return A.abs().sum(-2).amax(-1)


def _linf(A: Tensor) -> Tensor:
    return A.abs().sum(-1).amax(-1)


def _fro(A: Tensor) -> Tensor:
    return torch.linalg.vector_norm(A, dim=(-2, -1))


def _norm_table(A: Tensor, spectral: Tensor) -> Tensor:
    """All NORMS of A (..., token, hidden) as (..., len(NORMS)); spectral is precomputed."""
    l1, linf = _l1(A), _linf(A)
    values = {
        "l1inf": torch.sqrt(l1 * linf),
        "fro": _fro(A),
        "spectral": spectral,
        "l1": l1,
        "linf": linf,
    }
    return torch.stack([values[name] for name in NORMS], dim=-1)


def matrix_norm(A: Tensor, norm: str) -> Tensor:
    """Matrix norm of a batch A (..., token, hidden) with rows = tokens, in float64.

    ``"l1"``: largest absolute column sum; ``"linf"``: largest absolute row sum; ``"l1inf"``:
    sqrt(l1 * linf), the composite norm of Dong et al. (2021); ``"fro"``: Frobenius;
    ``"spectral"``: largest singular value.  Returns a float64 tensor of shape A.shape[:-2].
    """
    _check_name(norm, NORMS, "norm")
    if A.ndim < 2:
        raise ValueError(f"A must have at least 2 dimensions (..., token, hidden), got {A.ndim}")
    if A.shape[-2] == 0 or A.shape[-1] == 0:
        raise ValueError(f"A must have at least one row and column, got shape {tuple(A.shape)}")
    A = A.to(_F64)
    if norm == "spectral":
        return _svdvals(A)[..., 0]
    if norm == "fro":
        return _fro(A)
    l1, linf = _l1(A), _linf(A)
    return {"l1": l1, "linf": linf, "l1inf": torch.sqrt(l1 * linf)}[norm]


def _prepare(X: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Validate; return X in float64 with padded rows zeroed, the mask, and real-token counts."""
    if X.ndim != 3:
        raise ValueError(
            f"X must be a 3-D tensor (sequence, token, hidden), got shape {tuple(X.shape)}"
        )
    if X.is_complex():
        raise ValueError(f"X must be real, got dtype {X.dtype}")
    if X.shape[-1] == 0:
        raise ValueError("X must have at least one hidden feature")
    if mask is None:
        mask = torch.ones(X.shape[:2], dtype=torch.bool, device=X.device)
    else:
        if mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
        if mask.shape != X.shape[:2]:
            raise ValueError(
                f"mask must have shape (sequence, token) = {tuple(X.shape[:2])}, "
                f"got {tuple(mask.shape)}"
            )
        mask = mask.to(X.device)
    counts = mask.sum(-1)
    bad = torch.nonzero(counts < 2).flatten().tolist()
    if bad:
        detail = ", ".join(f"sequence {i} has {int(counts[i])}" for i in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(f"every sequence needs at least 2 real tokens; {detail}{more}")
    # torch.where rather than multiplying by the mask: padding may hold NaN or inf.
    Xm = torch.where(mask[..., None], X.to(_F64), 0.0)
    if not bool(torch.isfinite(Xm).all()):
        raise ValueError("X has non-finite values (NaN or inf) in real (unmasked) tokens")
    return Xm, mask, counts.to(_F64)


def _rescale(Xm: Tensor) -> Tensor:
    # Every metric except residual() is scale-invariant.  Scaling each sequence by a power of
    # two (exact in floating point) keeps squared entries clear of float64 under/overflow.
    _, exponent = torch.frexp(Xm.abs().amax(dim=(-2, -1), keepdim=True))
    return torch.ldexp(Xm, -exponent.clamp(min=-1021).to(_F64))


def _mean_residual(Xm: Tensor, mask: Tensor, counts: Tensor) -> Tensor:
    mean = Xm.sum(-2, keepdim=True) / counts[:, None, None]  # (sequence, 1, hidden)
    return torch.where(mask[..., None], Xm - mean, 0.0)


def _svd_residual(Xm: Tensor, mask: Tensor, S: Tensor, u1: Tensor, v1: Tensor) -> Tensor:
    rank_one = S[:, 0, None, None] * u1[:, :, None] * v1[:, None, :]  # (sequence, token, hidden)
    # u1 vanishes on zero (padded) rows only up to rounding; make it exact.
    return torch.where(mask[..., None], Xm - rank_one, 0.0)


def _residual(Xm: Tensor, mask: Tensor, counts: Tensor, fit: str) -> Tensor:
    if fit == "mean":
        return _mean_residual(Xm, mask, counts)
    return _svd_residual(Xm, mask, *_svd_top(Xm))


def residual(X: Tensor, mask: Tensor | None = None, fit: str = "mean") -> Tensor:
    """res(X) = X - 1 x^T per sequence, float64, same shape as X, padded rows zero.

    ``fit="mean"``: x is the mean of the real tokens.  ``fit="svd"``: the subtracted matrix is
    the best rank-one approximation sigma_1 u_1 v_1^T of the real-token matrix (not unique when
    sigma_1 = sigma_2; see the module docstring).  Raises ValueError on invalid shapes, unknown
    fit, fewer than 2 real tokens in a sequence, or non-finite real tokens.
    """
    _check_name(fit, FITS, "fit")
    Xm, mask, counts = _prepare(X, mask)
    return _residual(Xm, mask, counts, fit)


def relative_residual(
    X: Tensor, mask: Tensor | None = None, norm: str = "l1inf", fit: str = "mean"
) -> Tensor:
    """||res(X)|| / ||X|| per sequence, both on real tokens, shape (sequence,), float64.

    0 means fully collapsed (all tokens equal for ``fit="mean"``, rank one for ``fit="svd"``).
    NaN (0/0) for a sequence whose real tokens are all zero.
    """
    _check_name(norm, NORMS, "norm")
    _check_name(fit, FITS, "fit")
    Xm, mask, counts = _prepare(X, mask)
    Xm = _rescale(Xm)
    return matrix_norm(_residual(Xm, mask, counts, fit), norm) / matrix_norm(Xm, norm)


def _effective_rank(S: Tensor) -> Tensor:
    # An all-zero sequence gives p = 0/0 = NaN, which propagates: the convention we want.
    p = S / S.sum(-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(-1))  # xlogy(0, 0) = 0


def _stable_rank(S: Tensor) -> Tensor:
    return (S * S).sum(-1) / S[..., 0] ** 2  # 0/0 = NaN for an all-zero sequence


def effective_rank(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Roy & Vetterli (2007) effective rank exp(-sum p_i log p_i), p_i = s_i / sum_j s_j.

    Between 1 and rank(X); shape (sequence,), float64.  NaN for an all-zero sequence.
    """
    Xm, _, _ = _prepare(X, mask)
    return _effective_rank(_svdvals(_rescale(Xm)))


def stable_rank(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Stable rank sum_i s_i^2 / s_1^2 = ||X||_F^2 / ||X||_2^2.

    Between 1 and the effective rank (hence rank(X)); shape (sequence,), float64.  NaN for an
    all-zero sequence.
    """
    Xm, _, _ = _prepare(X, mask)
    return _stable_rank(_svdvals(_rescale(Xm)))


def _cosine(Xm: Tensor, counts: Tensor) -> Tensor:
    norms = torch.linalg.vector_norm(Xm, dim=-1, keepdim=True)  # (sequence, token, 1)
    # Zero-norm (and padded) rows stay zero, so they add 0 to every pair they belong to.
    unit = Xm / torch.where(norms > 0, norms, 1.0)
    # sum_{i != j} <u_i, u_j> = ||sum_i u_i||^2 - sum_i ||u_i||^2: O(token) instead of O(token^2).
    total = unit.sum(-2).square().sum(-1) - unit.square().sum((-2, -1))
    return (total / (counts * (counts - 1))).clamp(-1.0, 1.0)  # clamp: rounding only


def cosine_similarity(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Token uniformity: mean cosine similarity over ordered pairs i != j of real tokens.

    In [-1, 1]; 1 when all tokens point the same way.  A zero-norm token has cosine 0 with
    every other token (it still counts in the number of pairs).  Shape (sequence,), float64.
    """
    Xm, _, counts = _prepare(X, mask)
    return _cosine(_rescale(Xm), counts)


def collapse_metrics(X: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
    """All metrics at once, sharing one SVD of X per sequence.

    Returns float64 tensors on X's device:

    * ``"relative_residual"``: (sequence, len(FITS), len(NORMS)), indexed in the order of
      FITS and NORMS, equal to ``relative_residual(X, mask, norm, fit)``;
    * ``"effective_rank"``, ``"stable_rank"``, ``"cosine_similarity"``: (sequence,).

    The SVD of X gives its spectral norm, the rank-one fit, the spectral norm of the rank-one
    residual (sigma_2) and both ranks; only the mean residual needs its own singular values.
    Degenerate cases follow the module docstring.
    """
    Xm, mask, counts = _prepare(X, mask)
    Xm = _rescale(Xm)
    S, u1, v1 = _svd_top(Xm)
    R_mean = _mean_residual(Xm, mask, counts)
    R_svd = _svd_residual(Xm, mask, S, u1, v1)
    sigma2 = S[:, 1] if S.shape[-1] > 1 else torch.zeros_like(S[:, 0])
    tables = {
        "mean": _norm_table(R_mean, _svdvals(R_mean)[:, 0]),
        "svd": _norm_table(R_svd, sigma2),
    }
    residuals = torch.stack([tables[fit] for fit in FITS], dim=1)  # (sequence, fit, norm)
    reference = _norm_table(Xm, S[:, 0])[:, None, :]  # (sequence, 1, norm)
    return {
        "relative_residual": residuals / reference,
        "effective_rank": _effective_rank(S),
        "stable_rank": _stable_rank(S),
        "cosine_similarity": _cosine(Xm, counts),
    }
