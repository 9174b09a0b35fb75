"""Training: schedule, tokenizer, the `probe fastformer train --quick` command end to end."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

import probe
from probe.fastformer.corpus import stdlib_docstrings
from probe.fastformer.tokenizer import char_tokenizer, encode
from probe.fastformer.train import TrainSettings, batch_offsets, lr_factor
from probe.requests.inputs import sample_text
from tests.test_cli import invoke


def test_lr_schedule_warms_up_then_decays_by_cosine_to_a_tenth():
    assert lr_factor(0, 10, 100) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100) == pytest.approx(1.0)
    assert lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way: cos = 0
    assert lr_factor(100, 10, 100) == pytest.approx(0.1)


def test_character_tokenizer_saves_as_a_huggingface_tokenizer(tmp_path):
    tok = char_tokenizer("abc d\ne")
    assert tok.convert_ids_to_tokens([0, 1]) == ["<pad>", "<unk>"]
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    text = "bad cab\n e!"
    ids = back(text).input_ids
    assert ids == encode(tok, text).tolist() == tok(text).input_ids
    assert len(ids) == len(text) and ids[-1] == 1  # "!" was not in the text: <unk>
    assert back.decode(ids[:-1]) == text[:-1]


def test_batches_are_fixed_by_the_seed():
    settings = TrainSettings(
        text="x" * 1000, text_source="t", out="o", context=16, steps=5, batch=3
    )
    a, b = batch_offsets(900, settings), batch_offsets(900, settings)
    assert torch.equal(a, b) and a.shape == (5, 3) and int(a.max()) <= 900 - 16


def test_stdlib_docstrings_are_gathered_without_importing():
    text = stdlib_docstrings(limit=20_000)
    assert len(text) == 20_000 and text.count("\n\n") > 10


def test_quick_training_with_a_gpt2_baseline(tmp_path):
    text_file = tmp_path / "text.txt"
    text_file.write_text(sample_text(), encoding="utf-8")
    out = tmp_path / "ff"
    result = invoke(
        "fastformer", "train", "--text", text_file, "--out", out, "--quick", "--baseline", "gpt2"
    )
    assert result.exit_code == 0, result.output
    sha = hashlib.sha256(sample_text().encode("utf-8")).hexdigest()
    records = {}
    for name, folder in (("fastformer", out), ("gpt2", tmp_path / "ff-gpt2")):
        record = json.loads((folder / "training.json").read_text())
        records[name] = record
        bits = record["curve"]["val_bits_per_char"]
        assert record["data"]["sha256"] == sha
        assert record["command"].startswith("probe fastformer train --text")
        assert record["final_val_bits_per_char"] == bits[-1]
        # Bits per character fall: from ~log2(vocab) at the start to well below it.
        assert bits[-1] < bits[0] - 0.5, bits
        assert math.isfinite(bits[-1]) and bits[-1] < 5.0
        assert (folder / "model.safetensors").is_file()
        assert AutoTokenizer.from_pretrained(folder)("ab").input_ids == [
            encode(char_tokenizer(sample_text()), "ab")[i].item() for i in range(2)
        ]
    assert records["gpt2"]["settings"] == records["fastformer"]["settings"]
    probed = probe.load(out)
    assert probed.family == "fastformer" and probed.tokenizer is not None
    assert probed.config.max_position_embeddings == 64
    baseline = GPT2LMHeadModel.from_pretrained(tmp_path / "ff-gpt2")
    assert baseline.config.n_embd == probed.config.hidden_size == 32
    assert probe.load(tmp_path / "ff-gpt2").family == "gpt2"
    html = (out / "training.html").read_text()
    assert "fastformer" in html and "gpt2" in html and html.count("<svg") == 2
    ds = probe.open_result(out / "training.nc")
    assert list(ds.model.values) == ["fastformer", "gpt2"]
    # The folder generates text with its own tokenizer.
    ids = probed.tokenizer("The ", return_tensors="pt").input_ids
    generated = probed.model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert generated.shape == (1, 9)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hidden", "30", "--heads", "4"], "not a multiple of --heads"),
        (["--baseline", "lstm"], "--baseline must be one of gpt2"),
        (["--context", "100000"], "too short"),
    ],
)
def test_bad_settings_fail_in_one_line(tmp_path, args, message):
    text_file = tmp_path / "text.txt"
    text_file.write_text(sample_text(), encoding="utf-8")
    result = invoke("fastformer", "train", "--text", text_file, "--out", tmp_path / "o", *args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file_fails_before_any_work(tmp_path):
    target = tmp_path / "file"
    target.write_text("not a folder")
    result = invoke("fastformer", "train", "--text", "stdlib", "--out", target, "--quick")
    assert result.exit_code == 2 and "is a file" in result.output
    assert target.read_text() == "not a folder"


@pytest.mark.parametrize("layers", [1, 3, 5])
@pytest.mark.parametrize("kind", ["fastformer", "gpt2"])
def test_the_memory_check_counts_the_parameters_of_any_depth_exactly(kind, layers):
    # The count comes from one layer and two (a deep stack is never built); it must equal
    # the parameters of the model built at that depth.
    from probe.fastformer.train_settings import _meta_parameters, fastformer_for, gpt2_for

    build = {"fastformer": fastformer_for, "gpt2": gpt2_for}[kind]
    settings = TrainSettings(text="x", text_source="t", out="o", hidden=12, heads=3,
                             layers=layers, context=10)  # fmt: skip
    with torch.device("meta"):
        built = sum(p.numel() for p in build(settings, 40).parameters())
    assert _meta_parameters(build, settings, 40) == built


def test_a_stack_of_millions_of_layers_is_refused_by_its_memory_without_being_built(tmp_path):
    # Found by the long fuzz: --layers 8637214 built every layer on the meta device first.
    text = tmp_path / "text.txt"
    text.write_text(sample_text(), encoding="utf-8")
    result = invoke("fastformer", "train", "--text", text, "--out", tmp_path / "ff",
                    "--layers", "8637214", "--hidden", "8", "--heads", "1", "--context", "3",
                    "--batch", "1", "--steps", "1")  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "needs about" in result.stderr and "--layers" in result.stderr
    assert not (tmp_path / "ff").exists()


def test_the_final_numbers_of_a_training_result_are_variables(tmp_path):
    # Each model's final validation bits per character and parameter count are data: variables
    # on the model dim, not JSON in attrs.  A result written before kept them as JSON
    # attributes; its report reads those and says the same.
    from pathlib import Path

    from probe.fastformer.train import curves, read_training
    from probe.files.results import open_result, save_result
    from probe.reports.training import finals, render_training

    shipped = Path(probe.__file__).parent / "checkpoints"
    records = [read_training(shipped / "fastformer-tiny"), read_training(shipped / "gpt2-tiny")]
    save_result(curves(records), tmp_path / "training.nc")
    ds = open_result(tmp_path / "training.nc")
    assert ds["final_val_bits_per_char"].dims == ("model",) == ds["parameters"].dims
    assert ds["final_val_bits_per_char"].values.tolist() == [
        r["final_val_bits_per_char"] for r in records
    ]
    assert ds["parameters"].values.tolist() == [r["parameters"] for r in records]
    assert ds["parameters"].dtype.kind == "i"
    assert "parameters" not in ds.attrs and "final_val_bits_per_char" not in ds.attrs
    names = [str(m) for m in ds.model.values]
    assert finals(ds) == [
        (n, r["final_val_bits_per_char"], r["parameters"])
        for n, r in zip(names, records, strict=True)
    ]
    old = ds.drop_vars(["final_val_bits_per_char", "parameters"]).assign_attrs(
        final_val_bits_per_char=json.dumps(
            {n: r["final_val_bits_per_char"] for n, r in zip(names, records, strict=True)}
        ),
        parameters=json.dumps({n: r["parameters"] for n, r in zip(names, records, strict=True)}),
    )
    assert finals(old) == finals(ds)
    summary = f"{names[0]}: {records[0]['final_val_bits_per_char']:.3f} bits/char"
    assert summary in render_training(ds) and f"{records[1]['parameters']:,} parameters" in (
        render_training(old)
    )
