"""Tensors kept from call to call: float64 work buffers and fixed pseudo-random tensors.

On a CPU the (sequence, token, hidden) float64 buffers of the metrics are reused from call to
call (``workspace``): a fresh one costs a page fault per 4 KiB on first touch, more than the
pass that fills it.  On CUDA the caching allocator already reuses memory.

The Krylov runs' start and restart vectors and the quadrature's probes are fixed pseudo-random
Gaussian tensors (``fixed``), drawn once from a seeded generator on the CPU and copied to each
device: the same numbers on every run and every device.  Nothing here rounds.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

_F64 = torch.float64
_SEED = 20210302  # fixed probes and start vectors: the same numbers on every run

_SCRATCH = threading.local()


def workspace(like: Tensor, count: int) -> list[Tensor]:
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


def fixed(shape: tuple[int, ...], device: torch.device, salt: int) -> Tensor:
    """A fixed pseudo-random Gaussian tensor (drawn once on the CPU, kept per device)."""
    key = (shape, str(device), salt)
    if key not in _FIXED:
        generator = torch.Generator().manual_seed(_SEED + salt)
        _FIXED[key] = torch.randn(shape, generator=generator, dtype=_F64).to(device)
    return _FIXED[key]
