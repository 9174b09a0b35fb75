"""Inputs: text cut into full sequences, seeded synthetic ids, clear errors."""

from __future__ import annotations

import hashlib

import pytest
import torch

from probe.errors import ProbeError
from probe.requests.inputs import SAMPLE, make_inputs, sample_text


def test_text_is_cut_into_consecutive_full_sequences(minilm_tokenizer, tmp_path):
    text = "the quick brown fox jumps over the lazy dog " * 20
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    inputs = make_inputs(minilm_tokenizer, 30522, text=path, sequences=3, tokens=10)
    ids = minilm_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert inputs.input_ids.tolist() == [ids[0:10], ids[10:20], ids[20:30]]
    assert inputs.attention_mask.all() and inputs.kind == "tokenizer"
    assert inputs.text_source == str(path)
    assert inputs.text_sha256 == hashlib.sha256(text.encode()).hexdigest()


def test_sample_text_fills_the_papers_shape(minilm_tokenizer):
    inputs = make_inputs(minilm_tokenizer, 30522)
    assert inputs.input_ids.shape == (32, 128)
    assert inputs.text_source == SAMPLE and len(sample_text()) > 10_000


def test_short_text_uses_what_is_possible_and_says_so(minilm_tokenizer, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("one two three four five six seven eight nine ten eleven", encoding="utf-8")
    said = []
    inputs = make_inputs(
        minilm_tokenizer, 30522, text=path, sequences=5, tokens=4, warn=said.append
    )
    assert inputs.sequences == 2  # 11 tokens -> two sequences of 4
    assert said and "2 sequences of 4 possible, using 2 instead of 5" in said[0]


@pytest.mark.parametrize(
    "content, match",
    [("a b", "fewer than one sequence of 64"), ("", "is empty"), (b"\xff\xfe\x00bad", "not UTF-8")],
)
def test_unusable_texts(minilm_tokenizer, tmp_path, content, match):
    path = tmp_path / "bad.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ProbeError, match=match):
        make_inputs(minilm_tokenizer, 30522, text=path, tokens=64)


def test_missing_text_file(minilm_tokenizer, tmp_path):
    with pytest.raises(ProbeError, match="no such text file"):
        make_inputs(minilm_tokenizer, 30522, text=tmp_path / "nope.txt")


def test_synthetic_ids_are_seeded_and_in_vocabulary():
    a = make_inputs(None, 50, sequences=4, tokens=16, seed=3)
    b = make_inputs(None, 50, sequences=4, tokens=16, seed=3)
    c = make_inputs(None, 50, sequences=4, tokens=16, seed=4)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    assert a.kind == "synthetic ids" and 0 <= a.input_ids.min() and a.input_ids.max() < 50


def test_text_without_tokenizer_is_an_error(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello", encoding="utf-8")
    with pytest.raises(ProbeError, match="needs the model's tokenizer"):
        make_inputs(None, 50, text=path)


def test_tokenizer_of_another_model_is_refused(minilm_tokenizer):
    with pytest.raises(ProbeError, match="does not belong to this model"):
        make_inputs(minilm_tokenizer, 80, sequences=1, tokens=8)


def test_batched_tokenization_equals_one_call(minilm_tokenizer):
    from probe.requests.inputs import text_pieces, tokenize

    body = sample_text() * 3
    pieces = text_pieces(body, size=997)
    assert len(pieces) > 50 and "".join(pieces) == body
    # every cut is "x\n" | "y" or "x\n" | "\ny", x and y not whitespace
    assert all(p[-1] == "\n" and not p[-2].isspace() for p in pieces[:-1])
    assert all(
        not p.lstrip("\n")[0].isspace() and len(p) - len(p.lstrip("\n")) <= 1 for p in pieces[1:]
    )
    whole = minilm_tokenizer(body, add_special_tokens=False, verbose=False)["input_ids"]
    import probe.requests.inputs as inputs_module

    original = inputs_module.PIECE_CHARS
    try:
        inputs_module.PIECE_CHARS = 997  # many pieces, several batched calls
        assert tokenize(minilm_tokenizer, body) == whole
        some = tokenize(minilm_tokenizer, body, needed=500)
        assert 500 <= len(some) < len(whole) and some == whole[: len(some)]
    finally:
        inputs_module.PIECE_CHARS = original


def test_sequences_all_takes_every_full_sequence(minilm_tokenizer, tmp_path):
    text = "the quick brown fox jumps over the lazy dog " * 20  # 180 tokens
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    said = []
    inputs = make_inputs(
        minilm_tokenizer, 30522, text=path, sequences="all", tokens=16, warn=said.append
    )
    ids = minilm_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert inputs.sequences == len(ids) // 16 == 11 and not said
    assert inputs.input_ids.flatten().tolist() == ids[: 11 * 16]
    with pytest.raises(ProbeError, match="`sequences` all needs a text and the model's tokenizer"):
        make_inputs(None, 50, sequences="all")
    with pytest.raises(ProbeError, match="`sequences` must be a number or 'all'"):
        make_inputs(minilm_tokenizer, 30522, sequences="many")
