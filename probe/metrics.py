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

How they are computed (fast, and as exact as an SVD).  Let k = min(token, hidden), R = X - 1 mean^T
the mean residual (mean over real tokens), and G_R its k x k Gram matrix (R R^T when tokens <=
hidden, else R^T R): one batched matmul.

* X's own Gram matrix G follows from G_R in O(k^2), with no second matmul: X = R + m mean^T (m
  the real-token indicator), so X X^T = G_R + m g^T + g m^T + |mean|^2 m m^T with g = R mean,
  and X^T X = G_R + n mean mean^T.  Each term is rounded to eps of its size, at most ~eps
  lambda_1(X): the accuracy of a Gram matrix formed from X.  Formed the other way round
  (G_R from G), G_R would carry that same absolute rounding, which swamps a nearly collapsed
  R; formed from R it is accurate to eps of R's own size however small R is.
* l1, linf and Frobenius norms need no factorisation: absolute row and column sums and
  sums of squares of the explicitly formed matrices X, R and R_1 = X - sigma_1 u_1 v_1^T (each
  one fused broadcasting pass); ||X||_F^2 and ||R||_F^2 are the traces of G and G_R.
* The eigenvalues lambda_i of G and mu_i of G_R (eigvalsh: a tridiagonalisation, no
  eigenvectors); ||R||_2 = sqrt(mu_1).  The top eigenvector w_1 of G by inverse iteration
  shifted just past lambda_1 (one small LU factorisation, three solves).  w_1 is u_1 on the
  token side, v_1 on the hidden side.  The rank-one residual is the projection
  R_1 = (I - u_1 u_1^T) X (or X (I - v_1 v_1^T)), so its norms come from R_1 itself, and
  sigma_1 = ||X^T u_1|| (||X v_1||) is a Rayleigh quotient.
