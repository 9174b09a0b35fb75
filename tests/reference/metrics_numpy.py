"""Slow, loop-based NumPy oracle for probe.measures.metrics (independent of probe: no imports from it).

Each sequence's real tokens are extracted with boolean indexing and handled on their own with
np.linalg, so padding never enters a computation.  Inputs are NumPy arrays: X (sequence, token,
hidden) and mask (sequence, token) bool or None.  Degenerate conventions match probe.measures.metrics:
an all-zero sequence gives NaN relative residuals and ranks, a zero-norm token has cosine 0.
"""

from __future__ import annotations

import math

import numpy as np

NORMS = ("l1inf", "fro", "spectral", "l1", "linf")
FITS = ("mean", "svd")


def real_tokens(X, mask, s):
    """The (n, hidden) float64 matrix of real tokens of sequence s."""
    rows = np.asarray(X[s], dtype=np.float64)
    if mask is None:
        return rows
    return rows[np.asarray(mask[s], dtype=bool)]


def matrix_norm(A, norm):
    A = np.asarray(A, dtype=np.float64)
    if norm == "l1":
        return float(np.linalg.norm(A, 1))  # max absolute column sum
    if norm == "linf":
        return float(np.linalg.norm(A, np.inf))  # max absolute row sum
    if norm == "l1inf":
        return math.sqrt(np.linalg.norm(A, 1) * np.linalg.norm(A, np.inf))
    if norm == "fro":
        return float(np.linalg.norm(A, "fro"))
    if norm == "spectral":
        return float(np.linalg.norm(A, 2))
    raise ValueError(norm)


def residual_of(A, fit):
    """Residual of one real-token matrix A (n, hidden)."""
    if fit == "mean":
        return A - np.ones((A.shape[0], 1)) @ A.mean(axis=0, keepdims=True)
    if fit == "svd":
        U, s, Vt = np.linalg.svd(A)
        return A - s[0] * np.outer(U[:, 0], Vt[0])
    raise ValueError(fit)


def residual(X, mask=None, fit="mean"):
    out = np.zeros(np.shape(X), dtype=np.float64)
    for s in range(len(X)):
        rows = range(out.shape[1]) if mask is None else np.flatnonzero(mask[s])
        res = residual_of(real_tokens(X, mask, s), fit)
        for k, t in enumerate(rows):
            out[s, t] = res[k]
    return out


def relative_residual(X, mask=None, norm="l1inf", fit="mean"):
    out = []
    for s in range(len(X)):
        A = real_tokens(X, mask, s)
        denominator = matrix_norm(A, norm)
        if denominator == 0:
            out.append(math.nan)
        else:
            out.append(matrix_norm(residual_of(A, fit), norm) / denominator)
    return np.array(out)


def mu(X, mask=None):
    """Wu et al. (2024)'s ||X - 1 mean^T||_F per sequence, in X's units."""
    return np.array(
        [matrix_norm(residual_of(real_tokens(X, mask, s), "mean"), "fro") for s in range(len(X))]
    )


def singular_values(A):
    return np.linalg.svd(A, compute_uv=False)


def effective_rank(X, mask=None):
    out = []
    for s in range(len(X)):
        sv = singular_values(real_tokens(X, mask, s))
        if sv.sum() == 0:
            out.append(math.nan)
            continue
        entropy = 0.0
        for p in sv / sv.sum():
            if p > 0:
                entropy -= p * math.log(p)
        out.append(math.exp(entropy))
    return np.array(out)


def stable_rank(X, mask=None):
    out = []
    for s in range(len(X)):
        sv = singular_values(real_tokens(X, mask, s))
        out.append(math.nan if sv[0] == 0 else float(np.sum(sv**2) / sv[0] ** 2))
    return np.array(out)


def cosine_similarity(X, mask=None):
    out = []
    for s in range(len(X)):
        A = real_tokens(X, mask, s)
        n = A.shape[0]
        total = 0.0
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                ni, nj = np.linalg.norm(A[i]), np.linalg.norm(A[j])
                if ni > 0 and nj > 0:
                    total += float(A[i] @ A[j]) / (ni * nj)
        out.append(total / (n * (n - 1)))
    return np.array(out)


def collapse_metrics(X, mask=None):
    rel = np.empty((len(X), len(FITS), len(NORMS)))
    for f, fit in enumerate(FITS):
        for k, norm in enumerate(NORMS):
            rel[:, f, k] = relative_residual(X, mask, norm, fit)
    return {
        "relative_residual": rel,
        "mu": mu(X, mask),
        "effective_rank": effective_rank(X, mask),
        "stable_rank": stable_rank(X, mask),
        "cosine_similarity": cosine_similarity(X, mask),
    }
