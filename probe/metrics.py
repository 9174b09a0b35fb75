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

What each metric costs (T tokens, H hidden, k = min(T, H), per sequence)
---------------------------------------------------------------------------
Only the effective rank needs the whole spectrum; nothing else waits for one.

* cosine similarity: O(T H) passes over X.
* relative residual (every norm, both fits) and stable rank: O(T H) passes, one Gram matrix
  (T H k flops, a matmul) and about 30-60 Krylov steps, each one product of the k x k Gram
  matrix with a few vectors ("matmul-shaped").  No eigendecomposition of a k x k matrix.
* effective rank, ``"estimate"``: the same Gram matrix, 32 more Krylov steps and 20 steps of a
  block of 16 probe vectors (matmuls of k x k by k x 16).
* effective rank, ``"exact"``: a full symmetric eigenvalue problem per sequence, O(k^3) at
  LAPACK's speed (a few GFLOP/s on a CPU core, far less per flop than a matmul).  ``"auto"``
  (the default) takes it where it is the cheaper of the two -- on a CPU for k <= 256 -- and the
  estimate elsewhere.

How the top of the spectrum is found (relative residual, stable rank)
----------------------------------------------------------------------
Let R = X - 1 mean^T be the mean residual (mean over real tokens), G_R its k x k Gram matrix (R R^T
when tokens <= hidden, else R^T R) -- one batched matmul, formed from R so that it is accurate to
eps of R's own size however small R is.  Three symmetric positive semi-definite operators are
applied through G_R alone, with no further matmul over X:

* X's Gram matrix G.  X = R + m mean^T (m the real-token indicator), so
  X X^T w = G_R w + m (g.w) + (g + |mean|^2 m)(m.w) with g = R mean, and X^T X w = G_R w +
  n mean (mean.w).  Rounding: eps lambda_1(X), that of a Gram matrix formed from X.
