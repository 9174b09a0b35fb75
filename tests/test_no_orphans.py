"""A refused run leaves nothing behind: where something that is not a file stands in the
place of the folder's index (which every command rewrites last), the command is refused
before it computes or writes anything, for every command that writes into ``--out``."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from probe.cli.app import app

COMMANDS = {
    "collapse": ["collapse", "gpt2-tiny", "--init", "random", "--sequences", "2", "--tokens",
                 "8", "--variants", "SAN"],
    "attention": ["attention", "gpt2-tiny", "--init", "random", "--sequences", "2",
                  "--tokens", "8"],
    "paths": ["paths", "--count", "--layers", "2", "--heads", "2"],
    "sweep": ["sweep", "gpt2-tiny", "--init", "random", "--set", "n_layer=1,2", "--variants",
              "SAN", "--sequences", "2", "--tokens", "8"],
}  # fmt: skip


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_folder_in_the_index_s_place_refuses_the_run_before_it_writes(name, tmp_path):
    out = tmp_path / "out"
    (out / "index.html").mkdir(parents=True)
    done = CliRunner().invoke(app, [*COMMANDS[name], "--out", str(out)])
    assert done.exit_code == 2, done.output
    (line,) = done.stderr.splitlines()
    assert line.startswith("probe: error: --out") and "index.html there is not a file" in line
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]  # nothing else written
