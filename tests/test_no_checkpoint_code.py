"""No checkpoint's own Python code ever runs, whatever stdin answers.

A folder whose ``config.json`` (or ``tokenizer_config.json``) has an ``auto_map`` makes
transformers ask "Do you wish to run the custom code? [y/N]" and, on ``y``, import the
folder's module.  probe passes ``trust_remote_code=False`` everywhere and refuses such a
folder before transformers reads it.  Each case below runs the real command in a fresh
process with ``y`` on stdin and checks that the module's import side effect (a marker
file) never happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import probe
from cli.app import app
from probe.errors import ProbeError

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import BertConfig, BertModel
class EvilConfig(BertConfig):
    model_type = "probe-evil"
class EvilModel(BertModel):
    config_class = EvilConfig
"""


def _evil_folder(root: Path, tiny: str, model_type: str, where: str) -> tuple[Path, Path]:
    """A copy of a tiny BERT folder whose ``where`` file maps the Auto classes to evil.py."""
    folder = root / f"evil-{model_type}-{where.split('.')[0]}"
    shutil.copytree(tiny, folder)
    marker = root / f"ran-{folder.name}"
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    if where == "config.json":
        config["auto_map"] = auto_map
    else:
        (folder / where).write_text(
            json.dumps({"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
        )
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


COMMANDS = [
    ["collapse", "{dir}", "--init", "random", "--tokens", "8", "--sequences", "2"],
    ["collapse", "{dir}", "--init", "pretrained", "--tokens", "8", "--sequences", "2"],
    ["paths", "--count", "{dir}"],
    ["paths", "--sample", "{dir}", "--init", "random", "--tokens", "8", "--sequences", "1"],
    ["paths", "--decompose", "{dir}", "--init", "random", "--tokens", "8", "--sequences", "1"],
]
KINDS = [("probe-evil", "config.json"), ("bert", "config.json"), ("bert", "tokenizer_config.json")]


def _assert_refused(code: int, stdout: str, stderr: str, marker: Path, out: Path, where: str):
    assert not marker.exists(), "the checkpoint's code ran"
    assert code == 2, stderr
    assert stdout == ""  # no prompt either
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("probe: error:"), stderr
    assert "never runs a checkpoint's code" in lines[0] and where in lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("model_type,where", KINDS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_the_command_refuses_and_the_code_never_runs(
    command, model_type, where, tiny_folders, tmp_path
):
    # CliRunner hands the command a stdin holding "y": transformers' prompt would read it.
    folder, marker = _evil_folder(tmp_path, tiny_folders["bert"], model_type, where)
    out = tmp_path / "out"
    args = [part.replace("{dir}", str(folder)) for part in command]
    result = CliRunner().invoke(app, [*args, "--out", str(out)], input="y\ny\ny\n")
    _assert_refused(result.exit_code, result.stdout, result.stderr, marker, out, where)


def test_a_real_process_with_y_on_its_stdin_runs_no_code(tiny_folders, tmp_path):
    folder, marker = _evil_folder(tmp_path, tiny_folders["bert"], "probe-evil", "config.json")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "probe.cli", "collapse", str(folder), "--init", "pretrained"]
        + ["--tokens", "8", "--sequences", "2", "--out", str(out)],
        input="y\ny\ny\n",
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    _assert_refused(result.returncode, result.stdout, result.stderr, marker, out, "config.json")


@pytest.mark.parametrize("model_type,where", KINDS)
def test_the_library_refuses_and_the_code_never_runs(model_type, where, tiny_folders, tmp_path):
    folder, marker = _evil_folder(tmp_path, tiny_folders["bert"], model_type, where)
    for init in ("pretrained", "random"):
        with pytest.raises(ProbeError, match="never runs a checkpoint's code"):
            probe.load(folder, init=init)
    assert not marker.exists()


def test_a_stock_folder_without_auto_map_still_loads(tiny_folders):
    assert probe.load(tiny_folders["bert"]).family == "bert"