* G_R itself: ||R||_2^2 = mu_1(G_R).
* The rank-one residual's Gram matrix G_1.  R_1 = (I - u u^T) X = P X on the token side, or
  X (I - v v^T) on the hidden side, so G_1 = P G P; written as P (G_R w' + g (Pm.w') + Pm (g.w' +
  |mean|^2 Pm.w')) with w' = P w (token side) or P G_R P w + n Pmean (Pmean.w) (hidden side),
  every term is at most of the size of ||R||^2 (beta s_1 <= ||R||_2 for beta the sine between
  u_1 and the uniform direction), so its rounding is eps ||R||_2^2, not eps s_1^2.
  s_2 = ||R_1||_2 = sqrt(lambda_1(G_1)) is then accurate to eps (||R||_2 / s_2)^2 relative;
  where ||R||_2^2 > 1e4 s_2^2 (X nearly rank one but its tokens not nearly equal) G_1 is
  formed from the explicit R_1 instead (accurate to eps s_1 absolute, as the SVD reference).

Each top eigenpair comes from the Lanczos method with full reorthogonalisation (classical
Gram-Schmidt twice) and Rayleigh-Ritz on the whole Krylov basis: Q^T A Q from the stored
products A Q, so a breakdown (an invariant subspace, common in collapsed layers) leaves the
projection exact.  One step applies G_R to the current vector of every problem at once.  The
Ritz pair (theta, y) with residual r = A y - theta y is accepted when theta is accurate to
1e-13 relative by the Kato-Temple estimate ||r||^2 / gap <= 1e-13 theta (gap: to the next Ritz
value), and, for u_1, the vector to 1e-11 (||r|| / gap), or when ||r|| is at rounding level.  Each
sequence's values are frozen at the check where it converges, so a sequence gives the same
numbers alone as in any batch.  On real hidden states it takes 3-10 steps for G (lambda_1
dominates: the mean direction) and 10-45 for G_R (a flat top, mu_2 / mu_1 ~ 0.98 in
bert-base at random init).  A sequence that has not converged after KRYLOV_STEPS gets the
exact eigensolver (eigvalsh; inverse iteration for u_1), so every value is accurate as stated.
On a CPU up to k = DENSE_UP_TO the Krylov loop is skipped: the same three quantities come
from dense eigensolves (lambda_1 of X's Gram matrix by eigvalsh and u_1 by inverse iteration,
lambda_1 of G_R, and s_2^2 as lambda_2 of X's Gram matrix where lambda_2 >= 1e-2 lambda_1, else
lambda_1 of R_1's own Gram matrix, whose eigenvalues the exact effective rank's deflation then
reuses), which cost less there than a loop of up to k steps; the accuracy tests run both ways
at the same tolerances.
Then s_1 = ||X^T u_1|| (||X v_1||), a Rayleigh quotient, R_1 = P X is formed explicitly for its l1,
linf and Frobenius norms, and the stable rank is ||X||_F^2 / s_1^2.

Effective rank
--------------
``"exact"``: the eigenvalues lambda_i of G (eigvalsh: a tridiagonalisation, no eigenvectors).
sqrt(lambda_i) has relative error ~eps lambda_1 / lambda_i: fine (<= ~1e-10) where every
nonzero lambda_i >= 1e-6 lambda_1 (a sequence with n real tokens has at most n nonzero ones).
Elsewhere (rank deficiency) those sequences get s_i = ||X^T w_i|| over G's eigenvectors, whose
error is eps s_1 plus the square of the eigenvector error; and a nearly collapsed X (s_2 < 1e-2
s_1) takes s_2.. from the explicit R_1 = P X by the same method on R_1's own Gram matrix: eps s_2
rather than eps s_1.  Relative error <= 1e-8 against the SVD reference.

``"estimate"``: stochastic Lanczos quadrature (Ubaru, Chen & Saad 2017), a matmul-only estimate
of the two spectral sums it needs, sum_i s_i = tr G^(1/2) and sum_i s_i log s_i = tr f(G) with
f(lambda) = sqrt(lambda) log sqrt(lambda).  Three reductions of its variance:

* deflation: the top Ritz pairs of G that have converged (residual <= 1e-3 theta_i, found by
  32 Krylov steps that run in the same products as the other problems) are counted exactly,
  and the probes live in their orthogonal complement (dimension d = n real tokens or H, minus
  those pairs);
* each of 16 fixed probes z (seeded Gaussian, projected, normalised: z^T I z = 1 exactly) gives
  z^T f(C) z by 20-node Gauss quadrature, e_1^T f(Q^T C Q) e_1 over its own Krylov basis, with
  C = P G P the deflated operator; the trace is d times the mean over probes;
* control variates: tr C and tr C^2 are known exactly (||R_1||_F^2, ||G_1||_F^2 and the
  deflated pairs; ||G_1||_F^2 from G_R times three vectors, never forming G_1), and their probe
  estimates, regressed against those of the two sums, correct them.

Then log erank = log N - E / N with N, E the two sums, clamped to [1, rank bound].  Accuracy
(tests/test_metrics.py, against the SVD reference on spectra shaped like real hidden states --
a few outliers over a Marchenko-Pastur bulk, partly and fully collapsed): relative error within
2% per sequence, typically 0.1-0.5% at k = 512; fully collapsed sequences (erank ~ 1) to 1e-4.
The probes are the same for every sequence, so a sequence's estimate depends on the batch it
came in only through rounding (which can tip a borderline Ritz pair in or out of the deflated
top): relative 1e-4 at most (4e-6 measured), far below the estimate's error.

CPU and CUDA
------------
Everything runs on X's device with the same code.  The products (the Gram matrix, the Krylov
steps, the passes over X) stay there; the small dense eigenproblems (Rayleigh-Ritz on each
Krylov basis, at most 128 x 128, the quadrature's 20 x 20, the exact effective rank's k x k) go
to the host's LAPACK through ``_lapack`` -- on a CPU split over its threads, from CUDA copied
to the host, where they are faster than cuSOLVER's one-matrix-at-a-time solvers.  A Krylov
run checks its convergence every 4 steps, which on CUDA makes the host wait for the device;
``probe.analyses.collapse`` therefore never calls these functions inside a CUDA layer loop
(it measures a batch's layers after the batch, on a side stream, while the next one runs).

Two things apply to a CPU only.  torch hands LAPACK one small matrix at a time, and MKL threads
each of those poorly: eigensolves are cut into one piece per thread and run in a small pool
whose threads each run LAPACK serially (``_lapack``), which leaves every matrix's result as it
would be alone.  And the (sequence, token, hidden) float64 buffers are reused from call to call
(``_workspace``): fresh ones cost a page fault per 4 KiB, more than the pass that fills them.

Accuracy (tests/test_metrics.py checks it against the NumPy SVD oracle): relative error
<= 1e-10 in residual ratios above 1e-6 and absolute <= 1e-14 below (the float64 reference itself
is accurate to about eps ||X|| in the residual), relative <= 1e-8 in stable rank and exact
effective rank, for random, nearly collapsed (1e-12), float32-floor (1e-7), partly collapsed,
nearly rank-one and padded inputs.  Near-ties s_1 ~ s_2 make u_1 (and the reference's)
ill-determined, which moves only the l1/linf residuals of ``fit="svd"``.

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

import ctypes
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from .names import EFFECTIVE_RANK_METHODS, FITS, METRICS, NORMS

_F64 = torch.float64
_EPS = torch.finfo(_F64).eps
# Sequences whose largest entry lies within 2^+-_SAFE_EXPONENT need no rescaling: squares and
# sums of squares of up to 2^100 entries stay far from float64 under- and overflow.
_SAFE_EXPONENT = 256
# Exact effective rank: deflate (see _all_singular_values) where s_2 / s_1 < DEFLATE: then
# lambda_2 / lambda_1 < 1e-4, and a trailing eigenvector mixed by rounding (eps lambda_1 / gap)
# could move s_2 by more than the 1e-10 relative accuracy asked for.
DEFLATE = 1e-2
# Below this lambda_i / lambda_1, sqrt(lambda_i) is not accurate enough for the effective rank.
RESOLVED = 1e-6

# Krylov runs.  At most KRYLOV_STEPS products per problem; with k <= KRYLOV_STEPS the basis
# fills the space and Rayleigh-Ritz is exact.  Convergence is checked after the steps in CHECKS
# (each check is one small eigh per sequence).  128: a flat top (a Marchenko-Pastur bulk at
# k = 2048) needs 65-128 steps for s_2, which cost ~1 s there against ~4 s for the eigensolve
# a sequence left unconverged would get.
KRYLOV_STEPS = 128
CHECKS = tuple(range(4, KRYLOV_STEPS + 1, 4))
VALUE_TOL = 1e-11  # Kato-Temple estimate of theta_1's relative error (ratios need 2e-10)
VECTOR_TOL = 1e-11  # ||r|| / gap: the sine of u_1's error
# A residual this small relative to theta_1 is rounding: the products A Q carry ~eps ||A||
# per entry, about sqrt(k) eps ||A|| in a k-vector's norm.
_ROUNDING = 64 * _EPS
# G_1 through G_R loses eps (||R||_2 / s_2)^2 relative in s_2^2; beyond this ratio it is formed
# from the explicit R_1.
_FACTORED_LIMIT = 1e4

# The estimate's control variate ||G_1||_F^2 comes from G_R as a difference of terms up to
# ||M||_F^2 (_Grams.fro2_residual), rounded to ~eps ||M||_F^2; below this fraction of it
# (relative error then up to ~1e-8, against the estimate's 2%) it is formed from R_1 instead.
_CANCELLED = 1e-8

# Dense path: where lambda_2(G) / lambda_1(G) is at least this, s_2 = sqrt(lambda_2(G)), which
# G's eigensolve already gave: its rounding, a few eps lambda_1 (the product and the solver),
# is then below 1e-13 of lambda_2.  Below it, s_2 comes from R_1's own Gram matrix, accurate
# however small R_1 is (a collapsed sequence).
_SECOND_FROM_G = 1e-2

# Effective rank estimate (see the module docstring).
EXACT_UP_TO = 256  # "auto" on a CPU: exact spectra up to this k, where they cost no more
#: Up to this k on a CPU the top singular pair and the residuals' spectral norms come from
#: dense eigensolves, not the Krylov loop: measured on this project's 2-core CPU, a batch
#: of 16 x 128 x 768 took 163 ms through Krylov against about 40 ms dense.
DENSE_UP_TO = 256
DEFLATION_STEPS = 32
DEFLATION_TOL = 1e-3
PROBES = 16
QUADRATURE_STEPS = 20
_SEED = 20210302  # fixed probes and start vectors: the same numbers on every run
_GRAM_BLOCK = 128  # rows per block of a large Gram product (_gram)


def _check_name(name: str, valid: tuple[str, ...], what: str) -> None:
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid {what}s: {', '.join(valid)}")


# ------------------------------------------------------------------------- CPU machinery

_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, int] | None = None  # (pid, threads) it was made for


def _lapack(fn, *problems: Tensor) -> list:
    """``[fn(P) for P in problems]`` for a batched LAPACK routine, split over the CPU's threads.

    On a CPU, torch hands LAPACK one small matrix at a time; each batch is cut into one piece
    per thread and the pieces run at once in a pool whose threads run LAPACK serially
    (``_serial_lapack``): on 2 cores, half the time of the plain batched call, a third of it
    when MKL would thread each small matrix itself.  Every matrix is solved exactly as it
    would be alone, so results do not depend on the split.  Problems on CUDA are solved on the
    host the same way and copied back: cuSOLVER batches only matrices up to 32 x 32 and
    solves larger ones one at a time, slower than the host's cores (the copies are k^2 per
    sequence, against the T H k of the Gram matrix the GPU formed).
    """
    device = problems[0].device
    if device.type != "cpu":
        host = _lapack(fn, *(P.cpu() for P in problems))
        return [_to_device(result, device) for result in host]
    threads = torch.get_num_threads()
    if threads < 2:
        return [fn(P) for P in problems]
    # Even a single matrix goes to the pool: every matrix is then solved by serial LAPACK,
    # whose rounding does not depend on the batch it came in or the number of threads.
    workers = min(threads, max(P.shape[0] for P in problems))
    global _POOL, _POOL_KEY
    # A forked child inherits the pool object but none of its threads: it makes its own.
    if _POOL_KEY != (os.getpid(), threads):
        _POOL = ThreadPoolExecutor(
            threads, thread_name_prefix="probe-lapack", initializer=_serial_lapack
        )
        _POOL_KEY = (os.getpid(), threads)
    futures = [[_POOL.submit(fn, piece) for piece in P.tensor_split(workers)] for P in problems]
    results = []
    for pending in futures:
        parts = [future.result() for future in pending]
        if isinstance(parts[0], Tensor):
            results.append(torch.cat(parts))
        else:
            results.append(tuple(torch.cat(pieces) for pieces in zip(*parts, strict=True)))
    return results


def _to_device(result, device: torch.device):
    if isinstance(result, Tensor):
        return result.to(device)
    return tuple(part.to(device) for part in result)


def _serial_lapack() -> None:
    # In each worker, MKL's LAPACK runs one thread per matrix: for matrices this small its
    # own threading costs more than it gains (2-3x slower on 2 cores), and the workers already
    # share the cores between them.  mkl_set_num_threads_local is MKL's per-thread setting,
    # exported by the x86 CPU builds of torch; torch.set_num_threads would change the whole
    # process.  Other builds (OpenBLAS) keep their defaults.
    try:
        library = ctypes.CDLL(
            os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        )
        library.mkl_set_num_threads_local(ctypes.byref(ctypes.c_int(1)))
    except (OSError, AttributeError):
        pass


_SCRATCH = threading.local()


def _workspace(like: Tensor, count: int) -> list[Tensor]:
    """``count`` float64 tensors shaped like ``like``, reused from call to call on a CPU.

    A fresh (sequence, token, hidden) tensor costs a page fault per 4 KiB on first touch,
    more than the pass that fills it; a layer-by-layer analysis asks for the same shapes
    over and over.  Only the latest shape is kept (per thread).  On CUDA the caching
    allocator already reuses memory.
    """
    if like.device.type != "cpu":
        return [torch.empty(like.shape, dtype=_F64, device=like.device) for _ in range(count)]
    cached = getattr(_SCRATCH, "tensors", [])
    if not cached or cached[0].shape != like.shape:
        cached = []
    while len(cached) < count:
        cached.append(torch.empty(like.shape, dtype=_F64))
    _SCRATCH.tensors = cached
    return cached[:count]


_FIXED: dict[tuple, Tensor] = {}


def _fixed(shape: tuple[int, ...], device: torch.device, salt: int) -> Tensor:
    """A fixed pseudo-random Gaussian tensor (drawn once on the CPU, kept per device)."""
    key = (shape, str(device), salt)
    if key not in _FIXED:
        generator = torch.Generator().manual_seed(_SEED + salt)
        _FIXED[key] = torch.randn(shape, generator=generator, dtype=_F64).to(device)
    return _FIXED[key]


# ------------------------------------------------------------------------------ norms


def _eigvalsh(*G: Tensor) -> list[Tensor]:
    """Eigenvalues of each batch of symmetric matrices, descending."""
    return [lam.flip(-1) for lam in _lapack(torch.linalg.eigvalsh, *G)]


def _tall(A: Tensor) -> Tensor:
    # LAPACK's divide-and-conquer SVD is 2-3x faster on tall matrices than on wide ones;
    # singular values are transpose-invariant.
    return A if A.shape[-2] >= A.shape[-1] else A.mT


def _l1(A: Tensor) -> Tensor:
    return A.abs().sum(-2).amax(-1)


def _linf(A: Tensor) -> Tensor:
    return A.abs().sum(-1).amax(-1)


def _l1_linf(A: Tensor, scratch: Tensor | None = None) -> tuple[Tensor, Tensor]:
    absolute = torch.abs(A, out=scratch)  # one pass shared by both sums
    return absolute.sum(-2).amax(-1), absolute.sum(-1).amax(-1)


def _fro(A: Tensor) -> Tensor:
    return torch.linalg.vector_norm(A, dim=(-2, -1))


def _norm_table(A: Tensor, fro: Tensor, spectral: Tensor, scratch: Tensor | None = None) -> Tensor:
    """All NORMS of A (sequence, token, hidden) as (sequence, len(NORMS))."""
    l1, linf = _l1_linf(A, scratch)
    return _table(l1, linf, fro, spectral)


def _table(l1: Tensor, linf: Tensor, fro: Tensor, spectral: Tensor) -> Tensor:
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
        return torch.linalg.svdvals(_tall(A))[..., 0]
    if norm == "fro":
        return _fro(A)
    l1, linf = _l1(A), _linf(A)
    return {"l1": l1, "linf": linf, "l1inf": torch.sqrt(l1 * linf)}[norm]


# -------------------------------------------------------------------- input, rows, modes


def _check_shapes(X: Tensor, mask: Tensor | None) -> Tensor:
    if X.ndim != 3:
        raise ValueError(
            f"X must be a 3-D tensor (sequence, token, hidden), got shape {tuple(X.shape)}"
        )
    if X.is_complex():
        raise ValueError(f"X must be real, got dtype {X.dtype}")
    if X.shape[-1] == 0:
        raise ValueError("X must have at least one hidden feature")
    if mask is None:
        return torch.ones(X.shape[:2], dtype=torch.bool, device=X.device)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
    if mask.shape != X.shape[:2]:
        raise ValueError(
            f"mask must have shape (sequence, token) = {tuple(X.shape[:2])}, "
            f"got {tuple(mask.shape)}"
        )
    return mask.to(X.device)


def _prepare(X: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate; return X in float64 with padded rows zeroed, the mask, real-token counts and
    each sequence's largest absolute entry."""
    mask = _check_shapes(X, mask)
    counts = mask.sum(-1)
    bad = torch.nonzero(counts < 2).flatten().tolist()
    if bad:
        detail = ", ".join(f"sequence {i} has {int(counts[i])}" for i in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise ValueError(f"every sequence needs at least 2 real tokens; {detail}{more}")
    if X.dtype == _F64:
        Xm = X
    else:  # converted into reused memory (never the caller's X, which stays untouched)
        Xm = _workspace(X, 3)[2].copy_(X)
    if not bool(mask.all()):
        # where/masked_fill rather than multiplying by the mask: padding may hold NaN or inf.
        if Xm is X:
            Xm = torch.where(mask[..., None], Xm, 0.0)
        else:
            Xm.masked_fill_(~mask[..., None], 0.0)
    # The largest |entry| is NaN or inf exactly when some real entry is: one pass checks both.
    flat = Xm.flatten(1)  # amax and amin: two fast passes, 4x faster than an inf-norm
    peak = torch.maximum(flat.amax(-1), -flat.amin(-1))
    if not bool(torch.isfinite(peak).all()):
        raise ValueError("X has non-finite values (NaN or inf) in real (unmasked) tokens")
    return Xm, mask, counts.to(_F64), peak


def _rescale(Xm: Tensor, peak: Tensor) -> Tensor:
    # Every metric except residual() is scale-invariant.  Scaling each sequence by a power of
    # two (exact in floating point) keeps squared entries clear of float64 under/overflow; it
    # is skipped when no sequence needs it, which leaves every result bit for bit the same.
    _, exponent = torch.frexp(peak)
    if bool((exponent.abs() <= _SAFE_EXPONENT).all()):
        return Xm
    return torch.ldexp(Xm, -exponent.clamp(min=-1021).to(_F64)[:, None, None])


def _rows(A: Tensor, index: Tensor | None) -> Tensor:
    # A[index] copies; the common case of every sequence needs no copy.
    return A if index is None or len(index) == A.shape[0] else A[index]


def _put_rows(A: Tensor, index: Tensor, values: Tensor) -> Tensor:
    return values if len(index) == A.shape[0] else A.index_copy(0, index, values)


def _fix_rows(where: Tensor, current: Tensor, compute: Callable) -> Tensor:
    """``current`` with the rows where ``where`` holds replaced by ``compute(index)``."""
    index = torch.nonzero(where).flatten()
    if len(index) == 0:
        return current
    return _put_rows(current, index, compute(index))


def _mean(Xm: Tensor, counts: Tensor) -> Tensor:
    return Xm.sum(-2) / counts[:, None]  # (sequence, hidden); padded rows are zero


def _mean_residual(
    Xm: Tensor, mask: Tensor, counts: Tensor, out: Tensor | None = None, mean: Tensor | None = None
) -> Tensor:
    mean = _mean(Xm, counts) if mean is None else mean
    # Xm - m mean^T in one fused broadcasting pass; padded rows are 0 - 0 * mean = 0.
    return torch.addcmul(Xm, mask.to(_F64)[:, :, None], mean[:, None, :], value=-1.0, out=out)


def _gram(A: Tensor, wide: bool) -> Tensor:
    """A A^T (wide) or A^T A, k x k.  From k = 2 _GRAM_BLOCK on, only the blocks on and below
    the diagonal are multiplied (each block of rows against the rows up to it) and mirrored:
    5/8 of the flops at four blocks, 13-22% less time at k = 768-512 on this project's CPU."""
    B = A if wide else A.mT
    k = B.shape[-2]
    if k < 2 * _GRAM_BLOCK:
        return B @ B.mT
    G = B.new_empty(B.shape[:-2] + (k, k))
    for start in range(0, k, _GRAM_BLOCK):
        stop = min(start + _GRAM_BLOCK, k)
        block = B[..., start:stop, :] @ B[..., :stop, :].mT
        G[..., start:stop, :stop] = block
        G[..., :start, start:stop] = block[..., :start].mT
    return G


def _trace(G: Tensor) -> Tensor:
    return G.diagonal(dim1=-2, dim2=-1).sum(-1)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1, keepdim=True)


def _unit(w: Tensor) -> Tensor:
    norm = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    # An exactly invariant subspace leaves w = 0: a zero vector, which adds nothing.
    return torch.where(norm > 0, w / torch.where(norm > 0, norm, 1.0), 0.0)


# ---------------------------------------------------------------------- the operators


class _Grams:
    """G, G_R and G_1 (module docstring), applied to (sequence, columns, k) blocks via G_R."""

    def __init__(self, G_R: Tensor, R: Tensor, mean: Tensor, mask: Tensor, counts: Tensor, wide):
        self.G_R, self.wide = G_R, wide
        self.mean, self.n = mean[:, None, :], counts[:, None, None]
        self.sq = mean.square().sum(-1)[:, None, None]  # |mean|^2
        if wide:
            self.m = mask.to(_F64)[:, None, :]  # (sequence, 1, token)
            self.g = (R @ mean[:, :, None]).mT  # R mean, (sequence, 1, token)
        # The coordinates the operators act on: real tokens (token side), every hidden unit.
        self.support = self.m if wide else None

    def product(self, W: Tensor) -> Tensor:
        """G_R W for a (sequence, columns, k) block: the one matmul of a Krylov step."""
        return (self.G_R @ W.mT).mT

    def X(self, Y: Tensor, W: Tensor) -> Tensor:
        """G W from Y = G_R W."""
        if self.wide:
            m, g = self.m, self.g
            return Y + m * _dot(g, W) + (g + self.sq * m) * _dot(m, W)
        return Y + self.n * self.mean * _dot(self.mean, W)

    def dense_X(self) -> Tensor:
        """G itself, O(k^2): the rank-2 (token side) or rank-1 update of G_R."""
        if self.wide:
            left = torch.cat([self.m, self.g], dim=1).mT  # (sequence, token, 2)
            right = torch.cat([self.g + self.sq * self.m, self.m], dim=1)  # (sequence, 2, token)
            return torch.baddbmm(self.G_R, left, right)
        return torch.baddbmm(self.G_R, (self.n * self.mean).mT, self.mean)

    def set_direction(self, u: Tensor) -> None:
        """Prepare G_1 for the top direction u (sequence, k): u_1 (token side) or v_1."""
        self.u = u[:, None, :]
        if self.wide:
            self.Pm = self.m - _dot(self.m, self.u) * self.u  # P m, small when u ~ uniform
        else:
            self.Pmean = self.mean - _dot(self.mean, self.u) * self.u

    def fro2_residual(self) -> tuple[Tensor, Tensor]:
        """||G_1||_F^2 without forming G_1, and how much of it cancelled.

        G_1 = P M P with M = G_R + A K A^T (token side: A = [g, Pm], K = [[0, 1], [1, |mean|^2]];
        hidden side: A = [P mean], K = [[n]], as P mean = P P mean).  For symmetric M and
        P = I - u u^T, ||P M P||_F^2 = tr(P M P M) = ||M||_F^2 - 2 ||M u||^2 + (u^T M u)^2, and
        every term comes from G_R times r + 1 vectors and r x r products.  Its rounding is about
        eps ||M||_F^2, so the second value, ||M||_F^2, tells the caller where the difference
        is too small to trust."""
        u = self.u
        if self.wide:
            A = torch.cat([self.g, self.Pm], dim=1)  # (sequence, 2, token)
            K = torch.zeros(A.shape[0], 2, 2, dtype=_F64, device=A.device)
            K[:, 0, 1], K[:, 1, 0], K[:, 1, 1] = 1.0, 1.0, self.sq[:, 0, 0]
        else:
            A = self.Pmean  # (sequence, 1, hidden)
            K = self.n.to(_F64)
        Y = self.product(torch.cat([A, u], dim=1))  # G_R A and G_R u
        GA, Gu = Y[:, :-1], Y[:, -1:]
        W = A @ A.mT
        KW = K @ W
        fro2_M = (
            torch.linalg.vector_norm(self.G_R, dim=(-2, -1)).square()
            + 2 * ((A @ GA.mT) * K).sum((-2, -1))  # tr(G_R A K A^T), K symmetric
            + (KW * KW.mT).sum((-2, -1))  # tr(K W K W)
        )
        a_u = A @ u.mT  # (sequence, r, 1)
        Mu = Gu + (K @ a_u).mT @ A
        uMu = (Gu * u).sum((-2, -1)) + (a_u.mT @ K @ a_u)[:, 0, 0]
        return fro2_M - 2 * Mu.square().sum((-2, -1)) + uMu.square(), fro2_M

    def project(self, W: Tensor) -> Tensor:
        return W - self.u * _dot(self.u, W)

    def residual(self, Y: Tensor, W: Tensor) -> Tensor:
        """G_1 W from Y = G_R W with W already projected (W = P W)."""
        if self.wide:
            Pm = self.Pm
            Pm_w = _dot(Pm, W)
            return self.project(Y + self.g * Pm_w + Pm * (_dot(self.g, W) + self.sq * Pm_w))
        return self.project(Y) + self.n * self.Pmean * _dot(self.Pmean, W)


@dataclass
class _Ritz:
    """The top ``count`` Ritz pairs of each row: values descending, vectors, residual norms."""

    values: Tensor  # (sequence, columns, count)
    vectors: Tensor  # (sequence, columns, count, k)
    residuals: Tensor  # (sequence, columns, count)


class _Krylov:
    """A Krylov basis per (sequence, column), grown one vector per product.

    ``support`` (sequence, 1, k), where given, is 1 on the coordinates the operator acts on
    (real tokens): restart vectors stay inside it."""

    # Below this fraction of the largest product so far, what is left of a product after
    # orthogonalisation is rounding, not a new direction: the basis is (numerically)
    # invariant, and a fixed pseudo-random vector, orthogonalised, takes its place.  Normalising
    # rounding instead would give a vector that is not orthogonal to the basis.
    BREAKDOWN = 1e-8

    def __init__(self, start: Tensor, capacity: int, support: Tensor | None = None) -> None:
        S, C, k = start.shape
        # (sequence x column, step, k): the first `size` rows of each slab are the basis, a
        # plain 3-D layout that bmm reads in place.
        self.basis = start.new_zeros(S * C, capacity, k)
        self.images = start.new_zeros(S * C, capacity, k)
        self.scale = start.new_zeros(S * C, 1, 1)
        self.shape = (S, C, k)
        self.size, self.capacity = 0, capacity
        self.support = None if support is None else support.expand(S, C, k).reshape(S * C, 1, k)
        self.next = _unit(start)

    @property
    def full(self) -> bool:
        return self.size == self.capacity

    def _orthogonal(self, w: Tensor) -> Tensor:
        """w (S x C, 1, k) made orthogonal to the basis: classical Gram-Schmidt twice, which
        leaves it orthogonal to rounding level.  Row vectors: (w Q^T) Q reads the basis slab
        in place, several times faster than Q^T (Q w^T) with its transposed operand."""
        Q = self.basis[:, : self.size]
        for _ in range(2):
            w = w - (w @ Q.mT) @ Q
        return w

    def extend(self, image: Tensor) -> None:
        """Record A q for q = self.next and make the next basis vector."""
        S, C, k = self.shape
        j = self.size
        self.basis[:, j] = self.next.reshape(S * C, k)
        self.images[:, j] = image.reshape(S * C, k)
        self.size = j + 1
        if self.full:
            return
        w = image.reshape(S * C, 1, k)
        self.scale = torch.maximum(self.scale, torch.linalg.vector_norm(w, dim=-1, keepdim=True))
        w = self._orthogonal(w)
        broken = torch.linalg.vector_norm(w, dim=-1, keepdim=True) <= self.BREAKDOWN * self.scale
        if bool(broken.any()):
            restart = _fixed((1, k), image.device, 100 + j).expand_as(w)
            if self.support is not None:
                restart = restart * self.support
            w = torch.where(broken, self._orthogonal(restart), w)
        self.next = _unit(w.reshape(S, C, k))

    def _slabs(self) -> tuple[Tensor, Tensor]:
        S, C, k = self.shape
        j = self.size
        return (
            self.basis[:, :j].reshape(S, C, j, k),
            self.images[:, :j].reshape(S, C, j, k),
        )

    def projection(self) -> tuple[Tensor, Tensor]:
        """Rayleigh-Ritz: eigenvalues (descending) and eigenvectors of Q^T A Q."""
        Q, AQ = self._slabs()
        H = Q @ AQ.mT
        H = (H + H.mT) / 2
        S, C, j, _ = H.shape
        [(theta, Y)] = _lapack(torch.linalg.eigh, H.reshape(S * C, j, j))
        return theta.flip(-1).reshape(S, C, j), Y.flip(-1).reshape(S, C, j, j)

    def ritz(self, count: int) -> _Ritz:
        theta, Y = self.projection()
        count = min(count, self.size)
        Yc = Y[..., :count]  # (S, C, j, count)
        Q, AQ = self._slabs()
        vectors = Yc.mT @ Q
        residuals = torch.linalg.vector_norm(
            Yc.mT @ AQ - theta[..., :count, None] * vectors, dim=-1
        )
        return _Ritz(theta[..., :count], vectors, residuals)


def _converged(ritz: _Ritz, vector: bool) -> Tensor:
    """Per row (column 0): is the top Ritz value (and vector, if asked) accurate as stated?"""
    theta, rho = ritz.values[:, 0], ritz.residuals[:, 0]
    lam, r = theta[:, 0].abs(), rho[:, 0]
    rounding = r <= _ROUNDING * lam
    if theta.shape[-1] == 1:  # one vector: nothing is known about the rest of the spectrum
        return rounding
    gap = theta[:, 0] - theta[:, 1]
    # Kato-Temple: |lambda - theta| <= ||r||^2 / gap; never more than ||r|| itself.
    ok = (r.square() <= VALUE_TOL * lam * torch.maximum(gap, r)) | rounding
    if vector:
        ok &= (r <= VECTOR_TOL * gap) | rounding
    return ok


class _Run:
    """One Lanczos problem: its operator (through G_R), its basis, what it must return."""

    def __init__(
        self,
        start: Tensor,
        capacity: int,
        pre: Callable[[Tensor], Tensor],
        post: Callable[[Tensor, Tensor], Tensor],
        *,
        vector: bool = False,
        keep: int = 1,
        at_least: int = 0,
        support: Tensor | None = None,
    ) -> None:
        self.krylov = _Krylov(start, capacity, support)
        self.pre, self.post = pre, post
        self.vector, self.keep, self.at_least = vector, keep, at_least
        self.result: _Ritz | None = None
        self.settled = torch.zeros(start.shape[0], dtype=torch.bool, device=start.device)
        self.done = False

    @property
    def columns(self) -> int:
        return self.krylov.next.shape[1]

    def _freeze(self, final: bool = False) -> None:
        """Take the Ritz pairs of the rows that have converged now; keep the earlier ones.

        ``final``: rows still unconverged take these pairs too (and stay unsettled)."""
        ritz = self.krylov.ritz(self.keep)
        converged = _converged(ritz, self.vector)
        now = converged & ~self.settled
        if self.result is None or self.result.values.shape[-1] != ritz.values.shape[-1]:
            # The basis only grows: earlier rows are padded to the larger count of pairs.
            self.result = _pad(self.result, ritz.values.shape[-1], ritz)
        pick = (~self.settled if final else now).view(-1, 1, 1)
        self.result = _Ritz(
            torch.where(pick, ritz.values, self.result.values),
            torch.where(pick[..., None], ritz.vectors, self.result.vectors),
            torch.where(pick, ritz.residuals, self.result.residuals),
        )
        self.settled |= now

    def after_step(self) -> None:
        """Check convergence (at CHECKS) and decide whether to stop."""
        size = self.krylov.size
        if self.krylov.full:
            self._freeze(final=True)
            self.done = True
        elif size in CHECKS:
            if not bool(self.settled.all()):
                self._freeze()
            self.done = bool(self.settled.all()) and size >= self.at_least


def _pad(previous: _Ritz | None, count: int, like: _Ritz) -> _Ritz:
    if previous is None:
        return _Ritz(
            torch.zeros_like(like.values),
            torch.zeros_like(like.vectors),
            torch.full_like(like.residuals, math.inf),
        )
    extra = count - previous.values.shape[-1]
    return _Ritz(
        torch.nn.functional.pad(previous.values, (0, extra)),
        torch.nn.functional.pad(previous.vectors, (0, 0, 0, extra)),
        torch.nn.functional.pad(previous.residuals, (0, extra), value=math.inf),
    )


def _step(grams: _Grams, runs: list[_Run]) -> None:
    """Grow every run's basis by one vector, all through one product with G_R."""
    W = torch.cat([run.pre(run.krylov.next) for run in runs], dim=1)
    Y = grams.product(W)
    first = 0
    for run in runs:
        cols = slice(first, first + run.columns)
        run.krylov.extend(run.post(Y[:, cols], W[:, cols]))
        first = cols.stop
        run.after_step()


def _identity(W: Tensor) -> Tensor:
    return W


def _same(Y: Tensor, W: Tensor) -> Tensor:
    return Y


# ------------------------------------------------------------------ exact (LAPACK) paths


def _top_vector(G: Tensor, lam1: Tensor, steps: int = 3) -> Tensor:
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
    LU, pivots = torch.linalg.lu_factor(shifted)
    # A fixed start with a component along every direction (all ones would miss a u_1 that
    # is orthogonal to it).
    start = 1.0 + 0.5 * torch.cos(torch.arange(k, dtype=G.dtype, device=G.device) * 2.3)
    x = start.expand(G.shape[0], k)[..., None]
    for _ in range(steps):
        x = torch.linalg.lu_solve(LU, pivots, x)
        x = x / torch.linalg.vector_norm(x, dim=-2, keepdim=True)
    return x[..., 0]


def _accurate(A: Tensor, G: Tensor, count: int, wide: bool) -> Tensor:
    """The top ``count`` singular values of A as ||A^T w_i|| over G's eigenvectors."""
    [(_, W)] = _lapack(torch.linalg.eigh, G)
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
    known), as in _all_singular_values."""
    lam = (_eigvalsh(G)[0] if lam is None else lam)[..., :count]
    S = lam.clamp(min=0.0).sqrt()
    if full and count > 1:
        S = _fix_rows(
            lam[..., -1] < RESOLVED * lam[..., 0],
            S,
            lambda index: _accurate(_rows(A, index), _rows(G, index), count, wide),
        )
    return S


def _row_norms(A: Tensor, W: Tensor, wide: bool) -> Tensor:
    """||A^T w|| (wide) or ||A w|| for each column w of W: singular values of A (see above)."""
    if wide:
        return torch.linalg.vector_norm(W.mT @ A, dim=-1)
    return torch.linalg.vector_norm(A @ W, dim=-2)


def _all_singular_values(
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
    lam = _eigvalsh(G)[0] if lam is None else lam
    k = lam.shape[-1]
    if k == 1:
        return s1[:, None]
    S = torch.cat([s1[:, None], lam[..., 1:].clamp(min=0.0).sqrt()], dim=-1)
    lam1 = lam[..., 0]
    deflate = (lam[..., 1] < DEFLATE**2 * lam1) & (lam1 > 0)
    smallest = lam.gather(-1, (rank - 1)[:, None])[:, 0]
    S = _fix_rows(
        (smallest < RESOLVED * lam1) & ~deflate,
        S,
        lambda index: _accurate(_rows(Xm, index), _rows(G, index), k, wide),
    )

    def deflated(index):
        rest = _rows(R1, index)
        known = _known_rows(r1, index)
        G1, lam1 = known if known is not None else (_gram(rest, wide), None)
        # R_1's Gram matrix has one more null direction (u_1): its top k - 1 values.
        values = _spectrum(rest, G1, k - 1, wide, True, lam1)
        return torch.cat([_rows(S, index)[:, :1], values], dim=-1)

    S = _fix_rows(deflate, S, deflated)
    # past the rank bound the values are zero (rounding aside)
    S = torch.where(torch.arange(k, device=S.device) < rank[:, None], S, 0.0)
    return torch.sort(S, dim=-1, descending=True).values


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


# ------------------------------------------------------------------- the top of the spectrum


def _starts(grams: _Grams) -> tuple[Tensor, Tensor, Tensor]:
    """Fixed starts: for G near the mean direction (where u_1 / v_1 usually lies), for G_R and
    G_1 pseudo-random (on real tokens)."""
    S, k = grams.G_R.shape[0], grams.G_R.shape[-1]
    noise = [_fixed((k,), grams.G_R.device, salt).expand(S, 1, k) for salt in (1, 3)]
    if grams.wide:
        m = grams.m
        noise = [vector * m for vector in noise]  # real tokens only
        return m + 0.3 * _unit(noise[0]) * m.sum(-1, keepdim=True).sqrt(), *noise
    return _unit(grams.mean) + 0.3 * _unit(noise[0]), *noise


def _exact_top(G: Tensor, index: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fallback: lambda_1 by eigvalsh and its eigenvector by inverse iteration."""
    G = _rows(G, index)
    lam = _eigvalsh(G)[0]
    return lam[:, 0], _top_vector(G, lam[:, 0])


@dataclass
class _Top:
    """What the Krylov work of a batch gives (module docstring)."""

    u: Tensor  # u_1 (token side, zero on padding) or v_1 (hidden side), (sequence, k)
    image: Tensor  # u_1^T X = s_1 v_1^T, or X v_1 = s_1 u_1
    s1: Tensor
    R1: Tensor  # the rank-one residual, explicit (in the shared buffer)
    mu1: Tensor | None  # lambda_1(G_R) = ||R||_2^2, with the residual
    s2: Tensor | None  # ||R_1||_2, with the residual
    deflation: _Ritz | None  # G's top Ritz pairs, for the estimate
    # The dense path's Gram matrix of X and its eigenvalues (descending), which the exact
    # effective rank reuses instead of solving the same problem again.
    gram: Tensor | None = None
    gram_values: Tensor | None = None
    # The dense path's Gram matrices of R_1 (rows ``index``) and their eigenvalues, formed for
    # s_2 of collapsed sequences, which the exact effective rank's deflation reuses.
    r1: tuple[Tensor, Tensor, Tensor] | None = None


def _spectral(grams, Xm, buffer, counts, residual, estimate) -> _Top:
    """Every Krylov problem of a batch in one loop of products with G_R.

    G's run gives u_1 within a few steps; then G_1's run starts (it needs u_1) beside G_R's.
    For the estimate G's run goes on to DEFLATION_STEPS vectors.  A run stops once every
    sequence has converged; each step multiplies G_R by the current vectors of all runs at
    once.  Sequences a run leaves unconverged get the exact eigensolver."""
    k = grams.G_R.shape[-1]
    if not estimate and Xm.device.type == "cpu" and k <= DENSE_UP_TO:
        return _dense(grams, Xm, buffer, residual)
    capacity = min(KRYLOV_STEPS, k)
    deflation = min(DEFLATION_STEPS, capacity) if estimate else 0
    start_G, start_R, start_1 = _starts(grams)
    support = grams.support
    G = _Run(
        start_G,
        capacity,
        _identity,
        grams.X,
        vector=True,
        keep=max(2, deflation),
        at_least=deflation,
        support=support,
    )
    runs = [G]
    R = G1 = top = None
    if residual:
        R = _Run(start_R, capacity, _identity, _same, keep=2, support=support)
        runs.append(R)
    while True:
        active = [run for run in runs if not run.done]
        if not active:
            break
        _step(grams, active)
        if top is None and (G.done or bool(G.settled.all())):
            u = G.result.vectors[:, 0, 0]
            index = torch.nonzero(~G.settled).flatten()
            if len(index):
                u = u.index_copy(0, index, _exact_top(grams.dense_X(), index)[1])
            top = _direction(grams, u, Xm, buffer)
            if residual and k > 1:
                start = grams.project(start_1)
                G1 = _Run(start, capacity, grams.project, grams.residual, keep=2, support=support)
                runs.append(G1)
    if residual:
        top.mu1 = R.result.values[:, 0, 0].clamp(min=0.0)
        index = torch.nonzero(~R.settled).flatten()
        if len(index):
            exact = _eigvalsh(_rows(grams.G_R, index))[0][:, 0].clamp(min=0.0)
            top.mu1 = top.mu1.index_copy(0, index, exact)
        top.s2 = _fro(top.R1) if k == 1 else _second(G1, top, grams.wide)
    if estimate:
        top.deflation = G.krylov.ritz(deflation)
    return top


def _dense(grams, Xm, buffer, residual: bool) -> _Top:
    """What _spectral gives, from dense eigensolves of the k x k Gram matrices (small k on
    a CPU): u_1 by inverse iteration at eigvalsh's lambda_1 (as the Krylov path's fallback),
    ||R||_2^2 = lambda_1(G_R), and ||R_1||_2 = s_2 as sqrt(lambda_2(G)) where G resolves it
    (_SECOND_FROM_G), else from R_1's own Gram matrix."""
    G = grams.dense_X()
    lam = _eigvalsh(G)[0]
    top = _direction(grams, _top_vector(G, lam[:, 0]), Xm, buffer)
    top.gram, top.gram_values = G, lam
    if residual:
        top.mu1 = _eigvalsh(grams.G_R)[0][:, 0].clamp(min=0.0)
        second = lam[:, 1] if lam.shape[-1] > 1 else torch.zeros_like(lam[:, 0])

        def own_gram(index: Tensor) -> Tensor:
            G1 = _gram(_rows(top.R1, index), grams.wide)
            values = _eigvalsh(G1)[0]
            top.r1 = (index, G1, values)  # for the exact effective rank's deflation
            return values[:, 0].clamp(min=0.0).sqrt()

        # NaN-safe: a row where the comparison fails takes R_1's own Gram matrix.
        where = ~(second >= _SECOND_FROM_G * lam[:, 0])
        top.s2 = _fix_rows(where, second.clamp(min=0.0).sqrt(), own_gram)
    return top


def _direction(grams, u: Tensor, Xm, buffer) -> _Top:
    """From a unit u_1 (token side) or v_1 (hidden side): s_1, and R_1 = P X explicitly."""
    # One power step: Q y carries the basis' rounding, ~k eps; G u / ||G u|| leaves eps plus
    # lambda_i / lambda_1 of it (a nearly rank-one X then gives R_1 at rounding level).
    u = _unit(grams.X(grams.product(u[:, None, :]), u[:, None, :]))[:, 0]
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


def _second(G1: _Run, top: _Top, wide: bool) -> Tensor:
    """s_2 = ||R_1||_2 from G_1's run; R_1's own Gram matrix where that is not accurate."""
    lam = G1.result.values[:, 0, 0].clamp(min=0.0)
    # Rows where the factored G_1's rounding, eps mu_1, is too large for s_2, or that have not
    # converged: R_1's own Gram matrix, exactly.
    index = torch.nonzero((top.mu1 > _FACTORED_LIMIT * lam) | ~G1.settled).flatten()
    if len(index):
        rest = _rows(top.R1, index)
        exact = _eigvalsh(_gram(rest, wide))[0][:, 0].clamp(min=0.0)
        lam = lam.index_copy(0, index, exact)
    return lam.sqrt()


# ------------------------------------------------------------------- effective rank estimate


def _deflation(ritz: _Ritz, grams: _Grams) -> tuple[Tensor, Tensor]:
    """G's top Ritz pairs after the first that the estimate counts exactly: values (zero where
    not kept) and vectors, made orthogonal to u_1."""
    theta, V, rho = ritz.values[:, 0], ritz.vectors[:, 0], ritz.residuals[:, 0]
    keep = (rho <= DEFLATION_TOL * theta) & (theta > 0)  # (S, count)
    # Only a leading run of converged pairs: a gap in it would leave a converged direction
    # inside the probes' space and count it twice.
    keep = torch.cumprod(keep.to(torch.int8), dim=-1).bool()[:, 1:]
    V = grams.project(V[:, 1:]) * keep[..., None]  # zero vectors for the pairs not kept
    return torch.where(keep, theta[:, 1:], 0.0), V


def _residual_fro2(grams: _Grams, R1: Tensor) -> Tensor:
    """||G_1||_F^2 = sum_{i>=2} s_i^4 through G_R; where ||G_1||_F^2 < _CANCELLED ||M||_F^2
    the difference has lost too much to rounding (a nearly rank-one X whose tokens are not
    nearly equal) and R_1's own Gram matrix gives it instead."""
    value, size = grams.fro2_residual()
    return _fix_rows(
        ~(value >= _CANCELLED * size),  # NaN-safe: such a row takes R_1's own Gram matrix
        value,
        lambda index: _fro(_gram(_rows(R1, index), grams.wide)).square(),
    )


def _estimate(grams: _Grams, ritz: _Ritz, real: Tensor, s1: Tensor, R1: Tensor) -> Tensor:
    """The effective rank by stochastic Lanczos quadrature (module docstring).

    s_1 is counted exactly; the rest of the spectrum is that of G_1 = P G P (R_1's Gram matrix,
    accurate to the size of R however collapsed X is), of which the converged top Ritz pairs
    of G after the first are counted exactly too, the remainder C by the probes.  ``real``:
    the dimension of the space G acts on (real tokens, or H)."""
    theta, V = _deflation(ritz, grams)
    S, k = grams.G_R.shape[0], grams.G_R.shape[-1]
    Z = _fixed((PROBES, k), grams.G_R.device, 2).expand(S, PROBES, k)
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

    nodes, weights = _gauss(apply, Z, min(QUADRATURE_STEPS, k))
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
    # of such terms, checked for cancellation in _residual_fro2).
    G1V = grams.residual(grams.product(V), V)  # G_1 v_i, zero for the pairs not kept
    fro2_G1 = _residual_fro2(grams, R1)
    exact = torch.stack(
        [
            _fro(R1).square() - theta.sum(-1),
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
    top = torch.cat([s1[:, None], theta.sqrt()], dim=-1)
    N = top.sum(-1) + sums[:, 0].clamp(min=0.0)
    E = torch.special.xlogy(top, top).sum(-1) + sums[:, 1]
    return torch.exp(torch.log(N) - E / N)


def _gauss(apply: Callable[[Tensor], Tensor], Z: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Gauss quadrature of each probe z: nodes and weights with z^T f(C) z ~ sum w f(node).

    Plain Lanczos (three-term recurrence) from z / |z|: the quadrature is robust to the loss
    of orthogonality that full reorthogonalisation would prevent, at a fraction of its cost.
    """
    q = _unit(Z)
    previous = torch.zeros_like(q)
    beta = q.new_zeros(q.shape[:-1] + (1,))
    alphas, betas = [], []
    for _ in range(steps):
        w = apply(q) - beta * previous
        alpha = _dot(q, w)
        w = w - alpha * q
        w = w - _dot(q, w) * q  # once more against q: the recurrence's weak point
        alphas.append(alpha[..., 0])
        beta = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
        betas.append(beta[..., 0])
        previous, q = q, _unit(w)
    T = torch.diag_embed(torch.stack(alphas, -1))
    off = torch.stack(betas[:-1], -1) if steps > 1 else None
    if off is not None:
        T = T + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
    shape = T.shape
    [(nodes, Y)] = _lapack(torch.linalg.eigh, T.reshape(-1, steps, steps))
    nodes = nodes.reshape(shape[:-1]).clamp(min=0.0)
    weights = Y[:, 0, :].square().reshape(shape[:-1])
    return nodes, weights


# --------------------------------------------------------------------------------- the core


def _exact_method(method: str, k: int, device: torch.device) -> bool:
    if method == "auto":
        return device.type == "cpu" and k <= EXACT_UP_TO
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
        # R and then R_1 share one buffer, |.| another (see _workspace).
        buffer, scratch = _workspace(Xm, 3)[:2]
        mean = _mean(Xm, counts)
        R = _mean_residual(Xm, mask, counts, out=buffer, mean=mean)
        # R's Gram matrix formed from R (accurate however small R is); G through it.
        G_R = _gram(R, wide)
        fro2_R = _trace(G_R)
        fro2 = fro2_R + counts * mean.square().sum(-1)  # ||X||_F^2 = ||R||_F^2 + n |mean|^2
        if residual:
            R_l1, R_linf = _l1_linf(R, scratch)
        grams = _Grams(G_R, R, mean, mask, counts, wide)
        top = _spectral(grams, Xm, buffer, counts, residual, estimate)
        s1, R1 = top.s1, top.R1
        if residual:
            R1_l1, R1_linf = _l1_linf(R1, scratch)
            R_table = _table(R_l1, R_linf, fro2_R.sqrt(), top.mu1.sqrt())
            R1_table = _table(R1_l1, R1_linf, _fro(R1), top.s2)
            tables = {"mean": R_table, "svd": R1_table}
            residuals = torch.stack([tables[fit] for fit in FITS], dim=1)
            X_l1, X_linf = _l1_linf(Xm, scratch)
            reference = _table(X_l1, X_linf, fro2.sqrt(), s1)[:, None, :]
            out["relative_residual"] = residuals / reference  # (sequence, fit, norm)
        if "stable_rank" in want:
            out["stable_rank"] = fro2 / s1**2  # 0/0 = NaN for an all-zero sequence
        if exact:
            rank = counts.to(torch.long).clamp(max=k)
            G = grams.dense_X() if top.gram is None else top.gram
            S_all = _all_singular_values(Xm, G, s1, R1, rank, wide, top.gram_values, top.r1)
            out["effective_rank"] = _effective_rank(S_all)
        elif estimate:
            real = counts if wide else torch.full_like(counts, float(k))
            value = _estimate(grams, top.deflation, real, s1, R1)
            bound = (counts if wide else counts.clamp(max=float(k))).to(_F64)
            out["effective_rank"] = torch.minimum(value.clamp(min=1.0), bound)
            out["effective_rank"] = torch.where(fro2 > 0, out["effective_rank"], math.nan)
    if "cosine_similarity" in want:
        out["cosine_similarity"] = _cosine(Xm, counts)
    return {name: out[name] for name in METRICS if name in out}


def _wanted(metrics: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    if metrics is None:
        return METRICS
    names = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    for name in names:
        _check_name(name, METRICS, "metric")
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

    Returns float64 tensors on X's device, for every name in ``metrics`` (default: all of
    METRICS; only what they need is computed):

    * ``"relative_residual"``: (sequence, len(FITS), len(NORMS)), indexed in the order of
      FITS and NORMS: ||res(X)|| / ||X|| for each fit and norm;
    * ``"effective_rank"``, ``"stable_rank"``, ``"cosine_similarity"``: (sequence,).

    ``effective_rank``: ``"exact"`` (full spectrum), ``"estimate"`` (stochastic Lanczos
    quadrature) or ``"auto"`` (exact on a CPU up to k = EXACT_UP_TO, the estimate elsewhere).
    Method, cost and accuracy: see the module docstring.  Degenerate cases follow it too.
    """
    wanted = _wanted(metrics)
    _check_name(effective_rank, EFFECTIVE_RANK_METHODS, "effective rank method")
    Xm, mask, counts, peak = _prepare(X, mask)
    return _compute(_rescale(Xm, peak), mask, counts, wanted, effective_rank)


def effective_rank_method(method: str, tokens: int, hidden: int, device: str | torch.device) -> str:
    """``"exact"`` or ``"estimate"``: what ``method`` (auto/exact/estimate) means at this size."""
    _check_name(method, EFFECTIVE_RANK_METHODS, "effective rank method")
    exact = _exact_method(method, min(tokens, hidden), torch.device(device))
    return "exact" if exact else "estimate"


# ------------------------------------------------------------------------- single metrics


def residual(X: Tensor, mask: Tensor | None = None, fit: str = "mean") -> Tensor:
    """res(X) = X - 1 x^T per sequence, float64, same shape as X, padded rows zero.

    ``fit="mean"``: x is the mean of the real tokens.  ``fit="svd"``: the subtracted matrix is
    the best rank-one approximation sigma_1 u_1 v_1^T of the real-token matrix (not unique when
    sigma_1 = sigma_2; see the module docstring).  Raises ValueError on invalid shapes, unknown
    fit, fewer than 2 real tokens in a sequence, or non-finite real tokens.
    """
    _check_name(fit, FITS, "fit")
    Xm, mask, counts, peak = _prepare(X, mask)
    mean = _mean(Xm, counts)
    R = _mean_residual(Xm, mask, counts, mean=mean)
    if fit == "mean":
        return R
    # The direction comes from the rescaled X (its Gram matrix must not overflow); the
    # projection is applied to X itself, so the residual keeps X's scale.
    wide = Xm.shape[-2] <= Xm.shape[-1]
    scaled = _rescale(Xm, peak)
    if scaled is not Xm:
        mean = _mean(scaled, counts)
        R = _mean_residual(scaled, mask, counts, mean=mean)
    grams = _Grams(_gram(R, wide), R, mean, mask, counts, wide)
    u = _spectral(grams, scaled, torch.empty_like(scaled), counts, False, False).u
    if wide:
        return Xm - u[:, :, None] * (u[:, None, :] @ Xm)
    return Xm - (Xm @ u[:, :, None]) * u[:, None, :]


def relative_residual(
    X: Tensor, mask: Tensor | None = None, norm: str = "l1inf", fit: str = "mean"
) -> Tensor:
    """||res(X)|| / ||X|| per sequence, both on real tokens, shape (sequence,), float64.

    0 means fully collapsed (all tokens equal for ``fit="mean"``, rank one for ``fit="svd"``).
    NaN (0/0) for a sequence whose real tokens are all zero.
    """
    _check_name(norm, NORMS, "norm")
    _check_name(fit, FITS, "fit")
    table = collapse_metrics(X, mask, metrics="relative_residual")["relative_residual"]
    return table[:, FITS.index(fit), NORMS.index(norm)]


def effective_rank(X: Tensor, mask: Tensor | None = None, method: str = "auto") -> Tensor:
    """Roy & Vetterli (2007) effective rank exp(-sum p_i log p_i), p_i = s_i / sum_j s_j.

    Between 1 and rank(X); shape (sequence,), float64.  NaN for an all-zero sequence.
    ``method``: see :func:`collapse_metrics`.
    """
    return collapse_metrics(X, mask, "effective_rank", method)["effective_rank"]


def stable_rank(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Stable rank sum_i s_i^2 / s_1^2 = ||X||_F^2 / ||X||_2^2.

    Between 1 and the effective rank (hence rank(X)); shape (sequence,), float64.  NaN for an
    all-zero sequence.
    """
    return collapse_metrics(X, mask, metrics="stable_rank")["stable_rank"]


def cosine_similarity(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Token uniformity: mean cosine similarity over ordered pairs i != j of real tokens.

    In [-1, 1]; 1 when all tokens point the same way.  A zero-norm token has cosine 0 with
    every other token (it still counts in the number of pairs).  Shape (sequence,), float64.
    """
    return collapse_metrics(X, mask, metrics="cosine_similarity")["cosine_similarity"]
