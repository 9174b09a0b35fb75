"""The arguments every load checks the same way: seed, dtype and device.

Each check turns a user's value (a string from the command line or a torch object from
Python) into what torch takes, or raises a one-line :class:`~probe.errors.ProbeError`.
"""

from __future__ import annotations

import torch

from .. import names
from ..errors import ProbeError

DTYPES = {name: getattr(torch, name) for name in names.DTYPES}


MAX_SEED = 2**63 - 1


def check_seed(seed: int) -> int:
    """Seeds are non-negative 64-bit integers (what torch's generators and netCDF hold)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ProbeError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return seed


def as_dtype(dtype) -> torch.dtype:
    """The torch dtype of a name in :data:`DTYPES` or a torch dtype; float32 for None."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ProbeError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def as_device(device) -> torch.device:
    """The torch device of a name :func:`probe.checks.device` accepts; the CPU for None."""
    from ..checks import device as checked

    return torch.device(checked("cpu" if device is None else str(device)))
