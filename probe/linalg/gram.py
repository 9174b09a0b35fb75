"""Gram matrices, and X's, R's and R_1's Gram operators applied through R's alone.

Let R = X - 1 mean^T be the mean residual (mean over real tokens), G_R its k x k Gram matrix
(R R^T when tokens <= hidden, "wide" or the token side, else R^T R, the hidden side) -- one
batched matmul (``gram``), formed from R so that it is accurate to eps of R's own size however
small R is.  Three symmetric positive semi-definite operators are applied through G_R alone,
with no further matmul over X (``Grams``):

* X's Gram matrix G.  X = R + m mean^T (m the real-token indicator), so
  X X^T w = G_R w + m (g.w) + (g + |mean|^2 m)(m.w) with g = R mean, and X^T X w = G_R w +
  n mean (mean.w).  Rounding: eps lambda_1(X), that of a Gram matrix formed from X.
* G_R itself: ||R||_2^2 = mu_1(G_R).
* The rank-one residual's Gram matrix G_1.  R_1 = (I - u u^T) X = P X on the token side, or
  X (I - v v^T) on the hidden side, so G_1 = P G P; written as P (G_R w' + g (Pm.w') + Pm (g.w' +
  |mean|^2 Pm.w')) with w' = P w (token side) or P G_R P w + n Pmean (Pmean.w) (hidden side),
  every term is at most of the size of ||R||^2 (beta s_1 <= ||R||_2 for beta the sine between
  u_1 and the uniform direction), so its rounding is eps ||R||_2^2, not eps s_1^2.
  s_2 = ||R_1||_2 = sqrt(lambda_1(G_1)) is then accurate to eps (||R||_2 / s_2)^2 relative
  (probe.linalg.top forms G_1 from the explicit R_1 where that is too coarse).

||G_1||_F^2, a control variate of the effective rank estimate, comes from G_R too
(``Grams.fro2_residual``), rounded to about eps of the Frobenius norm of the operator it is
projected from.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .batch import dot

_F64 = torch.float64
_GRAM_BLOCK = 128  # rows per block of a large Gram product (gram)


def gram(A: Tensor, wide: bool) -> Tensor:
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


class Grams:
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
            return Y + m * dot(g, W) + (g + self.sq * m) * dot(m, W)
        return Y + self.n * self.mean * dot(self.mean, W)

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
            self.Pm = self.m - dot(self.m, self.u) * self.u  # P m, small when u ~ uniform
        else:
            self.Pmean = self.mean - dot(self.mean, self.u) * self.u

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
        return W - self.u * dot(self.u, W)

    def residual(self, Y: Tensor, W: Tensor) -> Tensor:
        """G_1 W from Y = G_R W with W already projected (W = P W)."""
        if self.wide:
            Pm = self.Pm
            Pm_w = dot(Pm, W)
            return self.project(Y + self.g * Pm_w + Pm * (dot(self.g, W) + self.sq * Pm_w))
        return self.project(Y) + self.n * self.Pmean * dot(self.Pmean, W)
