"""Checkpoints along training (`--save-every`) and the shipped series ``gpt2-tiny-steps``.

A run with ``save_every`` must train exactly as one without it (the final weights compared
byte for byte), its step folders must hold the weights at their steps (step 0 = the init
drawn from the seed; step k evaluated again from the folder gives the curve's number at k),
and the shipped series must load offline, steps ascending, within its 10 MB budget.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from pathlib import Path

import hypothesis
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import probe
from probe.errors import ProbeError
from probe.fastformer import train_steps
from probe.fastformer.tokenizer import char_tokenizer, encode
from probe.fastformer.train import (
    TrainSettings,
    evaluate,
    gpt2_for,
    save_steps,
    series_folder,
    split,
    train,
)
from probe.loading import shipped
from probe.loading.identity import folder_fingerprint
from probe.loading.shipped import SERIES, SERIES_FILE, STEP_FILE, series
from probe.requests.inputs import sample_text
from tests.paths_tiny import one_thread  # noqa: F401  (autouse: one torch thread here)
from tests.test_cli import invoke

ROOT = Path(__file__).resolve().parents[1]


# --- which steps are saved ---------------------------------------------------------------


def test_log_spacing_by_hand():
    assert save_steps("log", 400) == [0, 1, 3, 10, 30, 100, 400]  # 300: within 2x of 400
    assert save_steps("log", 1000) == [0, 1, 3, 10, 30, 100, 300, 1000]
    assert save_steps("log", 1) == [0, 1]
    assert save_steps("log", 2) == [0, 1, 2]
    assert save_steps("log", 5) == [0, 1, 5]  # 3 is within 2x of 5
    assert save_steps("log", 6) == [0, 1, 3, 6]


def test_every_n_by_hand():
    assert save_steps(2, 5) == [0, 2, 4, 5]
    assert save_steps(5, 10) == [0, 5, 10]
    assert save_steps(100, 40) == [0, 40]
    assert save_steps(1, 3) == [0, 1, 2, 3]


@hypothesis.settings(deadline=None)
@given(every=st.one_of(st.integers(1, 500), st.just("log")), total=st.integers(1, 20_000))
def test_saved_steps_run_from_the_init_to_the_last_step(every, total):
    steps = save_steps(every, total)
    assert steps[0] == 0 and steps[-1] == total
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))
    if every == "log":
        # Each at least twice the one before (after step 1); never more than 10x apart but
        # for the last interval, which the dropped step may widen to 20x.
        assert all(b >= 2 * a for a, b in zip(steps[1:], steps[2:], strict=False))
        assert all(b <= 10 * a for a, b in zip(steps[1:-1], steps[2:-1], strict=False))
    else:
        assert steps[:-1] == list(range(0, total, every))


def test_the_cli_constants_are_the_library_ones():
    from cli import fastformer_cmd

    assert fastformer_cmd.SAVE_LOG == train_steps.LOG
    assert fastformer_cmd.SAVE_DTYPES == train_steps.SAVE_DTYPES
    assert fastformer_cmd.SERIES == SERIES_FILE


# --- a tiny run, with and without --save-every ------------------------------------------------


def _tiny(out: Path, **extra) -> TrainSettings:
    return TrainSettings(
        text=sample_text(), text_source="sample", out=out, hidden=16, layers=1, heads=2,
        context=16, steps=5, batch=2, lr=3e-3, eval_every=1, eval_windows=4,
        baseline="gpt2", **extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The same tiny run twice: without checkpoints, and with one every 2 steps."""
    root = tmp_path_factory.mktemp("runs")
    plain = train(_tiny(root / "plain" / "ff"))
    saved = train(_tiny(root / "saved" / "ff", save_every=2))
    return root, plain, saved


