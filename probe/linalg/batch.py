"""Batched helpers: a batch's rows, and per-row dot products, unit vectors and norms.

A batch's first dimension is the sequence.  ``take_rows``, ``put_rows`` and ``fix_rows``
recompute a subset of sequences (those that an accurate fallback must redo) and put them back,
without a copy where every sequence is concerned.  ``dot`` and ``unit`` act on the last
dimension: vectors are rows, as the Krylov bases store them.  Each is one reduction, exact to
its own rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def take_rows(A: Tensor, index: Tensor | None) -> Tensor:
    # A[index] copies; the common case of every sequence needs no copy.
    return A if index is None or len(index) == A.shape[0] else A[index]


def put_rows(A: Tensor, index: Tensor, values: Tensor) -> Tensor:
    return values if len(index) == A.shape[0] else A.index_copy(0, index, values)


def fix_rows(where: Tensor, current: Tensor, compute: Callable) -> Tensor:
    """``current`` with the rows where ``where`` holds replaced by ``compute(index)``."""
    index = torch.nonzero(where).flatten()
    if len(index) == 0:
        return current
    return put_rows(current, index, compute(index))


def identical_rows(X: Tensor, mask: Tensor) -> Tensor:
    """(sequence,) bool: are all the real tokens (rows where ``mask`` holds) of each sequence
    exactly the same vector?  One comparison pass with each sequence's first real token."""
    first = mask.to(torch.int8).argmax(-1)  # the first True (sequences have real tokens)
    reference = X[torch.arange(X.shape[0], device=X.device), first]
    return ((X == reference[:, None, :]).all(-1) | ~mask).all(-1)


def dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1, keepdim=True)


def unit(w: Tensor) -> Tensor:
    norm = torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    # An exactly invariant subspace leaves w = 0: a zero vector, which adds nothing.
    return torch.where(norm > 0, w / torch.where(norm > 0, norm, 1.0), 0.0)


def frobenius(A: Tensor) -> Tensor:
    return torch.linalg.vector_norm(A, dim=(-2, -1))
