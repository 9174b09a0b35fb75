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
Beside it, in X's own units, Wu et al. (2024)'s distance to rank one mu(X) = ||X - 1 x^T||_F
with x the token mean: the Frobenius residual before it is divided by ||X||_F.

Complementary, fit-free measures of collapse, all computed from the singular values s_i of X:

* effective rank (Roy & Vetterli 2007, "The effective rank: a measure of effective
  dimensionality", EUSIPCO): exp(-sum_i p_i log p_i) with p_i = s_i / sum_j s_j, 0 log 0 = 0;
* stable rank (Rudelson & Vershynin 2007): sum_i s_i^2 / s_1^2 = ||X||_F^2 / ||X||_2^2.

And token uniformity, the mean cosine similarity over distinct pairs of tokens, which tends to 1
as the representation collapses.

**What each metric costs** (T tokens, H hidden, k = min(T, H), per sequence).
Only the effective rank needs the whole spectrum; nothing else waits for one.

* cosine similarity: O(T H) passes over X.
* relative residual (every norm, both fits) and stable rank: O(T H) passes, one Gram matrix
  (T H k flops, a matmul) and about 30-60 Krylov steps, each one product of the k x k Gram
  matrix with a few vectors ("matmul-shaped").  No eigendecomposition of a k x k matrix.
* effective rank, ``"estimate"``: the same Gram matrix, 32 more Krylov steps and 20 steps of a
  block of 16 probe vectors (matmuls of k x k by k x 16).
* effective rank, ``"exact"``: a full symmetric eigenvalue problem per sequence, O(k^3) at
  LAPACK's speed (a few GFLOP/s on a CPU core, far less per flop than a matmul).  ``"auto"``
  (the default) takes it where it is the cheaper of the two -- on a CPU for k <= 256, on a
  GPU for k <= 128 -- and the estimate elsewhere.  Up to k = 48 (or a sequence of that few
  real tokens) every method is exact: the estimate would have no room for its probes
  (``ESTIMATE_FROM``).

**How they are computed.**
This module computes the quantities (its input checked and prepared by
``probe.measures.metrics_input``, the matrix norms in ``probe.measures.metrics_norms``); the numerical linear
algebra under them is ``probe.linalg``, whose modules explain each method and its accuracy:

* the mean residual R = X - 1 mean^T and its k x k Gram matrix G_R, through which X's Gram
  matrix G and the rank-one residual's G_1 are applied (``probe.linalg.gram``);
* the relative residual and the stable rank: the top singular pair (s_1, u_1) of X, the
  rank-one residual R_1 = X - s_1 u_1 v_1^T formed explicitly, ||R||_2 and s_2 = ||R_1||_2, by
  Lanczos with Ritz extraction (``probe.linalg.krylov``) or, on a CPU for small k, dense
  eigensolves (``probe.linalg.top``).  The l1, linf and Frobenius norms are passes over X, R
  and R_1; the stable rank is ||X||_F^2 / s_1^2;
* the effective rank, ``"exact"``: every singular value from G's eigenvalues, with the
  accurate fallbacks a rank-deficient or collapsed X needs (``probe.linalg.dense``);
  ``"estimate"``: stochastic Lanczos quadrature (``probe.linalg.quadrature``);
* small eigenproblems on the host's LAPACK, split over the CPU's threads
  (``probe.linalg.lapack``), and work buffers reused from call to call
  (``probe.linalg.workspace``).

Everything runs on X's device with the same code.

Accuracy (tests/test_linalg.py checks it against the NumPy SVD oracle): relative error
<= 1e-10 in residual ratios above 1e-6 and absolute <= 1e-14 below (the float64 reference itself
is accurate to about eps ||X|| in the residual), relative <= 1e-8 in stable rank and exact
effective rank, for random, nearly collapsed (1e-12), float32-floor (1e-7), partly collapsed,
nearly rank-one and padded inputs; the estimate within 2% per sequence.  Near-ties s_1 ~ s_2
make u_1 (and the reference's) ill-determined, which moves only the l1/linf residuals of
``fit="svd"``.

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
  eigenvector the iteration returns (its Frobenius and spectral residuals are unaffected).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from probe.linalg.batch import fix_rows, frobenius, take_rows
from probe.linalg.dense import all_singular_values
from probe.linalg.gram import Grams, gram
from probe.linalg.quadrature import PROBES, QUADRATURE_STEPS, effective_rank_estimate
from probe.linalg.top import DENSE_UP_TO, DENSE_UP_TO_GPU, top_of_spectrum
from probe.linalg.workspace import workspace
from probe.measures.metrics_input import check_name, mean_residual, prepare, rescale, token_mean
from probe.measures.metrics_norms import l1_linf, matrix_norm, norm_table
from probe.names import EFFECTIVE_RANK_METHODS, FITS, METRICS, MU, NORMS, stored

__all__ = [
    "DENSE_UP_TO",
    "EFFECTIVE_RANK_METHODS",
    "ESTIMATE_FROM",
    "EXACT_UP_TO",
    "EXACT_UP_TO_GPU",
    "FITS",
    "METRICS",
    "NORMS",
    "PROBES",
    "QUADRATURE_STEPS",
    "collapse_metrics",
    "cosine_similarity",
    "effective_rank",
    "effective_rank_method",
    "matrix_norm",
    "relative_residual",
    "residual",
    "stable_rank",
]

_F64 = torch.float64

#: "auto" on a CPU: the exact effective rank up to this k, where it costs no more than the
#: estimate.  (PROBES and QUADRATURE_STEPS, the estimate's, and DENSE_UP_TO, where the top of
#: the spectrum leaves dense eigensolves for Krylov runs, are probe.linalg's; they are read
#: there, so a change must be made there.)
EXACT_UP_TO = 256
#: The same on a GPU, where the estimate's Krylov steps wait for the device at every check:
#: the exact effective rank with dense eigensolves for the top of the spectrum costs less up
#: to the k where the dense path ends there (measured together: probe.linalg.top).
EXACT_UP_TO_GPU = DENSE_UP_TO_GPU
#: The estimate needs room for its probes: up to this many dimensions (k, or a sequence's
#: real tokens) the deflation's DEFLATION_STEPS Krylov vectors span most or all of the
#: space, the quadrature is left nothing to sample (at k <= 32 its value was off by up to
#: 130%), and the exact effective rank is computed instead, for "estimate" and "auto" alike:
#: an eigenproblem this small costs less than the estimate's steps.
ESTIMATE_FROM = 48


def _trace(G: Tensor) -> Tensor:
    return G.diagonal(dim1=-2, dim2=-1).sum(-1)


# --------------------------------------------------------------------------------- the core


def _effective_rank(S: Tensor) -> Tensor:
    # An all-zero sequence gives p = 0/0 = NaN, which propagates: the convention we want.
    p = S / S.sum(-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(-1))  # xlogy(0, 0) = 0


def _cosine(Xm: Tensor, counts: Tensor) -> Tensor:
    norms = torch.linalg.vector_norm(Xm, dim=-1)  # (sequence, token)
    # Zero-norm (and padded) tokens get weight 0, so they add 0 to every pair they belong to.
    inverse = torch.where(norms > 0, 1.0 / norms, 0.0)
    # sum_{i != j} <u_i, u_j> = ||sum_i u_i||^2 - sum_i ||u_i||^2 with u_i = x_i / |x_i|: one
    # matrix-vector product instead of O(token^2) dot products or a normalised copy of X.
    total = (inverse[:, None, :] @ Xm)[:, 0, :].square().sum(-1)
    total = total - (norms * inverse).square().sum(-1)
    return (total / (counts * (counts - 1))).clamp(-1.0, 1.0)  # clamp: rounding only


def _exact_method(method: str, k: int, device: torch.device) -> bool:
    if k <= ESTIMATE_FROM:
        return True
    if method == "auto":
        return k <= (EXACT_UP_TO if device.type == "cpu" else EXACT_UP_TO_GPU)
    return method == "exact"


def _compute(Xm, mask, counts, want: tuple[str, ...], method: str) -> dict[str, Tensor]:
    S, T, H = Xm.shape
    wide = T <= H
    k = min(T, H)
    residual = "relative_residual" in want
    erank = "effective_rank" in want
    out: dict[str, Tensor] = {}
    if residual or erank or "stable_rank" in want:
        exact = erank and _exact_method(method, k, Xm.device)
        estimate = erank and not exact
        # R and then R_1 share one buffer, |.| another (see workspace).
        buffer, scratch = workspace(Xm, 3)[:2]
        mean = token_mean(Xm, counts)
        R = mean_residual(Xm, mask, counts, out=buffer, mean=mean)
        # R's Gram matrix formed from R (accurate however small R is); G through it.
        G_R = gram(R, wide)
        fro2_R = _trace(G_R)
        fro2 = fro2_R + counts * mean.square().sum(-1)  # ||X||_F^2 = ||R||_F^2 + n |mean|^2
        if residual:
            R_l1, R_linf = l1_linf(R, scratch)
        grams = Grams(G_R, R, mean, mask, counts, wide)
        top = top_of_spectrum(grams, Xm, buffer, counts, residual, estimate, mask)
        s1, R1 = top.s1, top.R1
        if residual:
            R1_l1, R1_linf = l1_linf(R1, scratch)
            R_table = norm_table(R_l1, R_linf, fro2_R.sqrt(), top.mu1.sqrt())
            R1_table = norm_table(R1_l1, R1_linf, frobenius(R1), top.s2)
            tables = {"mean": R_table, "svd": R1_table}
            residuals = torch.stack([tables[fit] for fit in FITS], dim=1)
            X_l1, X_linf = l1_linf(Xm, scratch)
            reference = norm_table(X_l1, X_linf, fro2.sqrt(), s1)[:, None, :]
            out["relative_residual"] = residuals / reference  # (sequence, fit, norm)
            out[MU] = fro2_R.sqrt()  # in the units of Xm: collapse_metrics scales it back
        if "stable_rank" in want:
            out["stable_rank"] = fro2 / s1**2  # 0/0 = NaN for an all-zero sequence
        if exact:
            rank = counts.to(torch.long).clamp(max=k)
            G = grams.dense_X() if top.gram is None else top.gram
            S_all = all_singular_values(Xm, G, s1, R1, rank, wide, top.gram_values, top.r1)
            out["effective_rank"] = _effective_rank(S_all)
        elif estimate:
            real = counts if wide else torch.full_like(counts, float(k))
            value = effective_rank_estimate(grams, top.deflation, real, s1, R1)
            # Sequences with too few real tokens for the estimate (ESTIMATE_FROM): exactly.
            value = fix_rows(
                real <= ESTIMATE_FROM,
                value,
                lambda index: _compute(
                    take_rows(Xm, index), mask[index], counts[index], ("effective_rank",), "exact"
                )["effective_rank"],
            )
            bound = (counts if wide else counts.clamp(max=float(k))).to(_F64)
            out["effective_rank"] = torch.minimum(value.clamp(min=1.0), bound)
            out["effective_rank"] = torch.where(fro2 > 0, out["effective_rank"], math.nan)
    if "cosine_similarity" in want:
        out["cosine_similarity"] = _cosine(Xm, counts)
    return {name: out[name] for name in stored(METRICS) if name in out}


def _wanted(metrics: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if metrics is None:
        return METRICS
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    for name in names:
        check_name(name, METRICS, "metric")
    if not names:
        raise ValueError(f"metrics must name at least one of {', '.join(METRICS)}")
    return names


def collapse_metrics(
    X: Tensor,
    mask: Tensor | None = None,
    metrics: str | tuple[str, ...] | list[str] | None = None,
    effective_rank: str = "auto",
) -> dict[str, Tensor]:
    """The collapse metrics of a batch, sharing one Gram matrix per sequence.

    Method, cost and accuracy: see the module docstring.  Degenerate cases follow it too.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.
    metrics
        Names of `METRICS` (`relative_residual`, `effective_rank`, `stable_rank`,
        `cosine_similarity`); None: all.  Only what they need is computed.
    effective_rank
        `"exact"` (full spectrum), `"estimate"` (stochastic Lanczos quadrature) or `"auto"`
        (exact up to k = `EXACT_UP_TO` on a CPU, `EXACT_UP_TO_GPU` on a GPU, the estimate
        above); every method is exact up to k = `ESTIMATE_FROM` and for sequences of that few
        real tokens.

    Returns
    -------
    dict[str, Tensor]
        float64 tensors on X's device, one per name asked for: `"relative_residual"`
        (sequence, len(FITS), len(NORMS)), ||res(X)|| / ||X|| for each fit and norm in the
        order of `FITS` and `NORMS`, with `"mu"` (sequence,) beside it, Wu et al.'s
        ||X - 1 mean^T||_F in X's units; `"effective_rank"`, `"stable_rank"` and
        `"cosine_similarity"` (sequence,).

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token; an unknown metric or method.
    """
    wanted = _wanted(metrics)
    check_name(effective_rank, EFFECTIVE_RANK_METHODS, "effective rank method")
    Xm, mask, counts, peak = prepare(X, mask)
    scaled, exponent = rescale(Xm, peak)
    out = _compute(scaled, mask, counts, wanted, effective_rank)
    if exponent is not None and MU in out:  # the one metric in X's units: scaled back
        out[MU] = torch.ldexp(out[MU], exponent)  # by the exact power of two
    return out


def effective_rank_method(method: str, tokens: int, hidden: int, device: str | torch.device) -> str:
    """What an effective-rank method means at this size and device.

    Parameters
    ----------
    method
        `"auto"`, `"exact"` or `"estimate"`, as
        [`collapse_metrics`][probe.measures.metrics.collapse_metrics] takes it.
    tokens
        Tokens per sequence.
    hidden
        The hidden size.
    device
        Where the metrics run.

    Returns
    -------
    str
        `"exact"` or `"estimate"`.

    Raises
    ------
    ValueError
        An unknown method.
    """
    check_name(method, EFFECTIVE_RANK_METHODS, "effective rank method")
    exact = _exact_method(method, min(tokens, hidden), torch.device(device))
    return "exact" if exact else "estimate"


# ------------------------------------------------------------------------- single metrics


def residual(X: Tensor, mask: Tensor | None = None, fit: str = "mean") -> Tensor:
    """res(X) = X - 1 x^T per sequence, float64, same shape as X, padded rows zero.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.
    fit
        `"mean"`: x is the mean of the real tokens.  `"svd"`: the subtracted matrix is the best
        rank-one approximation sigma_1 u_1 v_1^T of the real-token matrix (not unique when
        sigma_1 = sigma_2; see the module docstring).

    Returns
    -------
    Tensor

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token; an unknown fit.
    """
    check_name(fit, FITS, "fit")
    Xm, mask, counts, peak = prepare(X, mask)
    mean = token_mean(Xm, counts)
    R = mean_residual(Xm, mask, counts, mean=mean)
    if fit == "mean":
        return R
    # The direction comes from the rescaled X (its Gram matrix must not overflow); the
    # projection is applied to X itself, so the residual keeps X's scale.
    wide = Xm.shape[-2] <= Xm.shape[-1]
    scaled, _ = rescale(Xm, peak)
    if scaled is not Xm:
        mean = token_mean(scaled, counts)
        R = mean_residual(scaled, mask, counts, mean=mean)
    grams = Grams(gram(R, wide), R, mean, mask, counts, wide)
    u = top_of_spectrum(grams, scaled, torch.empty_like(scaled), counts, False, False).u
    if wide:
        return Xm - u[:, :, None] * (u[:, None, :] @ Xm)
    return Xm - (Xm @ u[:, :, None]) * u[:, None, :]


def relative_residual(
    X: Tensor, mask: Tensor | None = None, norm: str = "l1inf", fit: str = "mean"
) -> Tensor:
    """||res(X)|| / ||X|| per sequence, both on real tokens.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.
    norm
        One of `NORMS`: `"l1inf"` (the paper's), `"fro"`, `"spectral"`, `"l1"`, `"linf"`.
    fit
        `"mean"` (the token mean) or `"svd"` (the best rank-one fit).

    Returns
    -------
    Tensor
        (sequence,), float64.  0 means fully collapsed (all tokens equal for `fit="mean"`,
        rank one for `fit="svd"`); NaN (0/0) for a sequence whose real tokens are all zero.

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token; an unknown norm or fit.
    """
    check_name(norm, NORMS, "norm")
    check_name(fit, FITS, "fit")
    table = collapse_metrics(X, mask, metrics="relative_residual")["relative_residual"]
    return table[:, FITS.index(fit), NORMS.index(norm)]


def effective_rank(X: Tensor, mask: Tensor | None = None, method: str = "auto") -> Tensor:
    """Roy & Vetterli (2007) effective rank exp(-sum p_i log p_i), p_i = s_i / sum_j s_j.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.
    method
        `"auto"`, `"exact"` or `"estimate"`: see
        [`collapse_metrics`][probe.measures.metrics.collapse_metrics].

    Returns
    -------
    Tensor
        (sequence,), float64, between 1 and rank(X); NaN for an all-zero sequence.

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token; an unknown method.
    """
    return collapse_metrics(X, mask, "effective_rank", method)["effective_rank"]


def stable_rank(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Stable rank sum_i s_i^2 / s_1^2 = ||X||_F^2 / ||X||_2^2.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.

    Returns
    -------
    Tensor
        (sequence,), float64, between 1 and the effective rank (hence rank(X)); NaN for an
        all-zero sequence.

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token.
    """
    return collapse_metrics(X, mask, metrics="stable_rank")["stable_rank"]


def cosine_similarity(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Token uniformity: mean cosine similarity over ordered pairs i != j of real tokens.

    Parameters
    ----------
    X
        (sequence, token, hidden), any real dtype and device.
    mask
        Bool (sequence, token), True at real tokens; None: every token is real.

    Returns
    -------
    Tensor
        (sequence,), float64, in [-1, 1]; 1 when all tokens point the same way.  A zero-norm
        token has cosine 0 with every other token (it still counts in the number of pairs).

    Raises
    ------
    ValueError
        X not 3-D, complex or without features; a mask of another shape or dtype; a sequence
        with fewer than 2 real tokens; NaN or inf in a real token.
    """
    return collapse_metrics(X, mask, metrics="cosine_similarity")["cosine_similarity"]
