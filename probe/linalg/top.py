"""The top of the spectrum: u_1, s_1 and R_1 = P X, ||R||_2 and s_2 = ||R_1||_2.

What the relative residual and the stable rank need of a batch, through the Gram operators of
probe.linalg.gram (G, X's Gram matrix; G_R, that of the mean residual R; G_1, that of the
rank-one residual R_1):

* u_1 (token side) or v_1 (hidden side), the top eigenvector of G.  Then s_1 = ||X^T u_1||
  (||X v_1||), a Rayleigh quotient after one more power step, and R_1 = P X is formed
  explicitly (for its l1, linf and Frobenius norms);
* ||R||_2^2 = mu_1(G_R);
* s_2^2 = lambda_1(G_1), where it is accurate to eps (||R||_2 / s_2)^2 relative; where
  ||R||_2^2 > 1e4 s_2^2 (X nearly rank one but its tokens not nearly equal) from R_1's own Gram
  matrix instead (accurate to eps s_1 absolute, as the SVD reference).

``top_of_spectrum`` finds them by Krylov runs (probe.linalg.krylov) that share one product
with G_R per step: G's run gives u_1 within a few steps, then G_1's starts beside G_R's.  A
sequence a run leaves unconverged gets the exact eigensolver (eigvalsh; inverse iteration for
u_1), so every value is accurate as stated.  For the effective rank estimate G's run goes on
to DEFLATION_STEPS vectors, whose converged top Ritz pairs the quadrature counts exactly.

On a CPU up to k = DENSE_UP_TO (on a GPU up to DENSE_UP_TO_GPU) the Krylov loop is skipped:
the same three quantities come from dense eigensolves (lambda_1 of G by eigvalsh and u_1 by
inverse iteration, lambda_1 of G_R, and s_2^2 as lambda_2 of G where lambda_2 >= 1e-2
lambda_1, else lambda_1 of R_1's own Gram matrix, whose eigenvalues the exact effective rank's
deflation then reuses), which cost less there than a loop of up to k steps.  The accuracy
tests (tests/test_linalg.py) run both ways at the same tolerances: relative <= 1e-10 in
residual ratios above 1e-6, absolute <= 1e-14 below.

A Krylov run checks its convergence every 4 steps, which on CUDA makes the host wait for the
device; ``probe.analyses.collapse`` therefore never calls this inside a CUDA layer loop (it
measures a batch's layers after the batch, on a side stream, while the next one runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .batch import fix_rows, frobenius, identical_rows, take_rows, unit
from .dense import top_vector
from .gram import Grams, gram
from .krylov import CHECKS, KRYLOV_STEPS, Ritz, Run, identity, same, step
from .lapack import eigvalsh
from .workspace import fixed

# G_1 through G_R loses eps (||R||_2 / s_2)^2 relative in s_2^2; beyond this ratio it is formed
# from the explicit R_1.
_FACTORED_LIMIT = 1e4

# Dense path: where lambda_2(G) / lambda_1(G) is at least this, s_2 = sqrt(lambda_2(G)), which
# G's eigensolve already gave: its rounding, a few eps lambda_1 (the product and the solver),
# is then below 1e-13 of lambda_2.  Below it, s_2 comes from R_1's own Gram matrix, accurate
# however small R_1 is (a collapsed sequence).
_SECOND_FROM_G = 1e-2

#: Up to this k on a CPU the top singular pair and the residuals' spectral norms come from
#: dense eigensolves, not the Krylov loop: measured on this project's 2-core CPU, a batch
#: of 16 x 128 x 768 took 163 ms through Krylov against about 40 ms dense.
DENSE_UP_TO = 256
#: The same on a GPU (where the eigensolves run on the host's LAPACK, probe.linalg.lapack),
#: measured on an H100 with the exact effective rank beside it: 13 layers of bert-base's
#: 16 x 128 hidden states took 31-66 ms dense against 207-780 ms through Krylov with the
#: estimate; at 16 x 256, 288-402 ms dense against 238-248 ms.
DENSE_UP_TO_GPU = 128


def dense_up_to(device: torch.device) -> int:
    """Up to which k the top of the spectrum comes from dense eigensolves on this device."""
    return DENSE_UP_TO if device.type == "cpu" else DENSE_UP_TO_GPU


#: The effective rank estimate's deflation: G's run goes on to this many vectors.
DEFLATION_STEPS = 32


def _starts(grams: Grams) -> tuple[Tensor, Tensor, Tensor]:
    """Fixed starts: for G near the mean direction (where u_1 / v_1 usually lies), for G_R and
    G_1 pseudo-random (on real tokens)."""
    S, k = grams.G_R.shape[0], grams.G_R.shape[-1]
    noise = [fixed((k,), grams.G_R.device, salt).expand(S, 1, k) for salt in (1, 3)]
    if grams.wide:
        m = grams.m
        noise = [vector * m for vector in noise]  # real tokens only
        return m + 0.3 * unit(noise[0]) * m.sum(-1, keepdim=True).sqrt(), *noise
    return unit(grams.mean) + 0.3 * unit(noise[0]), *noise


def _exact_top(G: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fallback: lambda_1 by eigvalsh and its eigenvector by inverse iteration."""
    G = take_rows(G, index)
    lam = eigvalsh(G)[0]
    return lam[:, 0], top_vector(G, lam[:, 0])


