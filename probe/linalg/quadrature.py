"""The effective rank estimate: stochastic Lanczos quadrature, deflated, with control variates.

Stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017) is a matmul-only estimate of the two
spectral sums the effective rank needs, sum_i s_i = tr G^(1/2) and sum_i s_i log s_i =
tr f(G) with f(lambda) = sqrt(lambda) log sqrt(lambda), G X's Gram matrix.  s_1 is counted
exactly; the rest of the spectrum is that of G_1 = P G P (R_1's Gram matrix, accurate to the
size of R however collapsed X is; probe.linalg.gram).  Three reductions of its variance:

* deflation: the top Ritz pairs of G that have converged (residual <= DEFLATION_TOL theta_i,
  found by DEFLATION_STEPS Krylov steps that run in the same products as the other problems,
  probe.linalg.top) are counted exactly, and the probes live in their orthogonal complement
  (dimension d = n real tokens or H, minus those pairs);
* each of PROBES fixed probes z (seeded Gaussian, projected, normalised: z^T I z = 1 exactly)
  gives z^T f(C) z by QUADRATURE_STEPS-node Gauss quadrature (``gauss``), e_1^T f(Q^T C Q) e_1
  over its own Krylov basis, with C = P G P the deflated operator; the trace is d times the
  mean over probes;
* control variates: tr C and tr C^2 are known exactly (||R_1||_F^2, ||G_1||_F^2 and the
  deflated pairs; ||G_1||_F^2 from G_R times three vectors, never forming G_1, or from R_1 where
  that difference cancels: ``residual_fro2``), and their probe estimates, regressed against
  those of the two sums, correct them.

Then log erank = log N - E / N with N, E the two sums; the caller clamps it to [1, rank bound].
Accuracy (tests/test_linalg.py, against the SVD reference on spectra shaped like real hidden
states -- a few outliers over a Marchenko-Pastur bulk, partly and fully collapsed): relative
error within 2% per sequence, typically 0.1-0.5% at k = 512; fully collapsed sequences
(erank ~ 1) to 1e-4.  The probes are the same for every sequence, so a sequence's estimate
depends on the batch it came in only through rounding (which can tip a borderline Ritz pair in
or out of the deflated top): relative 1e-4 at most (4e-6 measured), far below the estimate's
error.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from .batch import dot, fix_rows, frobenius, take_rows, unit
from .gram import Grams, gram
from .krylov import Ritz
from .lapack import lapack
from .workspace import fixed

_F64 = torch.float64

DEFLATION_TOL = 1e-3
PROBES = 16
QUADRATURE_STEPS = 20

# The estimate's control variate ||G_1||_F^2 comes from G_R as a difference of terms up to
# ||M||_F^2 (Grams.fro2_residual), rounded to ~eps ||M||_F^2; below this fraction of it
# (relative error then up to ~1e-8, against the estimate's 2%) it is formed from R_1 instead.
CANCELLED = 1e-8


def _deflation(ritz: Ritz, grams: Grams) -> tuple[Tensor, Tensor]:
    """G's top Ritz pairs after the first that the estimate counts exactly: values (zero where
    not kept) and vectors, made orthogonal to u_1."""
    theta, V, rho = ritz.values[:, 0], ritz.vectors[:, 0], ritz.residuals[:, 0]
    keep = (rho <= DEFLATION_TOL * theta) & (theta > 0)  # (S, count)
    # Only a leading run of converged pairs: a gap in it would leave a converged direction
    # inside the probes' space and count it twice.
    keep = torch.cumprod(keep.to(torch.int8), dim=-1).bool()[:, 1:]
    V = grams.project(V[:, 1:]) * keep[..., None]  # zero vectors for the pairs not kept
    return torch.where(keep, theta[:, 1:], 0.0), V


def residual_fro2(grams: Grams, R1: Tensor) -> Tensor:
    """||G_1||_F^2 = sum_{i>=2} s_i^4 through G_R; where ||G_1||_F^2 < CANCELLED ||M||_F^2
    the difference has lost too much to rounding (a nearly rank-one X whose tokens are not
    nearly equal) and R_1's own Gram matrix gives it instead."""
    value, size = grams.fro2_residual()
    return fix_rows(
        ~(value >= CANCELLED * size),  # NaN-safe: such a row takes R_1's own Gram matrix
        value,
        lambda index: frobenius(gram(take_rows(R1, index), grams.wide)).square(),
    )


