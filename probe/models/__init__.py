"""The families probe can walk: data specs (``families.py``) and three code adapters.

Most families are one :class:`~probe.models.family.Family` entry executed by the generic
walker; ALBERT (one layer applied L times), XLNet (two streams, sequence-first) and the
Fastformer (additive attention) keep code where data cannot say it.
"""

from __future__ import annotations

from ..errors import ProbeError
from .albert import AlbertAdapter
from .base import Adapter, table_markdown
from .families import FAMILIES as SPECS
from .families import REFUSED
from .family import Family
from .fastformer import FastformerAdapter
from .spec import SpecAdapter
from .xlnet import XLNetAdapter

ADAPTERS: dict[str, Adapter] = {
    adapter.family: adapter
    for adapter in (
        *(SpecAdapter(spec) for spec in SPECS),
        AlbertAdapter(),
        XLNetAdapter(),
        FastformerAdapter(),
    )
}
FAMILIES: tuple[str, ...] = tuple(ADAPTERS)


def adapter_for(model_type: str) -> Adapter:
    """The adapter for a config's ``model_type``; a clear error for any other family."""
    for adapter in ADAPTERS.values():
        if model_type in adapter.model_types:
            return adapter
    if model_type in REFUSED:
        raise ProbeError(f"model family {model_type!r} is refused: {REFUSED[model_type]}")
    raise ProbeError(
        f"unsupported model family {model_type!r}; supported: {', '.join(FAMILIES)} "
        "(`probe models` lists them); adding one is an entry in probe/models/families.py, a "
        "tiny config and a reference entry in tests/reference/ (docs/adding-a-family.md), and "
        "`probe check MODEL` tests it"
    )


__all__ = [
    "ADAPTERS",
    "FAMILIES",
    "Adapter",
    "Family",
    "SpecAdapter",
    "adapter_for",
    "table_markdown",
]
