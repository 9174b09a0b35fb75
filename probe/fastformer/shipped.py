"""The two small trained checkpoints that ship with probe, found by name offline.

``fastformer-tiny`` and its baseline ``gpt2-tiny`` were trained together by
``probe fastformer train`` with the GPT-2 baseline (same data, tokenizer, sizes,
steps); each folder holds the weights, the character tokenizer and
``training.json`` (the command line, the data's sha256, the final validation
bits per character).  ``probe.load("fastformer-tiny")`` resolves here, like
``minilm`` resolves to its package.  The names and folders live in
:mod:`probe.loading.shipped`, so that resolving a name imports no modelling code.
"""

from __future__ import annotations

from ..loading.shipped import SHIPPED, shipped_path

__all__ = ["SHIPPED", "shipped_path"]
