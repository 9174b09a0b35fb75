"""Family adapters, one file per family; adding a family is adding one file here."""

from __future__ import annotations

from ..errors import ProbeError
from .albert import AlbertAdapter
from .base import Adapter, table_markdown
from .bert import BertAdapter
from .fastformer import FastformerAdapter
from .gpt2 import GPT2Adapter
from .xlnet import XLNetAdapter

ADAPTERS: dict[str, Adapter] = {
    adapter.family: adapter
    for adapter in (
        BertAdapter(),
        AlbertAdapter(),
        XLNetAdapter(),
        GPT2Adapter(),
        FastformerAdapter(),
    )
}
FAMILIES: tuple[str, ...] = tuple(ADAPTERS)


def adapter_for(model_type: str) -> Adapter:
    """The adapter for a config's ``model_type``; a clear error for any other family."""
    for adapter in ADAPTERS.values():
        if model_type in adapter.model_types:
            return adapter
    raise ProbeError(f"unsupported model family {model_type!r}; supported: {', '.join(FAMILIES)}")


__all__ = ["ADAPTERS", "FAMILIES", "Adapter", "adapter_for", "table_markdown"]
