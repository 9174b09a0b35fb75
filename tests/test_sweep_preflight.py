"""A sweep checks every point before the first runs: the command line, its --dry-run and the
library alike refuse a grid whose later point would fail, naming that point, with nothing
run or written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from probe.analyses import sweep
from probe.errors import ProbeError

SIZES = ["--sequences", "2", "--batch-size", "2", "--no-attention", "--variants", "SAN"]


def _text(root: Path) -> str:
    path = root / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return str(path)


def _truncated(root: Path, folder: str) -> str:
    """A copy of ``folder`` whose weights file stops short."""
    copy = root / "truncated"
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4000])
    return str(copy)


def _reshaped(root: Path, folder: str) -> str:
    """A copy of ``folder`` whose config is twice as wide as its weights."""
    copy = root / "reshaped"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["n_embd"] *= 2
    (copy / "config.json").write_text(json.dumps(config))
    return str(copy)


# (the grid, the library's keywords, the point named, words of the line)
CASES = {
    "a token length past the position limit": (
        ["--init", "random", "--tokens", "8,100"],
        dict(init="random", tokens=[8, 100]),
        "point tokens=100",
        "takes at most 64 tokens",
    ),
    "a branch scale that fails at one depth": (
        ["--init", "random", "--tokens", "8", "--set", "n_layer=2,1", "--branch-scale", "1/(L-1)"],
        dict(init="random", tokens=8, config={"n_layer": [2, 1]}, branch_scale="1/(L-1)"),
        "point n_layer=1",
        "at depth L=1",
    ),
    "a truncated step folder": (
        ["--init", "pretrained", "--tokens", "8", "--steps", "0,1"],
        dict(init="pretrained", tokens=8),
        "point step=1",
        "incomplete metadata",
    ),
    "a step folder whose config does not fit its weights": (
        ["--init", "pretrained", "--tokens", "8", "--steps", "0,1"],
        dict(init="pretrained", tokens=8),
        "point step=1",
        "do not belong together",
    ),
    "a vocabulary too small for the text": (
        ["--init", "random", "--tokens", "8", "--set", "vocab_size=30522,100"],
        dict(init="random", tokens=8, config={"vocab_size": [30522, 100]}),
        "point vocab_size=100",
        "has 100 embeddings",
    ),
    "a branch scale on a family that has none": (
        ["--init", "random", "--tokens", "8", "--branch-scale", "1,0.5"],
        dict(init="random", tokens=8, branch_scale=[1, 0.5]),
        "point branch_scale=0.5",
        "leave --branch-scale out",
    ),
}


def _models(case: str, tmp_path: Path, folders: dict, tokenizer_bert: str) -> list[str]:
    if case == "a truncated step folder":
        return [folders["gpt2"], _truncated(tmp_path, folders["gpt2"])]
    if case == "a step folder whose config does not fit its weights":
        return [folders["gpt2"], _reshaped(tmp_path, folders["gpt2"])]
    if case == "a vocabulary too small for the text":
        return [tokenizer_bert]
    if case == "a branch scale on a family that has none":
        return ["fastformer-tiny"]
    return [folders["gpt2"]]


@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_point_that_would_fail_is_refused_before_any_runs(
    case, dry_run, tiny_folders, tiny_bert_with_tokenizer, tmp_path, monkeypatch
):
    from probe.cli.app import app

    grid, _, point, words = CASES[case]
    models = _models(case, tmp_path, tiny_folders, tiny_bert_with_tokenizer)
    text = ["--text", _text(tmp_path)] if "vocabulary" in case else []
    monkeypatch.chdir(tmp_path)
    args = ["sweep", *models, *grid, *SIZES, *text, "--out", "r", *(["--dry-run"] * dry_run)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2, done.output
    (line,) = done.output.strip().splitlines()
    assert line.startswith(f"probe: error: {point}: ") and words in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("case", [c for c in CASES if "step" not in c])
def test_the_library_names_the_point_before_any_runs(
    case, tiny_folders, tiny_bert_with_tokenizer, tmp_path
):
    import probe

    _, keywords, point, words = CASES[case]
    (model,) = _models(case, tmp_path, tiny_folders, tiny_bert_with_tokenizer)
    text = _text(tmp_path) if "vocabulary" in case else None
    inputs = probe.Inputs(text=text, sequences=2)
    with pytest.raises(ProbeError) as caught:
        sweep.plan(model, inputs, variants="SAN", attention=False, **keywords)
    assert str(caught.value).startswith(f"{point}: ")
    assert words.replace("--branch-scale", "`branch_scale`") in str(caught.value)


def test_a_sweep_without_tokens_checks_its_points_at_the_default_length(tmp_path):
    # No --tokens: the points run collapse's default length, and are checked at it.
    from probe.cli.app import app

    done = CliRunner().invoke(
        app, ["sweep", "gpt2-tiny", "--init", "random", "--seeds", "0,1", "--dry-run",
              "--out", str(tmp_path)],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    plan = sweep.plan("gpt2-tiny", init="random", seeds="0,1")
    assert len(plan.points) == 2
