"""The two small trained checkpoints that ship with probe, found by name offline.

``fastformer-tiny`` and its baseline ``gpt2-tiny`` were trained together by
``probe fastformer train`` with the GPT-2 baseline (same data, tokenizer, sizes,
steps); each folder holds the weights, the character tokenizer and
``training.json`` (the command line, the data's sha256, the final validation
bits per character).  ``probe.load("fastformer-tiny")`` resolves here, like
``minilm`` resolves to its package.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SHIPPED = ("fastformer-tiny", "gpt2-tiny")


def shipped_path(name: str) -> Path | None:
    """The folder of a shipped checkpoint, or None for any other name."""
    if name not in SHIPPED:
        return None
    folder = Path(str(resources.files("probe") / "checkpoints" / name))
    return folder if (folder / "config.json").is_file() else None
