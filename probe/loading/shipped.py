"""The names and folders of the trained checkpoints that ship with probe (``probe/checkpoints``).

Kept apart from :mod:`probe.fastformer` (whose package registers the Fastformer with
transformers' Auto classes and imports its modelling code): resolving any model name asks
whether it is one of these, and that question needs neither.  The Fastformer is registered
when a config that names it is read (:func:`probe.loading.resolve.config_at`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: ``fastformer-tiny`` and its GPT-2 baseline ``gpt2-tiny`` (see :mod:`probe.fastformer.shipped`).
SHIPPED = ("fastformer-tiny", "gpt2-tiny")

#: The ``model_type`` of a Fastformer config (``probe.fastformer.config``; not imported here).
FASTFORMER_MODEL_TYPE = "FastformerForCausalLM"


def shipped_path(name: str) -> Path | None:
    """The folder of a shipped checkpoint, or None for any other name."""
    if name not in SHIPPED:
        return None
    folder = Path(str(resources.files("probe") / "checkpoints" / name))
    return folder if (folder / "config.json").is_file() else None
