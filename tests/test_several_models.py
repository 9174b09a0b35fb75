"""Several models in one command are all checked before the first runs.

A command line whose first model is good and whose second fails a check that needs no run
(no such model, no weights, a refused family, fewer tokens than --tokens, a branch scale
its family does not run, the wrong input kind) exits 2 with one line naming the second
model, prints no result and leaves --out without result, report or index.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app

runner = CliRunner()
TINY = Path(__file__).resolve().parents[1] / "probe" / "checkpoints" / "gpt2-tiny"
SIZES = ["--sequences", "2", "--tokens", "16", "--quiet"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """Second models that fail a check made before any run."""
    root = tmp_path_factory.mktemp("several")
    config = json.loads((TINY / "config.json").read_text())
    made = {}
    for name, data in (
        ("short", {**config, "n_positions": 8}),  # takes at most 8 tokens
        ("config-only", config),  # no weights to load pretrained
        ("mamba", {"model_type": "mamba", "num_hidden_layers": 2, "hidden_size": 32}),
    ):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(data))
        made[name] = str(root / name)
    steps = root / "steps-0"  # a copy of gpt2-tiny: the good first checkpoint of a sweep
    shutil.copytree(TINY, steps)
    made["steps-0"] = str(steps)
    text = root / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    made["text"] = str(text)
    return made


def refused(args: list[str], out: Path, second: str, words: str) -> None:
    """``probe ARGS --out OUT``: exit 2, one error line naming ``second``, nothing written."""
    result = runner.invoke(app, [*args, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("probe: error:"), lines[0]
    assert second in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""  # not even the first model's table
    assert not out.exists() or not list(out.rglob("*")), list(out.rglob("*"))


ATTENTION = [
    # (second model, extra options, words of the line)
    ("no/such-model", [], "no/such-model"),
    ("{short}", ["--init", "random"], "takes at most 8 tokens per sequence; use --tokens 8"),
    ("{config-only}", [], "cannot load pretrained weights"),
    ("{mamba}", ["--init", "random"], "model family 'mamba' is refused"),
    ("fastformer-tiny", ["--branch-scale", "0.5"], "leave --branch-scale out"),
    (
        "google/vit-base-patch16-224",
        ["--init", "random", "--text", "{text}"],
        "reads images, not text",
    ),
]


@pytest.mark.parametrize(
    ("second", "extra", "words"), ATTENTION, ids=[case[0].strip("{}") for case in ATTENTION]
)
def test_attention_checks_every_model_first(second, extra, words, folders, tmp_path):
    second = second.format(**folders)
    extra = [arg.format(**folders) for arg in extra]
    args = ["attention", "gpt2-tiny", second, *SIZES, *extra]
    refused(args, tmp_path / "out", second, words)


def test_attention_checks_into_an_existing_folder(folders, tmp_path):
    """A folder that holds files already keeps exactly them: no result, no index."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    result = runner.invoke(
        app,
        ["attention", "gpt2-tiny", folders["short"], *SIZES, "--init", "random", "--out", out],
        catch_exceptions=False,
    )
    assert result.exit_code == 2, result.output
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_attention_runs_every_model_once_checked(tmp_path):
    """Two good models still give two results and the index."""
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        ["attention", "gpt2-tiny", "fastformer-tiny", *SIZES, "--init", "random", "--out", out],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert "index.html" in names
    assert len([n for n in names if n.endswith(".nc")]) == 2, names


SWEEP = [
    ("{short}", ["--init", "random"], "takes at most 8 tokens per sequence"),
    ("{config-only}", [], "cannot load pretrained weights"),
    ("{mamba}", ["--init", "random"], "mamba"),
]


@pytest.mark.parametrize(
    ("second", "extra", "words"), SWEEP, ids=[case[0].strip("{}") for case in SWEEP]
)
def test_sweep_checks_every_checkpoint_first(second, extra, words, folders, tmp_path):
    """``probe sweep A B --steps 0,1``: the second folder is refused before the first point
    runs, so no point store is left behind either."""
    second = second.format(**folders)
    args = ["sweep", folders["steps-0"], second, "--steps", "0,1", *SIZES, *extra]
    refused(args, tmp_path / "out", "step=1", words)


def test_collapse_checks_every_model_first(folders, tmp_path):
    """The reference behaviour: collapse refuses the same lines before it runs anything."""
    args = ["collapse", "gpt2-tiny", folders["short"], *SIZES, "--init", "random"]
    refused(args, tmp_path / "out", folders["short"], "takes at most 8 tokens")
