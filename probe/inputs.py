"""Inputs: sequences of exactly ``tokens`` real tokens, as in the paper.

The paper probes 32 sequences of 128 tokens with no padding.  probe tokenizes a
text (``--text FILE``, or the sample text written for this project) without
special tokens and cuts it into consecutive chunks of ``tokens`` ids.  Where a
model has no tokenizer (a hub id at random init, offline), the inputs are
token ids drawn uniformly from the vocabulary with the seed, and the result
records that.  Every sequence is full, so the mask is all ones; metrics still
take the mask, so padded batches give the values of their unpadded parts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from .errors import ProbeError

SAMPLE = "probe sample text"


@dataclass(frozen=True)
class Inputs:
    input_ids: torch.Tensor  # (sequence, token) int64
    attention_mask: torch.Tensor  # (sequence, token) int64, 1 = real token
    kind: str  # "tokenizer" or "synthetic ids"
    text_source: str
    text_sha256: str

    @property
    def sequences(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]


def sample_text() -> str:
    return (resources.files("probe") / "data" / "sample.txt").read_text(encoding="utf-8")


def read_text(path: str | Path | None) -> tuple[str, str]:
    """(text, a description of where it came from); ``None`` is the sample text."""
    if path is None:
        return sample_text(), SAMPLE
    path = Path(path)
    if path.is_dir():
        raise ProbeError(f"--text {path} is a directory; give a UTF-8 text file")
    if not path.is_file():
        raise ProbeError(f"no such text file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProbeError(
            f"{path} is not UTF-8 text; convert it, e.g. with iconv -t utf-8"
        ) from None
    if not text.strip():
        raise ProbeError(f"{path} is empty; give a text with at least one sequence of tokens")
    return text, str(path)


def make_inputs(
    tokenizer,
    vocab_size: int,
    *,
    text: str | Path | None = None,
    sequences: int = 32,
    tokens: int = 128,
    seed: int = 0,
    warn=None,
) -> Inputs:
    """Token ids (sequence, token) from a text, or seeded synthetic ids without a tokenizer."""
    if sequences < 1 or tokens < 2:
        raise ProbeError("need --sequences >= 1 and --tokens >= 2 (the metrics compare tokens)")
    if tokenizer is None:
        if text is not None:
            raise ProbeError(
                "--text needs the model's tokenizer, and none could be loaded; "
                "use a local folder with tokenizer files, or drop --text for synthetic ids"
            )
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab_size, (sequences, tokens), generator=generator)
        return Inputs(
            ids, torch.ones_like(ids), "synthetic ids", f"uniform token ids, seed {seed}", ""
        )

    body, source = read_text(text)
    ids = tokenizer(body, add_special_tokens=False, verbose=False)["input_ids"]
    available = len(ids) // tokens
    if available == 0:
        raise ProbeError(
            f"{source} has {len(ids)} tokens, fewer than one sequence of {tokens}; "
            "use a longer text or a smaller --tokens"
        )
    if available < sequences:
        if warn is not None:
            warn(
                f"{source} has {len(ids)} tokens: {available} sequences of {tokens} possible, "
                f"using {available} instead of {sequences}"
            )
        sequences = available
    chunk = torch.tensor(ids[: sequences * tokens], dtype=torch.long).view(sequences, tokens)
    if int(chunk.max()) >= vocab_size:
        raise ProbeError(
            f"the tokenizer gives ids up to {int(chunk.max())} but the model has {vocab_size} embeddings; "
            "the tokenizer does not belong to this model"
        )
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    return Inputs(chunk, torch.ones_like(chunk), "tokenizer", source, digest)