@dataclass
class _Top:
    """What the Krylov work of a batch gives (module docstring)."""

    u: Tensor  # u_1 (token side, zero on padding) or v_1 (hidden side), (sequence, k)
    image: Tensor  # u_1^T X = s_1 v_1^T, or X v_1 = s_1 u_1
    s1: Tensor
    R1: Tensor  # the rank-one residual, explicit (in the shared buffer)
    mu1: Tensor | None  # lambda_1(G_R) = ||R||_2^2, with the residual
    s2: Tensor | None  # ||R_1||_2, with the residual
    deflation: Ritz | None  # G's top Ritz pairs, for the estimate
    # The dense path's Gram matrix of X and its eigenvalues (descending), which the exact
    # effective rank reuses instead of solving the same problem again.
    gram: Tensor | None = None
    gram_values: Tensor | None = None
    # The dense path's Gram matrices of R_1 (rows ``index``) and their eigenvalues, formed for
    # s_2 of collapsed sequences, which the exact effective rank's deflation reuses.
    r1: tuple[Tensor, Tensor, Tensor] | None = None


def top_of_spectrum(grams, Xm, buffer, counts, residual, estimate, mask=None) -> _Top:
    """Every Krylov problem of a batch in one loop of products with G_R.

    G's run gives u_1 within a few steps; then G_1's run starts (it needs u_1) beside G_R's.
    For the estimate G's run goes on to DEFLATION_STEPS vectors.  A run stops once every
    sequence has converged; each step multiplies G_R by the current vectors of all runs at
    once.  Sequences a run leaves unconverged get the exact eigensolver.

    With the residual and ``mask`` given, sequences whose real tokens are all the same vector
    (``identical_rows``) are found first: X is then exactly rank one and G_1 is rounding
    alone: its run could never converge on them (it went on for all its KRYLOV_STEPS, at
    every check a wait on CUDA, where a bfloat16 model's pure-attention layers collapse to
    identical tokens), and s_2 comes from R_1's own Gram matrix, as it did for them after the
    unconverged run."""
    k = grams.G_R.shape[-1]
    if not estimate and k <= dense_up_to(Xm.device):
        return _dense(grams, Xm, buffer, residual)
    identical = identical_rows(Xm, mask) if residual and mask is not None else None
    capacity = min(KRYLOV_STEPS, k)
    deflation = min(DEFLATION_STEPS, capacity) if estimate else 0
    start_G, start_R, start_1 = _starts(grams)
    support = grams.support
    G = Run(
        start_G,
        capacity,
        identity,
        grams.X,
        vector=True,
        keep=max(2, deflation),
        at_least=deflation,
        support=support,
    )
    runs = [G]
    R = G1 = top = None
    if residual:
        R = Run(start_R, capacity, identity, same, keep=2, support=support)
        runs.append(R)
    while True:
        active = [run for run in runs if not run.done]
        if not active:
            break
        step(grams, active)
        # G's rows settle only at its checks (Run.after_step): between them nothing to ask
        # the device, which would wait for it at every step.
        if top is None and (G.done or (G.krylov.size in CHECKS and bool(G.settled.all()))):
            u = G.result.vectors[:, 0, 0]
            index = torch.nonzero(~G.settled).flatten()
            if len(index):
                u = u.index_copy(0, index, _exact_top(grams.dense_X(), index)[1])
            top = _direction(grams, u, Xm, buffer)
            if residual and k > 1:
                start = grams.project(start_1)
                G1 = Run(
                    start,
                    capacity,
                    grams.project,
                    grams.residual,
                    keep=2,
                    support=support,
                    skip=identical,
                )
                runs.append(G1)
    if residual:
        top.mu1 = R.result.values[:, 0, 0].clamp(min=0.0)
        index = torch.nonzero(~R.settled).flatten()
        if len(index):
            exact = eigvalsh(take_rows(grams.G_R, index))[0][:, 0].clamp(min=0.0)
            top.mu1 = top.mu1.index_copy(0, index, exact)
        top.s2 = frobenius(top.R1) if k == 1 else _second(G1, top, grams.wide, identical)
    if estimate:
        top.deflation = G.krylov.ritz(deflation)
    return top


