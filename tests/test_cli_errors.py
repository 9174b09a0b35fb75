"""Every command against a table of bad inputs: exit code 2, one line, no traceback, no file.

The table is the place to add a case whenever a user finds a new way to get a
traceback or a misleading message.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import probe
from cli.app import app
from tests.datasets import make_collapse_dataset

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
# A folder that exists but that nobody, root included, can create files in.
UNWRITABLE = "/proc"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("inputs")
    good = folder / "good.nc"
    probe.save_result(make_collapse_dataset(), good)
    other = folder / "other.nc"
    probe.save_result(make_collapse_dataset(model="other", seed=1), other)
    damaged = folder / "damaged.nc"
    probe.save_result(make_collapse_dataset().drop_vars("stable_rank"), damaged)
    empty = folder / "empty.txt"
    empty.write_text("  \n")
    latin = folder / "latin1.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    a_file = folder / "a-file"
    a_file.write_text("x")
    (folder / "textdir").mkdir()
    return {
        "good": str(good),
        "other": str(other),
        "damaged": str(damaged),
        "empty": str(empty),
        "latin": str(latin),
        "a_file": str(a_file),
        "textdir": str(folder / "textdir"),
    }


# (arguments, a piece of the one line); {name} is filled from the files fixture,
# {tiny} is a tiny random BERT folder, OUT is the test's (empty) output folder.
CASES = [
    # collapse: models
    (
        ["collapse", "bert-base-uncased"],
        "cannot get bert-base-uncased: its config is not in the local HuggingFace cache",
    ),
    (["collapse", "./nowhere"], "no such model folder"),
    (
        ["collapse", "{tiny}", "./nowhere", "--init", "random", "--tokens", "8"],
        "no such model folder",
    ),
    (["collapse", "{textdir}"], "without config.json"),
    (["collapse"], "Missing argument"),
    # collapse: options
    (["collapse", "gpt2", "--init", "ranom"], "--init"),
    (["collapse", "gpt2", "--bogus"], "No such option: --bogus"),
    (["collapse", "gpt2", "--init", "random", "--variants", "SAN,XYZ"], "unknown variant XYZ"),
    (["collapse", "gpt2", "--init", "random", "--variants", ""], "--variants is empty"),
    (["collapse", "gpt2", "--init", "random", "--variants", " , "], "unknown variant"),
    (
        ["collapse", "gpt2", "--init", "random", "--no-skip", "--variants", "SAN"],
        "either --variants",
    ),
    (["collapse", "gpt2", "--init", "random", "--seed", str(2**64)], "--seed"),
    (["collapse", "gpt2", "--init", "random", "--seed", "-1"], "--seed"),
    (["collapse", "gpt2", "--init", "random", "--sequences", "0"], "--sequences"),
    (["collapse", "gpt2", "--init", "random", "--tokens", "1"], "--tokens"),
    (["collapse", "gpt2", "--init", "random", "--batch-size", "0"], "--batch-size"),
    (["collapse", "gpt2", "--init", "random", "--dtype", "float16x"], "--dtype"),
    (["collapse", "gpt2", "--init", "random", "--surgery", "nope"], "--surgery"),
    (["collapse", "gpt2", "--init", "random", "--device", "cuda"], "no CUDA device"),
    (["collapse", "gpt2", "--init", "random", "--device", "tpu:x"], "unknown device"),
    (["collapse", "minilm", "--tokens", "600"], "at most 512 tokens"),
    # collapse: config overrides, revisions, branch scaling
    (["collapse", "gpt2", "--set", "n_layer=2"], "runs at random init only; use --init random"),
    (["collapse", "gpt2", "--init", "random", "--set", "n_layr=2"], "did you mean n_layer?"),
    (["collapse", "gpt2", "--init", "random", "--set", "n_layer=abc"], "takes a whole number"),
    (["collapse", "gpt2", "--init", "random", "--set", "n_layer=2.5"], "not a real number"),
    (["collapse", "gpt2", "--init", "random", "--set", "n_head=5"], "gpt2 with n_head=5"),
    (["collapse", "gpt2", "--init", "random", "--set", "n_layer"], "--set takes KEY=VALUE"),
    (["collapse", "gpt2", "--init", "random", "--set", "=2"], "--set takes KEY=VALUE"),
    (
        ["collapse", "gpt2", "--init", "random", "--set", "n_layer=2", "--set", "n_layer=3"],
        "--set sets n_layer twice",
    ),
    (["collapse", "{tiny}", "--set", "num_hidden_layers=1", "--init", "both"], "random init only"),
    (["collapse", "gpt2", "--init", "random", "--revision", "step1"], "cannot be had offline"),
    (["collapse", "{tiny}", "--revision", "main"], "is a local folder, not a hub id"),
    (["collapse", "gpt2-tiny", "--revision", "main"], "probe's own checkpoint"),
    (["collapse", "gpt2", "--init", "random", "--revision", ""], "--revision '' is not a"),
    (["collapse", "gpt2", "--init", "random", "--branch-scale", "0"], "finite positive"),
    (["collapse", "gpt2", "--init", "random", "--branch-scale", "x"], "unknown name 'x'"),
    (["collapse", "gpt2", "--init", "random", "--branch-scale", "1/(L-12)"], "at depth L=12"),
    (
        ["collapse", "gpt2", "--init", "random", "--branch-scale", "0.5", "--variants", "no-LN"],
        "leave LN-affine and no-LN out",
    ),
    (
        ["collapse", "fastformer-tiny", "--branch-scale", "0.5", "--init", "random"],
        "leave --branch-scale out",
    ),
    (["attention", "gpt2", "--set", "n_layer=2"], "runs at random init only"),
    # collapse: text
    (["collapse", "minilm", "--text", "missing.txt"], "no such text file"),
    (["collapse", "minilm", "--text", "{textdir}"], "is a directory"),
    (["collapse", "minilm", "--text", "{empty}"], "is empty"),
    (["collapse", "minilm", "--text", "{latin}"], "is not UTF-8"),
    (
        ["collapse", "gpt2", "--init", "random", "--text", "README.md"],
        "needs the model's tokenizer",
    ),
    # collapse: output folder
    (["collapse", "gpt2", "--init", "random", "--out", "{a_file}"], "is a file"),
    (["collapse", "gpt2", "--init", "random", "--out", UNWRITABLE], "cannot write to --out"),
    # compare
    (["compare", "missing.nc", "{good}"], "no such result file"),
    (["compare", "README.md", "{good}"], "is not a probe result"),
    (["compare", "{good}"], "at least two result files"),
    (["compare", "{good}", "{good}"], "given more than once"),
    (["compare", "{good}", "{damaged}"], "without the variable 'stable_rank'"),
    (["compare", "{good}", "{other}", "--out", UNWRITABLE], "cannot write to --out"),
    (["compare", "nothing-*.nc", "{good}"], "no result file matches"),
    # report
    (["report", "list", "nowhere"], "no such report folder: nowhere"),
    (["report", "list", "{textdir}", "--out", "{out}"], "give the folder once"),
    (["report", "open", "missing.html"], "no such report"),
    (["report", "open", "latest", "--out", "nowhere"], "no such report folder: nowhere"),
    (["report", "build", "missing.nc"], "no such result file"),
    (["report", "build", "{damaged}"], "without the variable 'stable_rank'"),
    (["report", "build", "{good}", "--out", UNWRITABLE], "cannot write to --out"),
    (["report", "frobnicate"], "No such command"),
    # paths
    (["paths"], "choose one of --count"),
    (["paths", "--count", "--sample", "minilm"], "choose one of --count"),
    (["paths", "--sample"], "--sample needs a MODEL"),
    (["paths", "--decompose", "./nowhere"], "no such model folder"),
    (["paths", "--sample", "minilm", "--layers", "3"], "--layers do not apply to --sample"),
    (["paths", "--count", "--out", UNWRITABLE], "cannot write to --out"),
    (["paths", "--sample", "minilm", "--seed", str(2**64)], "--seed"),
    # fastformer
    (["fastformer", "train", "--text", "missing.txt", "--out", "{out}/ff"], "no such text file"),
    (["fastformer", "train", "--text", "{textdir}", "--out", "{out}/ff"], "is a directory"),
    (["fastformer", "train", "--text", "README.md", "--out", UNWRITABLE + "/ff"], "cannot write"),
    (["fastformer", "train", "--text", "README.md", "--out", "{a_file}"], "is a file"),
    (["fastformer", "train", "--text", "README.md", "--out", "{out}/ff", "--seed", "-1"], "--seed"),
    # toy
    (["toy", "sort", "--out", UNWRITABLE, "--quick"], "cannot write to --out"),
    (["toy", "sort", "--out", "{a_file}", "--quick"], "is a file"),
    (["toy", "sort", "--seed", str(2**64), "--quick"], "--seed"),
    (["toy", "memorization", "--text", "missing.txt", "--quick"], "no such text file: missing.txt"),
    (["toy", "frobnicate"], "No such command"),
    (["models", "--bogus"], "No such option"),
    (["frobnicate"], "No such command"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input(args, message, files, tiny_folders, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    out.mkdir()
    filled = [a.format(tiny=tiny_folders["bert"], out=out, **files) for a in args]
    if args[0] in ("collapse", "toy") and "--out" not in args and len(args) > 1:
        filled += ["--out", str(out)]
    if args[0] == "collapse":
        filled += ["--quiet"] if len(args) > 1 else []
    result = runner.invoke(app, filled, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("probe: error:") and message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert not list(out.iterdir())


def test_proc_is_really_unwritable():
    """The cases above rely on it: if this fails, choose another UNWRITABLE folder."""
    assert os.path.isdir(UNWRITABLE)
    with pytest.raises(OSError):
        Path(UNWRITABLE, "probe-test").write_text("x")
