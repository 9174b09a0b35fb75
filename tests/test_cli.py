"""The `probe` command through typer's CliRunner: outputs, files, one-line errors."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import probe
from cli.app import app
from tests.conftest import SLOW

README = Path(__file__).resolve().parents[1] / "README.md"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def small(*args, out, sequences=2, tokens=6):
    """`probe collapse ARGS` on a short input, writing into `out`."""
    return invoke("collapse", *args, "--sequences", sequences, "--tokens", tokens, "--out", out)


def readme_commands() -> list[str]:
    """Every `probe ...` line inside the README's shell code blocks."""
    blocks = re.findall(r"```(?:bash|sh|console)\n(.*?)```", README.read_text(), flags=re.S)
    lines = [line.strip().removeprefix("$ ") for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("probe ")]


def test_readme_has_examples():
    commands = readme_commands()
    assert any(
        c.startswith("probe collapse bert-base-uncased --no-skip --init random") for c in commands
    )
    assert "probe models" in commands


@pytest.mark.parametrize("command", readme_commands())
def test_readme_example(command, tmp_path, tiny_bert_with_tokenizer, monkeypatch):
    """Each README example runs as written (short inputs unless PROBE_SLOW=1)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text(
        "attention loses rank with depth, " * 200, encoding="utf-8"
    )
    args = shlex.split(command)[1:]
    args = [tiny_bert_with_tokenizer if a == "./my-checkpoint" else a for a in args]
    if args[0] == "collapse" and not SLOW:
        args += ["--sequences", "2", "--tokens", "16"]
    if args[0] in ("compare", "report"):  # the results the README's examples name
        invoke("collapse", "minilm", "--init", "pretrained", "--sequences", "2", "--tokens", "8")
        invoke("collapse", "gpt2", "--init", "random", "--sequences", "2", "--tokens", "8")
    result = invoke(*args)
    assert result.exit_code == 0, result.output


def test_collapse_prints_table_and_writes_files(tiny_folders, tmp_path):
    result = small(
        tiny_folders["bert"],
        "--init",
        "random",
        "--no-skip",
        "--no-mlp",
        out=tmp_path,
        sequences=3,
        tokens=8,
    )
    assert result.exit_code == 0, result.output
    assert "random · relative residual (l1inf, residual to the mean)" in result.output
    assert "SAN" in result.output and "transformer" not in result.output
    nc = tmp_path / "collapse-tiny-bert-random-float32.nc"
    assert f"result: {nc}" in result.output.replace("\n", "")
    ds = probe.open_result(nc)
    assert list(ds.variant.values) == ["SAN"] and list(ds.init.values) == ["random"]
    assert ds.attrs["command"].startswith(
        f"probe collapse {tiny_folders['bert']} --init random --no-skip"
    )
    assert (tmp_path / "collapse-tiny-bert-random-float32.html").is_file()
    assert (tmp_path / "index.html").is_file()


@pytest.mark.parametrize(
    "flags, variants",
    [
        ([], ["SAN", "SAN+MLP", "SAN+skip", "transformer"]),
        (["--no-skip"], ["SAN+MLP"]),
        (["--no-mlp"], ["SAN+skip"]),
        (["--variants", "transformer,SAN"], ["SAN", "transformer"]),
    ],
)
def test_variant_selection(flags, variants, tiny_folders, tmp_path):
    result = small(tiny_folders["gpt2"], "--init", "random", *flags, out=tmp_path)
    assert result.exit_code == 0, result.output
    ds = probe.open_result(next(tmp_path.glob("*.nc")))
    assert list(ds.variant.values) == variants


def test_metric_norm_fit_and_float64(tiny_folders, tmp_path):
    result = small(
        tiny_folders["xlnet"],
        "--init",
        "both",
        "--metric",
        "effective-rank",
        "--dtype",
        "float64",
        out=tmp_path,
    )
    assert result.exit_code == 0, result.output
    assert (
        "pretrained · effective rank" in result.output
        and "random · effective rank" in result.output
    )
    ds = probe.open_result(tmp_path / "collapse-tiny-xlnet-random-pretrained-float64.nc")
    assert ds.attrs["dtype"] == "float64"
    result = small(
        tiny_folders["xlnet"],
        "--init",
        "random",
        "--norm",
        "fro",
        "--fit",
        "svd",
        out=tmp_path,
    )
    assert "relative residual (fro, residual to the svd)" in result.output


def test_models_lists_families_and_configs():
    result = invoke("models")
    assert result.exit_code == 0
    for word in (
        "bert",
        "albert",
        "xlnet",
        "gpt2",
        "bert-base-uncased",
        "albert-base-v2",
        "xlnet-base-cased",
        "minilm",
    ):
        assert word in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["collapse", "bert-base-uncased"], "cannot get the weights of bert-base-uncased"),
        (["collapse", "./nowhere"], "no such model folder"),
        (["collapse", "gpt2", "--init", "ranom"], "--init"),
        (["collapse", "gpt2", "--bogus"], "No such option: --bogus"),
        (["collapse", "gpt2", "--init", "random", "--variants", "SAN,XYZ"], "unknown variant XYZ"),
        (
            ["collapse", "gpt2", "--init", "random", "--no-skip", "--variants", "SAN"],
            "either --variants or",
        ),
        (["collapse", "minilm", "--text", "missing.txt"], "no such text file"),
        (["collapse", "minilm", "--tokens", "600"], "at most 512 tokens"),
        (
            ["collapse", "gpt2", "--init", "random", "--text", "README.md"],
            "needs the model's tokenizer",
        ),
        (["collapse"], "Missing argument"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    result = invoke(*args, "--out", tmp_path / "out") if args != ["collapse"] else invoke(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("probe: error:"), result.output
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_out_is_a_file(tmp_path, tiny_folders):
    target = tmp_path / "file"
    target.write_text("x")
    result = invoke("collapse", tiny_folders["bert"], "--out", target)
    assert result.exit_code == 2 and "is a file" in result.output


def _two_results(folder: Path, tiny_folders) -> list[Path]:
    for family in ("bert", "gpt2"):
        result = small(tiny_folders[family], "--init", "random", out=folder)
        assert result.exit_code == 0, result.output
    return sorted(folder.glob("*.nc"))


def test_collapse_of_several_models_writes_a_comparison(tiny_folders, tmp_path):
    result = small(
        tiny_folders["bert"],
        tiny_folders["albert"],
        "--init",
        "random",
        out=tmp_path,
    )
    assert result.exit_code == 0, result.output
    comparison = tmp_path / "comparison-tiny-bert-tiny-albert.html"
    assert comparison.is_file()
    index = (tmp_path / "index.html").read_text()
    assert comparison.name in index and "collapse-tiny-albert-random-float32.html" in index


def test_compare_and_report_commands(tiny_folders, tmp_path, monkeypatch):
    files = _two_results(tmp_path, tiny_folders)
    result = invoke("compare", *files, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "comparison-tiny-bert-tiny-gpt2.html").is_file()

    monkeypatch.setenv("COLUMNS", "300")  # rich would fold long paths at 80 columns
    listed = invoke("report", "list", tmp_path)
    assert listed.exit_code == 0 and "tiny-gpt2" in listed.output and "comparison" in listed.output

    (tmp_path / "collapse-tiny-gpt2-random-float32.html").unlink()
    rebuilt = invoke("report", "build", tmp_path / "collapse-tiny-gpt2-random-float32.nc")
    assert rebuilt.exit_code == 0, rebuilt.output
    html = (tmp_path / "collapse-tiny-gpt2-random-float32.html").read_text()
    assert 'href="collapse-tiny-gpt2-random-float32.nc"' in html

    opened = []
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    result = invoke("report", "open", "latest", "--dir", tmp_path)
    assert result.exit_code == 0 and opened and opened[0].startswith("file://")
    newest = result.output.strip().splitlines()[0]
    assert Path(newest).name.startswith("comparison-")  # written last, listed first

    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    result = invoke("report", "open", tmp_path / "collapse-tiny-bert-random-float32.nc")
    assert result.exit_code == 0 and "no browser here" in result.output and len(opened) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "list", "nowhere"], "no report folder nowhere"),
        (["report", "open", "missing.html"], "no such report"),
        (["report", "build", "missing.nc"], "no such result file"),
        (["compare", "missing.nc"], "no such result file"),
        (["compare", "README.md"], "is not a probe result"),
    ],
)
def test_report_errors_are_one_line(args, message, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.output.startswith("probe: error:") and message in result.output
    assert len(result.output.strip().splitlines()) == 1