* The other singular values are sqrt(lambda_i) only where that is accurate.  eigvalsh is
  accurate to ~eps lambda_1 in absolute terms, so sqrt(lambda_i) has relative error
  ~eps lambda_1 / lambda_i: fine (<= ~1e-10) where every nonzero lambda_i >= 1e-6 lambda_1,
  the usual case for hidden states (a sequence with n real tokens has at most n nonzero
  ones: the rest are set to zero).  Elsewhere (rank deficiency) those sequences get the
  eigenvectors w_i of G and s_i = ||X^T w_i||, whose error is eps s_1 plus the square of the
  eigenvector error: the absolute accuracy of a backward-stable SVD (the reference's).
* A nearly collapsed X (s_2 < 1e-2 s_1) puts s_2.. at or below G's rounding, where neither
  sqrt(lambda_i) nor G's eigenvectors resolve them (the latter come out mixed).  For those
  sequences s_2.. are taken from the explicitly formed R_1 instead, whose singular values
  are exactly X's without sigma_1, by the same method on R_1's own Gram matrix: accurate to
  eps s_2 rather than eps s_1.  sigma_2 = ||R_1||_2 and all s_i for the effective rank follow;
  the stable rank is trace(G) / s_1^2.
* cosine similarity: sum_{i != j} <u_i, u_j> = ||sum_i u_i||^2 - sum_i ||u_i||^2 over the unit
  tokens u_i, where sum_i u_i is one matrix-vector product with the inverse token norms.

So per batch, typically: one k x k x hidden matmul, one batch of 2 x sequence eigvalsh and one
of LU factorisations of k x k matrices, and about a dozen passes over X -- instead of an SVD of
X and one of R per sequence, which LAPACK runs one matrix at a time with memory-bound
bidiagonalisation.  Computing only some metrics (``metrics=``) skips what they do not need.

Everything runs on X's device: the same code serves CPU and CUDA.  Two things apply to a CPU
only.  torch hands LAPACK one small matrix at a time, and MKL threads each of those poorly:
the eigensolves are cut into one piece per thread and run in a small pool whose threads each
run LAPACK serially (``_lapack``), a 2-3x gain on 2 cores that leaves every matrix's result
as it would be alone.  And the (sequence, token, hidden) float64 buffers are reused from call
to call (``_workspace``): fresh ones cost a page fault per 4 KiB, more than the pass that
fills them.

Accuracy (tests/test_metrics.py checks it against the NumPy SVD oracle): relative error
<= 1e-10 in residual ratios above 1e-6 and absolute <= 1e-14 below (the float64 reference itself
is accurate to about eps ||X|| in the residual), relative <= 1e-8 in effective and stable rank.
Where the singular values of R_1 in turn spread below sqrt(eps) s_2, eigenvectors within that
cluster mix and individual s_i there are mixtures of the true ones (their sum of squares is
kept); the effective rank then moves by at most about k * sqrt(eps) * s_2 / sum_i s_i *
log(1/eps), a regime the checks above do not reach.  Near-ties s_1 ~ s_2 make u_1 (and the
reference's) ill-determined, which moves only the l1/linf residuals of ``fit="svd"``.

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
  eigenvector the eigensolver returns (its Frobenius and spectral residuals are unaffected).
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from .names import FITS, METRICS, NORMS

_F64 = torch.float64
# Sequences whose largest entry lies within 2^+-_SAFE_EXPONENT need no rescaling: squares and
# sums of squares of up to 2^100 entries stay far from float64 under- and overflow.
_SAFE_EXPONENT = 256
# Deflate (see _Top.singular_values) where s_2 / s_1 < DEFLATE: then lambda_2 / lambda_1 < 1e-4,
# and a trailing eigenvector mixed by rounding (eps lambda_1 / gap) could move s_2 by more
# than the 1e-10 relative accuracy asked for.
DEFLATE = 1e-2
# Below this lambda_i / lambda_1, sqrt(lambda_i) is not accurate enough for the effective rank.
RESOLVED = 1e-6


def _check_name(name: str, valid: tuple[str, ...], what: str) -> None:
    if name not in valid:
        raise ValueError(f"unknown {what} {name!r}; valid {what}s: {', '.join(valid)}")


_POOL: ThreadPoolExecutor | None = None
_POOL_KEY: tuple[int, int] | None = None  # (pid, threads) it was made for


def _lapack(fn, *problems: Tensor) -> list:
    """``[fn(P) for P in problems]`` for a batched LAPACK routine, split over the CPU's threads.

    On a CPU, torch hands LAPACK one small matrix at a time; each batch is cut into one piece
    per thread and the pieces run at once in a pool whose threads run LAPACK serially
    (``_serial_lapack``): on 2 cores, half the time of the plain batched call, a third of it
    when MKL would thread each small matrix itself.  Every matrix is solved exactly as it
    would be alone, so results do not depend on the split.  On CUDA the calls are made as
    they are.
    """
    threads = torch.get_num_threads()
    if problems[0].device.type != "cpu" or threads < 2:
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


def _prepare(X: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Validate; return X in float64 with padded rows zeroed, the mask, real-token counts and
    each sequence's largest absolute entry."""
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


def _mean(Xm: Tensor, counts: Tensor) -> Tensor:
    return Xm.sum(-2) / counts[:, None]  # (sequence, hidden); padded rows are zero


def _mean_residual(
    Xm: Tensor, mask: Tensor, counts: Tensor, out: Tensor | None = None, mean: Tensor | None = None
) -> Tensor:
    mean = _mean(Xm, counts) if mean is None else mean
    # Xm - m mean^T in one fused broadcasting pass; padded rows are 0 - 0 * mean = 0.
    return torch.addcmul(Xm, mask.to(_F64)[:, :, None], mean[:, None, :], value=-1.0, out=out)


def _gram(A: Tensor, wide: bool) -> Tensor:
    return A @ A.mT if wide else A.mT @ A


def _uncentred_gram(
    G_R: Tensor, R: Tensor, mean: Tensor, mask: Tensor, counts: Tensor, wide: bool
) -> Tensor:
    """X's Gram matrix from that of its mean residual R, X = R + m mean^T, in O(k^2).

    Token side: X X^T = R R^T + m g^T + g m^T + |mean|^2 m m^T with g = R mean, written as
    G_R + [m, g] [g + |mean|^2 m, m]^T (one batched rank-2 update).  Hidden side:
    X^T X = R^T R + n mean mean^T, the cross terms R^T m being zero (R's columns sum to zero).
    Every term is rounded to eps of its size, at most ~eps lambda_1(X): the accuracy of a
    Gram matrix formed from X itself.
    """
    if wide:
        m = mask.to(_F64)
        g = (R @ mean[:, :, None])[..., 0]  # (sequence, token); zero on padded rows
        sq = mean.square().sum(-1, keepdim=True)
        left = torch.stack([m, g], dim=-1)
        right = torch.stack([torch.addcmul(g, sq, m), m], dim=-1)
        return torch.baddbmm(G_R, left, right.mT)
    return torch.baddbmm(G_R, mean[:, :, None] * counts[:, None, None], mean[:, None, :])


def _trace(G: Tensor) -> Tensor:
    return G.diagonal(dim1=-2, dim2=-1).sum(-1)


def _rows(A: Tensor, index: Tensor) -> Tensor:
    # A[index] copies; the common case of every sequence needs no copy.
    return A if len(index) == A.shape[0] else A[index]


def _put_rows(A: Tensor, index: Tensor, values: Tensor) -> Tensor:
    return values if len(index) == A.shape[0] else A.index_copy(0, index, values)


class _Top:
    """X's Gram matrix G, its eigenvalues (descending), top eigenvector, and what follows."""

    def __init__(self, mask: Tensor, counts: Tensor, G: Tensor, lam: Tensor, wide: bool) -> None:
        self.lam = lam
        self.G = G
        self.wide = wide
        # rank(X) <= real tokens: the eigenvalues past it are zero, whatever rounding says.
        self.rank = counts.to(torch.long).clamp(max=lam.shape[-1])
        w1 = _top_vector(G, lam[..., 0])
        if wide:  # w1 = u_1 lives on tokens; make it exactly 0 on padded rows
            self.direction = torch.where(mask, w1, 0.0)
        else:  # w1 = v_1 lives on hidden units
            self.direction = w1

    def image(self, A: Tensor) -> Tensor:
        """A^T u_1 (sequence, hidden) or A v_1 (sequence, token): s_1 v_1 or s_1 u_1 for X."""
        d = self.direction
        if self.wide:
            return (d[:, None, :] @ A)[:, 0, :]  # u^T A: a faster memory pattern than A^T u
        return (A @ d[:, :, None])[..., 0]

    def project_out(self, A: Tensor, image: Tensor, out: Tensor | None = None) -> Tensor:
        """R_1 = (I - u u^T) A, or A (I - v v^T): the rank-one residual in one fused pass."""
        d = self.direction
        if self.wide:
            return torch.addcmul(A, d[:, :, None], image[:, None, :], value=-1.0, out=out)
        return torch.addcmul(A, image[:, :, None], d[:, None, :], value=-1.0, out=out)

    def singular_values(
        self, Xm: Tensor, image: Tensor, R1: Tensor, full: bool
    ) -> tuple[Tensor, Tensor]:
        """All k singular values of X (``full``) or s_1, s_2 only, descending; and ||R_1||_F.

        s_1 = ||X^T u_1|| (or ||X v_1||), a Rayleigh-quotient estimate.  The others are
        sqrt(lambda_i) where every nonzero lambda_i (i <= rank bound) is >= RESOLVED * lambda_1
        (their relative error, ~eps lambda_1 / lambda_i, is then ~1e-10 at most); in the other
        sequences all are ||X^T w_i|| over the eigenvectors w_i of G (eigh, for those sequences
        only).  Where s_2 < DEFLATE * s_1 the trailing eigenpairs are at or below G's rounding
        (eps lambda_1); for those sequences s_2.. are the singular values of the explicitly
        formed residual R_1 = (I - u_1 u_1^T) X instead, by the same method on R_1's Gram
        matrix.

        ||R_1||_F^2 = trace(G) - s_1^2 where s_2 >= DEFLATE s_1 (then ||R_1||_F^2 >= 1e-4 s_1^2,
        so the subtraction loses at most ~1e4 eps relative), the trace of R_1's Gram matrix
        where the spectrum is deflated.
        """
        lam, k = self.lam, self.lam.shape[-1]
        s1 = torch.linalg.vector_norm(image, dim=-1, keepdim=True)
        fro = (_trace(self.G) - s1[:, 0].square()).clamp(min=0.0)
        if k == 1:  # rank one: R_1 is rounding, which the subtraction would square-root
            return s1, _fro(R1)
        rest = lam[..., 1:] if full else lam[..., 1:2]
        S = torch.cat([s1, rest.clamp(min=0.0).sqrt()], dim=-1)
        lam1 = lam[..., 0]
        deflate = (lam[..., 1] < DEFLATE**2 * lam1) & (lam1 > 0)
        if full:
            smallest = lam.gather(-1, (self.rank - 1)[:, None])[:, 0]
            refine = torch.nonzero((smallest < RESOLVED * lam1) & ~deflate).flatten()
            if len(refine):
                accurate = _accurate(_rows(Xm, refine), _rows(self.G, refine), k, self.wide)
                S = _put_rows(S, refine, accurate)
        deflate = torch.nonzero(deflate).flatten()
        if len(deflate):
            rest = _rows(R1, deflate)
            G1 = _gram(rest, self.wide)
            # R_1's Gram matrix has one more null direction (u_1): its top k - 1 values.
            values = _spectrum(rest, G1, S.shape[-1] - 1, self.wide, full)
            S = _put_rows(S, deflate, torch.cat([S[deflate, :1], values], -1))
            fro = _put_rows(fro, deflate, _trace(G1))
        if full:  # past the rank bound the values are zero (rounding aside)
            S = torch.where(torch.arange(k, device=S.device) < self.rank[:, None], S, 0.0)
        return torch.sort(S, dim=-1, descending=True).values, fro.sqrt()


def _top_vector(G: Tensor, lam1: Tensor, steps: int = 3) -> Tensor:
    """The eigenvector of lambda_1 by inverse iteration, shifted just past lambda_1.

    (G - sigma I)^-1 multiplies the lambda_1 component by 1 / (sigma - lambda_1) = 1e12 /
    lambda_1 and every other by at most 1 / (lambda_1 - lambda_2): with a gap of 1e-4
    lambda_1 each step shrinks the rest by 1e-8, so three steps reach rounding.  One LU
    factorisation serves all steps; it costs a third of the tridiagonalisation eigvalsh
    already did, where eigh's eigenvectors would cost several times that.
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


def _spectrum(A: Tensor, G: Tensor, count: int, wide: bool, full: bool) -> Tensor:
    """Top ``count`` singular values of A (Gram matrix G), as in _Top.singular_values."""
    lam = _eigvalsh(G)[0][..., :count]
    S = lam.clamp(min=0.0).sqrt()
    if full and count > 1:
        refine = torch.nonzero(lam[..., -1] < RESOLVED * lam[..., 0]).flatten()
        if len(refine):
            S = _put_rows(S, refine, _accurate(_rows(A, refine), _rows(G, refine), count, wide))
    return S


def _row_norms(A: Tensor, W: Tensor, wide: bool) -> Tensor:
    """||A^T w|| (wide) or ||A w|| for each column w of W: singular values of A (see above)."""
    if wide:
        return torch.linalg.vector_norm(W.mT @ A, dim=-1)
    return torch.linalg.vector_norm(A @ W, dim=-2)


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


def _metrics(Xm: Tensor, mask: Tensor, counts: Tensor, wanted: tuple[str, ...]):
    """The core: Xm is prepared (zeroed padding) and rescaled; see the module docstring."""
    wide = Xm.shape[-2] <= Xm.shape[-1]
    want = set(wanted)
    residual = "relative_residual" in want
    out: dict[str, Tensor] = {}
    if residual or "effective_rank" in want:
        # R and then R_1 share one buffer, |.| another (see _workspace).
        buffer, scratch = _workspace(Xm, 3)[:2]
        if residual:
            mean = _mean(Xm, counts)
            R = _mean_residual(Xm, mask, counts, out=buffer, mean=mean)
            # R's Gram matrix formed from R (accurate however small R is), X's from it.
            G_R = _gram(R, wide)
            G = _uncentred_gram(G_R, R, mean, mask, counts, wide)
            lam, lam_R = _eigvalsh(G, G_R)
            R_spectral = lam_R[:, 0].clamp(min=0.0).sqrt()  # ||R||_2
            mean_table = _norm_table(R, _trace(G_R).sqrt(), R_spectral, scratch)
        else:
            G = _gram(Xm, wide)
            [lam] = _eigvalsh(G)
        top = _Top(mask, counts, G, lam, wide)
        k = lam.shape[-1]
        image = top.image(Xm)
        R1 = top.project_out(Xm, image, out=buffer)  # R is done with
        # All k singular values for the effective rank, otherwise only s_1 and s_2.
        S, R1_fro = top.singular_values(Xm, image, R1, full="effective_rank" in want)
        s1 = S[:, 0]
        if "effective_rank" in want:
            out["effective_rank"] = _effective_rank(S)
        if residual:
            s2 = S[:, 1] if k > 1 else torch.zeros_like(s1)
            tables = {"mean": mean_table, "svd": _norm_table(R1, R1_fro, s2, scratch)}
            residuals = torch.stack([tables[fit] for fit in FITS], dim=1)
            reference = _norm_table(Xm, _trace(G).sqrt(), s1, scratch)[:, None, :]
            out["relative_residual"] = residuals / reference  # (sequence, fit, norm)
        if "stable_rank" in want:
            out["stable_rank"] = _trace(G) / s1**2  # 0/0 = NaN for an all-zero sequence
    elif "stable_rank" in want:
        G = _gram(Xm, wide)
        s1 = _eigvalsh(G)[0][:, 0].clamp(min=0.0).sqrt()  # relative accuracy eps
        out["stable_rank"] = _trace(G) / s1**2
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


def residual(X: Tensor, mask: Tensor | None = None, fit: str = "mean") -> Tensor:
    """res(X) = X - 1 x^T per sequence, float64, same shape as X, padded rows zero.

    ``fit="mean"``: x is the mean of the real tokens.  ``fit="svd"``: the subtracted matrix is
    the best rank-one approximation sigma_1 u_1 v_1^T of the real-token matrix (not unique when
    sigma_1 = sigma_2; see the module docstring).  Raises ValueError on invalid shapes, unknown
    fit, fewer than 2 real tokens in a sequence, or non-finite real tokens.
    """
    _check_name(fit, FITS, "fit")
    Xm, mask, counts, peak = _prepare(X, mask)
    if fit == "mean":
        return _mean_residual(Xm, mask, counts)
    # The direction comes from the rescaled X (its Gram matrix must not overflow); the
    # projection is applied to X itself, so the residual keeps X's scale.
    wide = Xm.shape[-2] <= Xm.shape[-1]
    G = _gram(_rescale(Xm, peak), wide)
    top = _Top(mask, counts, G, _eigvalsh(G)[0], wide)
    return top.project_out(Xm, top.image(Xm))


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


def effective_rank(X: Tensor, mask: Tensor | None = None) -> Tensor:
    """Roy & Vetterli (2007) effective rank exp(-sum p_i log p_i), p_i = s_i / sum_j s_j.

    Between 1 and rank(X); shape (sequence,), float64.  NaN for an all-zero sequence.
    """
    return collapse_metrics(X, mask, metrics="effective_rank")["effective_rank"]


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


def collapse_metrics(
    X: Tensor, mask: Tensor | None = None, metrics: str | tuple[str, ...] | None = None
) -> dict[str, Tensor]:
    """The collapse metrics of a batch, sharing one eigendecomposition per sequence.

    Returns float64 tensors on X's device, for every name in ``metrics`` (default: all of
    METRICS; only what they need is computed):

    * ``"relative_residual"``: (sequence, len(FITS), len(NORMS)), indexed in the order of
      FITS and NORMS: ||res(X)|| / ||X|| for each fit and norm;
    * ``"effective_rank"``, ``"stable_rank"``, ``"cosine_similarity"``: (sequence,).

    Method and accuracy: see the module docstring.  Degenerate cases follow it too.
    """
    wanted = _wanted(metrics)
    Xm, mask, counts, peak = _prepare(X, mask)
    return _metrics(_rescale(Xm, peak), mask, counts, wanted)
