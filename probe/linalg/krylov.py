"""Lanczos with full reorthogonalisation and Rayleigh-Ritz, many problems per product.

Each top eigenpair comes from the Lanczos method with full reorthogonalisation (classical
Gram-Schmidt twice, ``Krylov``) and Rayleigh-Ritz on the whole Krylov basis: Q^T A Q from the
stored products A Q, so a breakdown (an invariant subspace, common in collapsed layers) leaves
the projection exact; a fixed pseudo-random vector, orthogonalised, then continues the basis.
A ``Run`` is one such problem per sequence (and column), its operator given as what to apply
before and after the one shared product; ``step`` grows every run's basis by one vector
through one product with G_R, the current vectors of every problem at once.

The Ritz pair (theta, y) with residual r = A y - theta y is accepted when theta is accurate to
VALUE_TOL relative by the Kato-Temple estimate ||r||^2 / gap <= VALUE_TOL theta (gap: to the
next Ritz value), and, where the vector is asked for (u_1), the vector to VECTOR_TOL
(||r|| / gap, the sine of its error), or when ||r|| is at rounding level.  Convergence is
checked every 4 steps (CHECKS); each sequence's values are frozen at the check where it
converges, so a sequence gives the same numbers alone as in any batch.  On real hidden states
it takes 3-10 steps for X's Gram matrix (lambda_1 dominates: the mean direction) and 10-45 for
G_R (a flat top, mu_2 / mu_1 ~ 0.98 in bert-base at random init).  A run stops after
KRYLOV_STEPS products at most; with k <= KRYLOV_STEPS the basis then fills the space and
Rayleigh-Ritz is exact, and otherwise the caller gives a sequence that has not converged the
exact eigensolver, so every value is accurate as stated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .batch import unit
from .gram import Grams
from .lapack import lapack
from .workspace import fixed

_EPS = torch.finfo(torch.float64).eps

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


@dataclass
class Ritz:
    """The top ``count`` Ritz pairs of each row: values descending, vectors, residual norms."""

    values: Tensor  # (sequence, columns, count)
    vectors: Tensor  # (sequence, columns, count, k)
    residuals: Tensor  # (sequence, columns, count)


class Krylov:
    """A Krylov basis per (sequence, column), grown one vector per product.

    ``support`` (sequence, 1, k), where given, is 1 on the coordinates the operator acts on
    (real tokens): restart vectors stay inside it."""

    # Below this fraction of the largest product so far, what is left of a product after
    # orthogonalisation is rounding, not a new direction: the basis is (numerically)
    # invariant, and a fixed pseudo-random vector, orthogonalised, takes its place.  Normalising
    # rounding instead would give a vector that is not orthogonal to the basis.  A product
    # carries rounding of about sqrt(k) eps of the largest (~1e-14 at k = 2048): 1e-12 keeps
    # a 100-fold margin.  It was 1e-8, which discarded real directions: where lambda_2 /
    # lambda_1 ~ 1e-8 (tokens in a few tight groups, as in bfloat16's nearly collapsed
    # layers) the direction that refines u_1 is ~1e-10 of the largest product, so G's run
    # never met VECTOR_TOL and every such sequence took all KRYLOV_STEPS and the exact
    # eigensolver; and the estimate's deflation counted fewer converged pairs (gpt2 at 1024
    # tokens, collapsed layers: 3-4% off the exact effective rank, now 0.1-0.2%).
    BREAKDOWN = 1e-12

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
        self.next = unit(start)

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
        # On a CPU the restart is made only where needed; on a GPU always, so that no step
        # waits for the device to say whether it is (where() keeps w for the others alike).
        if image.device.type != "cpu" or bool(broken.any()):
            restart = fixed((1, k), image.device, 100 + j).expand_as(w)
            if self.support is not None:
                restart = restart * self.support
            w = torch.where(broken, self._orthogonal(restart), w)
        self.next = unit(w.reshape(S, C, k))

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
        [(theta, Y)] = lapack(torch.linalg.eigh, H.reshape(S * C, j, j))
        return theta.flip(-1).reshape(S, C, j), Y.flip(-1).reshape(S, C, j, j)

    def ritz(self, count: int) -> Ritz:
        theta, Y = self.projection()
        count = min(count, self.size)
        Yc = Y[..., :count]  # (S, C, j, count)
        Q, AQ = self._slabs()
        vectors = Yc.mT @ Q
        residuals = torch.linalg.vector_norm(
            Yc.mT @ AQ - theta[..., :count, None] * vectors, dim=-1
        )
        return Ritz(theta[..., :count], vectors, residuals)


def _converged(ritz: Ritz, vector: bool) -> Tensor:
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


class Run:
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
        skip: Tensor | None = None,
    ) -> None:
        self.krylov = Krylov(start, capacity, support)
        self.pre, self.post = pre, post
        self.vector, self.keep, self.at_least = vector, keep, at_least
        self.result: Ritz | None = None
        # ``skip``: rows whose value the caller takes from elsewhere.  They count as settled
        # from the start, so they never hold the run open, and no Ritz pair is frozen for them.
        if skip is None:
            self.settled = torch.zeros(start.shape[0], dtype=torch.bool, device=start.device)
        else:
            self.settled = skip.clone()
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
        self.result = Ritz(
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


def _pad(previous: Ritz | None, count: int, like: Ritz) -> Ritz:
    if previous is None:
        return Ritz(
            torch.zeros_like(like.values),
            torch.zeros_like(like.vectors),
            torch.full_like(like.residuals, math.inf),
        )
    extra = count - previous.values.shape[-1]
    return Ritz(
        torch.nn.functional.pad(previous.values, (0, extra)),
        torch.nn.functional.pad(previous.vectors, (0, 0, 0, extra)),
        torch.nn.functional.pad(previous.residuals, (0, extra), value=math.inf),
    )


def step(grams: Grams, runs: list[Run]) -> None:
    """Grow every run's basis by one vector, all through one product with G_R."""
    W = torch.cat([run.pre(run.krylov.next) for run in runs], dim=1)
    Y = grams.product(W)
    first = 0
    for run in runs:
        cols = slice(first, first + run.columns)
        run.krylov.extend(run.post(Y[:, cols], W[:, cols]))
        first = cols.stop
        run.after_step()


def identity(W: Tensor) -> Tensor:
    return W


def same(Y: Tensor, W: Tensor) -> Tensor:
    return Y