def effective_rank_estimate(
    grams: Grams, ritz: Ritz, real: Tensor, s1: Tensor, R1: Tensor
) -> Tensor:
    """The effective rank by stochastic Lanczos quadrature (module docstring).

    s_1 is counted exactly; the rest of the spectrum is that of G_1 = P G P (R_1's Gram matrix,
    accurate to the size of R however collapsed X is), of which the converged top Ritz pairs
    of G after the first are counted exactly too, the remainder C by the probes.  ``real``:
    the dimension of the space G acts on (real tokens, or H)."""
    theta, V = _deflation(ritz, grams)
    S, k = grams.G_R.shape[0], grams.G_R.shape[-1]
    Z = fixed((PROBES, k), grams.G_R.device, 2).expand(S, PROBES, k)
    if grams.wide:
        Z = Z * grams.m
    Z = grams.project(Z)
    for _ in range(2):
        Z = Z - (Z @ V.mT) @ V
    # The probes' products need ~1e-3 accuracy, not 1e-11: G_R in float32 halves their cost.
    # G_1's low-rank part and the projections stay in float64.
    G_R32 = grams.G_R.to(torch.float32)

    def apply(W: Tensor) -> Tensor:
        # W G_R = (G_R W^T)^T up to G_R's own rounding asymmetry: no transposed operands.
        Y = grams.residual((W.to(torch.float32) @ G_R32).to(_F64), W)
        return Y - (Y @ V.mT) @ V

    nodes, weights = gauss(apply, Z, min(QUADRATURE_STEPS, k))
    roots = nodes.sqrt()
    samples = torch.stack(
        [
            (weights * roots).sum(-1),
            (weights * torch.special.xlogy(roots, roots)).sum(-1),
            (weights * nodes).sum(-1),
            (weights * nodes.square()).sum(-1),
        ],
        dim=-1,
    )  # (S, probes, 4): z^T f(C) z for sqrt, sqrt log sqrt, identity, square
    # Exact traces of the control variates: tr C = ||R_1||_F^2 less the deflated values, tr C^2
    # = ||G_1||_F^2 less theirs; every term is of R's size (||G_1||_F^2 itself is a difference
    # of such terms, checked for cancellation in residual_fro2).
    G1V = grams.residual(grams.product(V), V)  # G_1 v_i, zero for the pairs not kept
    fro2_G1 = residual_fro2(grams, R1)
    exact = torch.stack(
        [
            frobenius(R1).square() - theta.sum(-1),
            fro2_G1 - 2 * G1V.square().sum((-2, -1)) + theta.square().sum(-1),
        ],
        dim=-1,
    )
    mean = samples.mean(1)  # (S, 4)
    centred = samples - mean[:, None, :]
    f, c = centred[..., :2], centred[..., 2:]
    # Regression of the two sums on the two controls, per sequence over its probes; the
    # controls are standardised first (tr C and tr C^2 differ by orders of magnitude).
    spread = c.square().sum(1).sqrt()  # (S, 2)
    c = c / torch.where(spread > 0, spread, 1.0)[:, None, :]
    ridge = 1e-10 * torch.eye(2, dtype=_F64, device=c.device)
    beta = torch.linalg.solve(c.mT @ c + ridge, c.mT @ f)
    beta = beta / torch.where(spread > 0, spread, math.inf)[:, :, None]  # (S, 2, 2)
    dimension = (real - 1 - (theta > 0).sum(-1)).clamp(min=0).to(_F64)[:, None]
    error = dimension * mean[:, 2:] - exact  # the controls' estimates minus their values
    sums = dimension * mean[:, :2] - (error[:, None, :] @ beta)[:, 0, :]
    rest, rest_log = _feasible(sums[:, 0], sums[:, 1], exact[:, 0], dimension[:, 0])
    top = torch.cat([s1[:, None], theta.sqrt()], dim=-1)
    N = top.sum(-1) + rest
    E = torch.special.xlogy(top, top).sum(-1) + rest_log
    return torch.exp(torch.log(N) - E / N)


def _feasible(total: Tensor, entropy: Tensor, trace: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """The probes' sum_i s_i and sum_i s_i log s_i of C held to what C's exact trace allows.

    C has at most d nonzero eigenvalues s_i^2 and tr C = sum_i s_i^2, so sum_i s_i lies in
    [sqrt(tr C), sqrt(d tr C)]; with N that sum and p_i = s_i / N, sum_i s_i log s_i = N log N -
    N H(p) with 0 <= H(p) <= log d.  An estimate inside these bounds is kept as it is.  Outside
    them it is wrong, not merely noisy: where R_1 is rounding alone (tokens equal to the last
    bit, as in a bfloat16 model's collapsed layers) the probes see nothing, the exact trace is
    R_1's rounding, and the control variates' regression turned that mismatch into sums of
    1e40 (an effective rank at its bound where the true one is 1)."""
    trace = trace.clamp(min=0.0)
    high = (d * trace).sqrt()
    total = torch.minimum(torch.maximum(total, torch.minimum(trace.sqrt(), high)), high)
    most = torch.special.xlogy(total, total)
    return total, torch.minimum(torch.maximum(entropy, most - torch.special.xlogy(total, d)), most)


def gauss(apply: Callable[[Tensor], Tensor], Z: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Gauss quadrature of each probe z: nodes and weights with z^T f(C) z ~ sum w f(node).

    Plain Lanczos (three-term recurrence) from z / |z|: the quadrature is robust to the loss
    of orthogonality that full reorthogonalisation would prevent, at a fraction of its cost.
    """
    q = unit(Z)
    previous = torch.zeros_like(q)
    beta = q.new_zeros(q.shape[:-1] + (1,))
    alphas, betas = [], []
    for _ in range(steps):
        w = apply(q) - beta * previous
        alpha = dot(q, w)
        w = w - alpha * q
        w = w - dot(q, w) * q  # once more against q: the recurrence's weak point
        alphas.append(alpha[..., 0])
        beta = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
        betas.append(beta[..., 0])
        previous, q = q, unit(w)
    T = torch.diag_embed(torch.stack(alphas, -1))
    off = torch.stack(betas[:-1], -1) if steps > 1 else None
    if off is not None:
        T = T + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
    shape = T.shape
    [(nodes, Y)] = lapack(torch.linalg.eigh, T.reshape(-1, steps, steps))
    nodes = nodes.reshape(shape[:-1]).clamp(min=0.0)
    weights = Y[:, 0, :].square().reshape(shape[:-1])
    return nodes, weights
