"""``probe collapse --sequences all``: every full sequence of --text, through the CLI."""

from __future__ import annotations

from typer.testing import CliRunner

import probe
from cli.app import app


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_cli_sequences_all(tiny_bert_with_tokenizer, minilm_tokenizer, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("one two three four five six seven eight nine ten " * 7, encoding="utf-8")
    n = len(minilm_tokenizer(text.read_text(), add_special_tokens=False)["input_ids"]) // 8
    out = tmp_path / "out"
    args = ("collapse", tiny_bert_with_tokenizer, "--init", "random", "--tokens", 8)
    result = invoke(*args, "--text", text, "--sequences", "all", "--variants", "SAN", "--out", out)
    assert result.exit_code == 0, result.output
    (nc,) = out.glob("*.nc")
    assert probe.open_result(nc).sizes["sequence"] == n == 8
    bad = invoke(*args, "--sequences", "0", "--out", out)
    assert bad.exit_code == 2 and "--sequences must be a whole number from 1" in bad.output
