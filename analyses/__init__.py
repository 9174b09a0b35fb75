"""One module per experiment; each ``run`` returns an xarray.Dataset."""

from . import collapse

__all__ = ["collapse"]
