"""The analyses: one module per analysis (``<name>.py``, its helpers ``<name>_*.py``),
each returning an xarray.Dataset (those that run a model begin with
:func:`preamble.begin`); every one is declared once in :mod:`probe.registry`
(docs/adding-an-analysis.md)."""

from . import attention, collapse

__all__ = ["attention", "collapse"]