def test_saving_leaves_the_training_bit_for_bit_as_it_was(tiny_runs):
    root, plain, saved = tiny_runs
    for name in ("ff", "ff-gpt2"):
        a = (root / "plain" / name / "model.safetensors").read_bytes()
        b = (root / "saved" / name / "model.safetensors").read_bytes()
        assert a == b, name
    for one, other in zip(plain, saved, strict=True):
        assert one.train_loss == other.train_loss
        assert one.val_bits_per_char == other.val_bits_per_char
    assert sorted(p.name for p in (root / "plain").iterdir()) == ["ff", "ff-gpt2"]
    assert sorted(p.name for p in (root / "saved").iterdir()) == [
        "ff", "ff-gpt2", "ff-gpt2-steps", "ff-steps",
    ]  # fmt: skip


def test_each_step_folder_holds_the_weights_at_its_step(tiny_runs):
    root, _, saved = tiny_runs
    settings = _tiny(root / "saved" / "ff", save_every=2)
    _, val = split(encode(char_tokenizer(settings.text), settings.text), settings.val_fraction)
    for curve in saved:
        folder = series_folder(curve.folder)
        found = series(str(folder))
        assert [step for step, _ in found] == [0, 2, 4, 5]
        record = json.loads((folder / SERIES_FILE).read_text())
        assert record["steps"] == [0, 2, 4, 5] and record["model"] == curve.name
        assert record["command"] == settings.command and record["dtype"] == "float32"
        for step, step_folder in found:
            one = json.loads((step_folder / STEP_FILE).read_text())
            assert one["step"] == step and one["settings"]["save_every"] == 2
            model = probe.load(step_folder).model  # the base model, for the family
            lm = AutoModelForCausalLM.from_pretrained(step_folder).eval()
            assert next(model.parameters()).dtype == torch.float32
            if step == 0:
                assert one["train_loss"] is None
            else:  # the curve's numbers at that step (eval_every 1: every step evaluated)
                assert one["train_loss"] == curve.train_loss[step - 1]
                assert one["val_bits_per_char"] == curve.val_bits_per_char[step - 1]
            # The folder's weights give its recorded validation loss again, exactly (the
            # same float32 weights through the same operations).
            assert evaluate(lm, val, settings) == one["val_bits_per_char"]
        last = load_file(folder / "step-000005" / "model.safetensors")
        final = load_file(Path(curve.folder) / "model.safetensors")
        assert last.keys() == final.keys()
        assert all(torch.equal(last[k], final[k]) for k in final)


def test_step_zero_is_the_init_drawn_from_the_seed(tiny_runs):
    root, _, _ = tiny_runs
    settings = _tiny(root / "x")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        init = gpt2_for(settings, len(char_tokenizer(settings.text))).state_dict()
    saved = load_file(root / "saved" / "ff-gpt2-steps" / "step-000000" / "model.safetensors")
    assert saved and all(torch.equal(saved[k], init[k]) for k in saved)