def _dense(grams, Xm, buffer, residual: bool) -> _Top:
    """What top_of_spectrum gives, from dense eigensolves of the k x k Gram matrices (small k on
    a CPU): u_1 by inverse iteration at eigvalsh's lambda_1 (as the Krylov path's fallback),
    ||R||_2^2 = lambda_1(G_R), and ||R_1||_2 = s_2 as sqrt(lambda_2(G)) where G resolves it
    (_SECOND_FROM_G), else from R_1's own Gram matrix."""
    G = grams.dense_X()
    lam = eigvalsh(G)[0]
    top = _direction(grams, top_vector(G, lam[:, 0]), Xm, buffer)
    top.gram, top.gram_values = G, lam
    if residual:
        top.mu1 = eigvalsh(grams.G_R)[0][:, 0].clamp(min=0.0)
        second = lam[:, 1] if lam.shape[-1] > 1 else torch.zeros_like(lam[:, 0])

        def own_gram(index: Tensor) -> Tensor:
            G1 = gram(take_rows(top.R1, index), grams.wide)
            values = eigvalsh(G1)[0]
            top.r1 = (index, G1, values)  # for the exact effective rank's deflation
            return values[:, 0].clamp(min=0.0).sqrt()

        # NaN-safe: a row where the comparison fails takes R_1's own Gram matrix.
        where = ~(second >= _SECOND_FROM_G * lam[:, 0])
        top.s2 = fix_rows(where, second.clamp(min=0.0).sqrt(), own_gram)
    return top


def _direction(grams, u: Tensor, Xm, buffer) -> _Top:
    """From a unit u_1 (token side) or v_1 (hidden side): s_1, and R_1 = P X explicitly."""
    # One power step: Q y carries the basis' rounding, ~k eps; G u / ||G u|| leaves eps plus
    # lambda_i / lambda_1 of it (a nearly rank-one X then gives R_1 at rounding level).
    u = unit(grams.X(grams.product(u[:, None, :]), u[:, None, :]))[:, 0]
    if grams.wide:  # u_1 lives on tokens; make it exactly 0 on padded rows
        u = u * grams.m[:, 0]
        image = (u[:, None, :] @ Xm)[:, 0, :]  # u^T X = s_1 v_1^T
        R1 = torch.addcmul(Xm, u[:, :, None], image[:, None, :], value=-1.0, out=buffer)
    else:
        image = (Xm @ u[:, :, None])[..., 0]  # X v = s_1 u_1
        R1 = torch.addcmul(Xm, image[:, :, None], u[:, None, :], value=-1.0, out=buffer)
    grams.set_direction(u)
    s1 = torch.linalg.vector_norm(image, dim=-1)
    return _Top(u, image, s1, R1, None, None, None)


def _second(G1: Run, top: _Top, wide: bool, identical: Tensor | None) -> Tensor:
    """s_2 = ||R_1||_2 from G_1's run; R_1's own Gram matrix where that is not accurate."""
    if G1.result is None:  # every row was skipped (identical tokens): nothing was frozen
        lam = torch.zeros_like(top.mu1)
    else:
        lam = G1.result.values[:, 0, 0].clamp(min=0.0)
    # Rows where the factored G_1's rounding, eps mu_1, is too large for s_2, that have not
    # converged, or whose tokens are identical: R_1's own Gram matrix, exactly.
    refit = (top.mu1 > _FACTORED_LIMIT * lam) | ~G1.settled
    if identical is not None:
        refit |= identical
    index = torch.nonzero(refit).flatten()
    if len(index):
        rest = take_rows(top.R1, index)
        exact = eigvalsh(gram(rest, wide))[0][:, 0].clamp(min=0.0)
        lam = lam.index_copy(0, index, exact)
    return lam.sqrt()
