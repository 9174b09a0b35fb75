"""A character-level tokenizer saved as a real HuggingFace tokenizer.

Every distinct character of the training text is one token, in code-point
order, after two special tokens: ``<pad>`` (id 0, the checkpoint format's
padding index) and ``<unk>`` (id 1, for characters the text did not have).  It
is a ``tokenizers`` WordLevel model behind a pre-tokenizer that isolates every
character, wrapped in ``PreTrainedTokenizerFast``, so ``save_pretrained`` writes
``tokenizer.json`` and ``AutoTokenizer.from_pretrained(folder)`` reads it back.
With one token per character, the loss in nats per token divided by ln 2 is
bits per character.
"""

from __future__ import annotations

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK = "<pad>", "<unk>"


def char_tokenizer(text: str) -> PreTrainedTokenizerFast:
    """The tokenizer of ``text``'s characters (ids 0, 1 are <pad>, <unk>)."""
    vocab = {PAD: 0, UNK: 1}
    for char in sorted(set(text)):
        vocab[char] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S]: any single character, newlines included (Oniguruma has no (?s)), each its own "word".
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, unk_token=UNK, clean_up_tokenization_spaces=False
    )


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> torch.Tensor:
    """Ids of ``text``, one per character (a direct lookup: same ids as the tokenizer, faster)."""
    vocab = tokenizer.get_vocab()
    unk = vocab[UNK]
    return torch.tensor([vocab.get(char, unk) for char in text], dtype=torch.long)
