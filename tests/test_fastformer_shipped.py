"""The two trained checkpoints that ship with probe: found by name, offline, really trained."""

from __future__ import annotations

import json
import math

import pytest
import torch

import probe
from probe.fastformer.shipped import SHIPPED, shipped_path
from probe.requests.inputs import sample_text
from tests.test_cli import invoke


@pytest.mark.parametrize(
    ("name", "family"), [("fastformer-tiny", "fastformer"), ("gpt2-tiny", "gpt2")]
)
def test_shipped_checkpoint_loads_by_name_with_its_tokenizer(name, family):
    probed = probe.load(name)
    assert probed.family == family and probed.tokenizer is not None
    assert "shipped checkpoint" in probed.source
    record = json.loads((shipped_path(name) / "training.json").read_text())
    assert record["command"].startswith("probe fastformer train --text stdlib")
    assert record["data"]["source"] == "docstrings of the Python standard library"
    # Trained past the text's unigram entropy (~4.5 bits/char, where both curves pass
    # after ~40 steps); uniform guessing over ~110 characters would be ~6.8.
    assert 1.0 < record["final_val_bits_per_char"] < 4.0


def test_the_pair_was_trained_together():
    fast, gpt2 = (json.loads((shipped_path(n) / "training.json").read_text()) for n in SHIPPED)
    assert fast["command"] == gpt2["command"] and "--baseline gpt2" in fast["command"]
    assert fast["settings"] == gpt2["settings"] and fast["data"] == gpt2["data"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_weights_are_trained(name):
    """On this project's own sample text (not the training data), far below a uniform guess."""
    from transformers import AutoModelForCausalLM

    folder = shipped_path(name)
    tokenizer = probe.load(name).tokenizer
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(sample_text()[:1024], return_tensors="pt").input_ids
    ids = ids[:, : model.config.max_position_embeddings]
    with torch.no_grad():
        bits = model(input_ids=ids, labels=ids).loss.item() / math.log(2)
    assert bits < 0.7 * math.log2(len(tokenizer)), bits


def test_collapse_of_both_shipped_checkpoints_offline(tmp_path):
    result = invoke(
        "collapse", "fastformer-tiny", "gpt2-tiny", "--init", "pretrained", "--no-skip",
        "--sequences", "2", "--tokens", "16", "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.glob("*.html"))
    assert any("fastformer-tiny" in n for n in names) and any("gpt2-tiny" in n for n in names)
    assert any(n.startswith("comparison") for n in names)


def test_other_names_are_not_shipped():
    assert shipped_path("gpt2") is None and shipped_path("fastformer") is None


def test_the_command_resolves_names_without_the_fastformer_code():
    """The ``probe`` command (argv[0] ``probe``: ``import probe`` registers nothing) resolves a
    name without importing the Fastformer's modelling code, and registers the Fastformer when
    a config names it: the shipped checkpoint and a copy of its folder both read as one."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    copy = Path(tempfile.mkdtemp()) / "mine"
    shutil.copytree(shipped_path("fastformer-tiny"), copy)
    script = f"""
import sys
sys.argv = ["probe"]
from probe.loading.resolve import read_config
config, _ = read_config("bert-base-uncased")
assert config.model_type == "bert", config.model_type
assert "probe.fastformer" not in sys.modules, "resolving bert-base-uncased imported the Fastformer"
for name in ("fastformer-tiny", {str(copy)!r}):
    config, _ = read_config(name, prefer_bundled=False)
    assert type(config).__name__ == "FastformerConfig", type(config)
print("ok")
"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
        )
    finally:
        shutil.rmtree(copy.parent)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
