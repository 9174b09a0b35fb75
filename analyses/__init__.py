"""One module per experiment; each ``run`` returns an xarray.Dataset."""

from . import attention, collapse

__all__ = ["attention", "collapse"]