def test_float16_steps_are_the_weights_rounded_and_load_as_float32(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(sample_text(), encoding="utf-8")
    result = invoke(
        "fastformer", "train", "--text", text, "--out", tmp_path / "ff", "--baseline", "gpt2",
        "--hidden", "16", "--layers", "1", "--heads", "2", "--context", "16", "--steps", "3",
        "--batch", "2", "--quick", "--eval-every", "3", "--save-every", "log",
        "--save-dtype", "float16",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "checkpoints along training -> " in result.output
    found = series(str(tmp_path / "ff-gpt2-steps"))
    assert [s for s, _ in found] == [0, 1, 3]
    last = load_file(found[-1][1] / "model.safetensors")
    final = load_file(tmp_path / "ff-gpt2" / "model.safetensors")
    assert all(last[k].dtype == torch.float16 for k in last)
    assert all(torch.equal(last[k], final[k].half()) for k in final)
    loaded = probe.load(found[-1][1])
    assert next(loaded.model.parameters()).dtype == torch.float32
    record = json.loads((found[-1][1] / STEP_FILE).read_text())
    assert "--save-every log --save-dtype float16" in record["command"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--save-every", "0"], "--save-every must be a whole number from 1"),
        (["--save-every", "-3"], "--save-every must be a whole number from 1"),
        (["--save-every", "often"], "--save-every must be a whole number from 1"),
        (["--save-every", "2", "--save-dtype", "int8"], "--save-dtype must be one of"),
        (["--save-dtype", "float16"], "--save-dtype goes with --save-every"),
        (["--save-every", "2", "--baseline", "gpt2", "--baseline-out", "o-steps"], "overlap"),
    ],
)
def test_bad_saving_is_one_line_before_any_work(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = invoke("fastformer", "train", "--text", "stdlib", "--out", "o", "--quick", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert list(tmp_path.iterdir()) == []


def test_a_folder_another_tool_wrote_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o-steps").mkdir()
    (tmp_path / "o-steps" / "notes.txt").write_text("mine")
    result = invoke("fastformer", "train", "--text", "stdlib", "--out", "o", "--quick",
                    "--save-every", "5")  # fmt: skip
    assert result.exit_code == 2 and "was not written by probe fastformer train" in result.output
    assert (tmp_path / "o-steps" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(save_every=0), "`save_every` must be a whole number from 1"),
        (dict(save_every=True), "`save_every` must be a whole number from 1"),
        (dict(save_every="2"), "`save_every` must be a whole number from 1"),
        (dict(save_every=2, save_dtype="float8"), "unknown `save_dtype`"),
    ],
)
def test_bad_saving_in_the_library_is_one_line(tmp_path, change, message):
    settings = dataclasses.replace(_tiny(tmp_path / "o"), **change)
    with pytest.raises(ProbeError, match=message):
        settings.check_options()


# --- resolving a series ---------------------------------------------------------------------


def _copy_series(tmp_path: Path, name: str = "run-steps") -> Path:
    import shutil

    target = tmp_path / name
    shutil.copytree(shipped.series_path(SERIES[0]), target)
    return target


def test_a_name_that_is_no_series_is_none(tmp_path):
    assert series("gpt2-tiny") is None and series("gpt2") is None
    assert series(str(tmp_path)) is None  # a folder without series.json


def test_a_damaged_series_is_refused_in_one_line(tmp_path):
    root = _copy_series(tmp_path)
    record = json.loads((root / SERIES_FILE).read_text())
    import shutil

    shutil.rmtree(root / f"step-{record['steps'][1]:06d}")
    with pytest.raises(ProbeError, match="is damaged: .* has no config.json"):
        series(str(root))
    (root / SERIES_FILE).write_text(json.dumps({**record, "steps": [3, 1]}))
    with pytest.raises(ProbeError, match="'steps' is not an ascending list"):
        series(str(root))


def test_collapse_of_a_series_says_it_is_one_in_one_line(tmp_path, monkeypatch):
    def refused(name, where):
        result = invoke("collapse", name, "--init", "pretrained", "--out", tmp_path / "r")
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "is a series of 7 checkpoints" in lines[0], result.output
        assert "probe sweep" in lines[0] and f"{where}/step-000400" in lines[0], lines[0]

    refused(SERIES[0], str(shipped.series_path(SERIES[0])))  # by name
    other = _copy_series(tmp_path)
    refused(str(other), str(other))  # a folder a run wrote
    _copy_series(tmp_path, SERIES[0])  # a local folder of the series' own name wins
    monkeypatch.chdir(tmp_path)
    refused(SERIES[0], SERIES[0])
    assert not (tmp_path / "r").exists()


# --- the shipped series -----------------------------------------------------------------------


def test_the_shipped_series_resolves_offline_steps_ascending():
    found = series("gpt2-tiny-steps")
    root = shipped.series_path("gpt2-tiny-steps")
    record = json.loads((root / SERIES_FILE).read_text())
    assert [s for s, _ in found] == record["steps"] == [0, 1, 3, 10, 30, 100, 400]
    for step, folder in found:
        one = json.loads((folder / STEP_FILE).read_text())
        assert one["step"] == step and one["model"] == "gpt2" and one["dtype"] == "float16"
        assert one["command"] == record["command"]
    assert record["command"].startswith("probe fastformer train --text stdlib")
    assert "--save-every log --save-dtype float16" in record["command"]
    # The recipe of the shipped gpt2-tiny.
    tiny = json.loads((shipped.shipped_path("gpt2-tiny") / "training.json").read_text())
    assert record["data"] == tiny["data"]
    assert {k: record["settings"][k] for k in tiny["settings"]} == tiny["settings"]
    # Training lowers the held-out loss (from the init's ~log2(vocab) bits per character).
    bits = record["val_bits_per_char"]
    assert bits[0] > 6 and bits[-1] < 4 and bits[-1] < bits[2] < bits[0]


def test_the_shipped_series_is_float16_within_10_mb():
    root = shipped.series_path("gpt2-tiny-steps")
    files = [p for p in root.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 10 * 10**6
    for _, folder in series("gpt2-tiny-steps"):
        weights = load_file(folder / "model.safetensors")
        assert {t.dtype for t in weights.values()} == {torch.float16}


def test_the_series_retrains_the_shipped_gpt2_tiny():
    """The same command, seed and data as gpt2-tiny: the same training losses, bit for bit,
    at the saved steps up to 10 (the runs part at float rounding later, from step 15: the
    series was trained with one thread; see 'made' in series.json)."""
    record = json.loads((shipped.series_path("gpt2-tiny-steps") / SERIES_FILE).read_text())
    tiny = json.loads((shipped.shipped_path("gpt2-tiny") / "training.json").read_text())
    curve = tiny["curve"]["train_loss"]
    early = [(s, loss) for s, loss in zip(record["steps"], record["train_loss"], strict=True)
             if 0 < s <= 10]  # fmt: skip
    assert [s for s, _ in early] == [1, 3, 10]
    assert all(loss == curve[s - 1] for s, loss in early)
    last = record["val_bits_per_char"][-1]
    assert abs(last - tiny["final_val_bits_per_char"]) < 1e-6  # 6.4e-8 apart


def test_models_lists_the_series():
    result = invoke("models")
    assert result.exit_code == 0 and "gpt2-tiny-steps" in result.output


def test_each_step_is_its_own_checkpoint():
    found = series("gpt2-tiny-steps")
    prints = {folder_fingerprint(folder) for _, folder in found}
    assert len(prints) == len(found)
    first, last = (probe.load(str(found[i][1])) for i in (0, -1))
    assert first.checkpoint["checkpoint_fingerprint"] != last.checkpoint["checkpoint_fingerprint"]
    assert first.checkpoint["checkpoint_path"] != last.checkpoint["checkpoint_path"]
    assert next(first.model.parameters()).dtype == torch.float32
    model = probe.Model(str(found[-1][1]), init="pretrained")
    assert model.init == ("pretrained",)


def test_float16_steps_load_into_the_dtype_asked_for():
    folder = series("gpt2-tiny-steps")[-1][1]
    stored = load_file(folder / "model.safetensors")["transformer.h.0.mlp.c_fc.weight"]
    for dtype, torch_dtype in (("float32", torch.float32), ("float64", torch.float64)):
        model = probe.load(str(folder), dtype=dtype).model
        weight = dict(model.named_parameters())["h.0.mlp.c_fc.weight"]
        assert weight.dtype == torch_dtype
        assert torch.equal(weight, stored.to(torch_dtype))  # float16 values are exact in both


def test_the_package_data_holds_every_checkpoint_file():
    """Every file under probe/checkpoints matches a package-data glob (else an installed
    probe would lack it)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["probe.checkpoints"]
    folder = ROOT / "probe" / "checkpoints"
    files = [p.relative_to(folder) for p in folder.rglob("*")]
    missing = [
        str(f)
        for f in files
        if (folder / f).is_file()
        and not any(fnmatch.fnmatch(str(f), g) and str(f).count("/") == g.count("/") for g in globs)
    ]
    assert files and not missing, missing


def test_bits_per_character_are_finite_in_every_step_record():
    for _, folder in series("gpt2-tiny-steps"):
        one = json.loads((folder / STEP_FILE).read_text())
        assert math.isfinite(one["val_bits_per_char"])
