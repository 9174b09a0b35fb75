"""The arguments every load checks the same way, before anything is read.

The seed, dtype and device: each check turns a user's value (a string from the command line
or a torch object from Python) into what torch takes.  Then the settings that do not go
together (`config` overrides with pretrained weights, `remote` with `revision`, `device`
with `device_map`): :func:`check_request` runs every check in one fixed order, so of several
things wrong the same one is named every time.  Each raises a one-line
:class:`~probe.errors.ProbeError`.
"""

from __future__ import annotations

import torch

from probe import names

from ..errors import ProbeError
from ..names import INITS
from .placement import check_device_map

DTYPES = {name: getattr(torch, name) for name in names.DTYPES}


MAX_SEED = 2**63 - 1


def check_seed(seed: int) -> int:
    """Seeds are non-negative 64-bit integers (what torch's generators and netCDF hold)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ProbeError(f"`seed` must be an integer from 0 to {MAX_SEED}, got {seed!r}")
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
    """The torch device of a name :func:`probe.requests.checks.device` accepts; the CPU for None."""
    from probe.requests.checks import device as checked

    return torch.device(checked("cpu" if device is None else str(device)))


#: Why overrides go with random weights only.
OVERRIDES_AT_RANDOM_INIT = (
    "`config` changes the architecture, so it runs at random init only; use `init` random"
)


def check_request(init: str, seed: int, overrides, remote, revision: str | None) -> None:
    """Refuse overrides without random init, `remote` with `revision`, an unknown init and
    a seed out of range."""
    if overrides is not None and init != "random":
        raise ProbeError(OVERRIDES_AT_RANDOM_INIT)
    if remote and revision is not None:
        raise ProbeError("`remote` runs the hosted revision; drop `revision`")
    if init not in INITS:
        raise ProbeError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
    check_seed(seed)


def run_options(
    device, dtype, device_map, max_memory, offload_folder
) -> tuple[torch.dtype, torch.device]:
    """(dtype, device) of a load as torch takes them, with its device map's settings
    checked: a `device_map` replaces `device`, and `max_memory` and `offload_folder` need
    one."""
    torch_dtype = as_dtype(dtype)
    if device_map is not None and device not in (None, "cpu"):
        raise ProbeError("use either `device` or `device_map`, not both")
    if device_map is None and (max_memory is not None or offload_folder is not None):
        raise ProbeError("`max_memory` and `offload_folder` go with `device_map`")
    check_device_map(device_map)
    return torch_dtype, as_device(device)
