"""A checkpoint's tokenizer and image processor, where it has them.

A model without a tokenizer is still probed (on synthetic token ids), so a tokenizer
that cannot be had is None rather than an error.  But tokenizer files a local folder
holds and that cannot be read (a corrupt ``tokenizer.json``) are refused, as is an image
processor file that exists but cannot be read: falling back would measure other inputs
than the checkpoint's own, under its name.
"""

from __future__ import annotations

from pathlib import Path

from probe.loading.quiet import quiet

from ..errors import ProbeError, one_line
from .hub import hub_kwargs

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
)


def tokenizer_at(location, revision: str | None = None):
    """The checkpoint's tokenizer (at hub ``revision``) where one can be had, else None
    (synthetic ids)."""
    from transformers import AutoTokenizer

    if isinstance(location, Path) and not any((location / f).is_file() for f in TOKENIZER_FILES):
        return None
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(
                location,
                trust_remote_code=False,
                **hub_kwargs(location),
                **({} if revision is None else {"revision": revision}),
            )
    except Exception as err:  # no tokenizer files, no network, missing sentencepiece, ...
        if isinstance(location, Path):  # the folder has tokenizer files: they are broken
            held = ", ".join(f for f in TOKENIZER_FILES if (location / f).is_file())
            raise ProbeError(
                f"cannot read the tokenizer in {location} ({held}): {one_line(err)}; "
                "repair or remove those files"
            ) from None
        return None
    # transformers may build an empty default tokenizer (special tokens only): no use.
    if len(tokenizer) <= len(tokenizer.all_special_tokens) + 1:
        return None
    return tokenizer


def image_processor_at(location):
    """The checkpoint's image processor (preprocessor_config.json), or None for the default."""
    if not isinstance(location, Path) or not (location / "preprocessor_config.json").is_file():
        return None
    from transformers import AutoImageProcessor

    try:
        with quiet():
            return AutoImageProcessor.from_pretrained(
                location, trust_remote_code=False, use_fast=False
            )
    except Exception as err:  # a damaged processor file: say so rather than guess
        raise ProbeError(
            f"cannot read the image processor in {location}: {one_line(err)}"
        ) from None
