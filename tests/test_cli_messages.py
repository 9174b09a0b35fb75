"""The command line's lines in its own words, and a standard output it cannot write.

* An error line names only options of the command that was run.  The library names its
  parameters in backticks (`seed`, `steps`, `config`); each becomes the option of the
  running command that sets it (a sweep's ``--seeds``, ``--steps``, ``--set``), or the
  plain word where none does (a config field: ``n_layer``).
* An overflow's advice names a dtype wider than the one that overflowed.
* Standard output that cannot be written (a full device, a closed descriptor, a reader
  that went away) drops the lines, not the work: the results are written, no traceback,
  and the exit code is the closed pipe's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from cli.app import app
from cli.console import in_cli_words
from tests.reference.tiny import tiny_model
from tests.test_fuzz_cli import COMMANDS, FLAG, PROGRESS

#: The long options of each command, by its words (``("sweep",)``).
OPTIONS = {
    words: {flag for param in command.params for flag in (*param.opts, *param.secondary_opts)}
    for words, command in COMMANDS
}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> str:
    """A tiny random GPT-2 (3 layers, 64 positions), saved without a tokenizer."""
    folder = tmp_path_factory.mktemp("messages") / "tiny-gpt2"
    tiny_model("gpt2", seed=1, dtype=torch.float32).save_pretrained(folder)
    return str(folder)


def refused(tmp_path: Path, monkeypatch, *args) -> str:
    """``probe ARGS`` in ``tmp_path``: exit 2 and its one error line, which is returned."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = CliRunner().invoke(app, [str(a) for a in args])
    shown = f"probe {' '.join(map(str, args))}\n{result.output}"
    assert result.exit_code == 2, shown
    lines = [line for line in result.stderr.splitlines() if not PROGRESS.match(line)]
    assert len(lines) == 1 and lines[0].startswith("probe: error: "), shown
    return lines[0]


def assert_own_options(line: str, words: tuple[str, ...]) -> None:
    """Every ``--option`` in ``line`` is one the command ``words`` has."""
    named = FLAG.findall(line)
    foreign = [flag for flag in named if flag not in OPTIONS[words] | {"--help"}]
    assert not foreign, f"{line!r} names {foreign}, not options of probe {' '.join(words)}"
    assert "`" not in line.removeprefix("probe: error: "), line  # no parameter left raw


# --- error lines name the running command's options ---------------------------------------

#: (the library parameters the line comes from, probe's arguments after MODEL, what it says)
SWEEP_LINES = [
    ("seed", ["--init", "random", "--seeds", "0,0"], "--seeds gives 0 more than once"),
    ("step", ["MODEL", "--steps", "0,0"], "--steps gives 0 more than once"),
    ("n_layer", ["--init", "random", "--set", "n_layer=1,1"], "n_layer gives 1 more than once"),
    ("config, init", ["--seeds", "0,1", "--set", "n_layer=1,2"], "--set changes the architecture"),
    ("revision", ["--init", "random", "--revisions", "main,step1"], "drop --revisions"),
    ("tokens", ["--init", "random", "--tokens", "2,100000"], "use --tokens 64 or fewer"),
    (
        "config, seeds",
        ["--init", "random", "--seeds", "0"],
        "two values or more to --set, --branch",
    ),
]


@pytest.mark.parametrize(
    ("parameters", "rest", "says"), SWEEP_LINES, ids=[case[0] for case in SWEEP_LINES]
)
def test_a_sweep_error_names_the_sweeps_options(
    parameters, rest, says, gpt2, tmp_path, monkeypatch
):
    """A sweep takes seeds, steps and revisions as lists (``--seeds``, ``--steps``,
    ``--revisions``) and config fields through ``--set``: the library's `seed`, `step`,
    `revision` and `config` are said so, and a config field is its plain name."""
    rest = [gpt2 if word == "MODEL" else word for word in rest]
    line = refused(tmp_path, monkeypatch, "sweep", gpt2, *rest)
    assert says in line, line
    assert_own_options(line, ("sweep",))
    for absent in ("--seed ", "--step ", "--revision ", "--n-layer", "--config"):
        assert absent not in line + " ", line


#: (a command's words, its arguments after MODEL, what its line says)
OTHER_LINES = [
    (("collapse",), ["--set", "n_layer=1"], "--set changes the architecture"),
    (("collapse",), ["--revision", "main"], "drop --revision"),
    (("attention",), ["--set", "n_layer=1", "--init", "pretrained"], "use --init random"),
    (("check",), ["--init", "pretrained", "--set", "n_layer=1"], "use --init random"),
]


@pytest.mark.parametrize(
    ("words", "rest", "says"), OTHER_LINES, ids=[f"{w[0]} {r[0]}" for w, r, _ in OTHER_LINES]
)
def test_other_commands_keep_their_own_options(words, rest, says, gpt2, tmp_path, monkeypatch):
    """A command whose options are the parameters' names (``--seed``, ``--revision``) says
    them so."""
    line = refused(tmp_path, monkeypatch, *words, gpt2, *rest)
    assert says in line, line
    assert_own_options(line, words)


def _command(*words: str):
    command = get_command(app)
    for word in words:
        command = command.commands[word]
    return command


def test_parameters_become_the_commands_options_or_words():
    sweep = _command("sweep")
    said = in_cli_words(
        "`seed`, `step`, `revision`, `config`, `n_layer`, `batch_size`, `source`", sweep
    )
    assert said == "--seeds, --steps, --revisions, --set, n_layer, --batch-size, MODEL"
    collapse = _command("collapse")
    said = in_cli_words("`seed`, `revision`, `config`, `n_layer`", collapse)
    assert said == "--seed, --revision, --set, n_layer"
    # A command without --set or --seed says the parameters as words.
    plain = [c for w, c in COMMANDS if not {"--set", "--seed"} & OPTIONS[w]][0]
    assert in_cli_words("`config` and `seed`", plain) == "config and seed"


def test_outside_a_command_every_parameter_is_its_option():
    """Library use (no command runs): each `parameter` is ``--parameter``."""
    assert (
        in_cli_words("`seed` and `n_layer` through `config`")
        == "--seed and --n-layer through --set"
    )


# --- an overflow's advice --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_an_overflow_advises_a_wider_dtype(dtype, gpt2, tmp_path, monkeypatch):
    """``--branch-scale 1e30`` overflows; the line advises only dtypes of a wider range than
    the run's (float32 overflowed: float64, never float32 again)."""
    line = refused(tmp_path, monkeypatch, "collapse", gpt2, "--init", "random", "--dtype",
                   dtype, "--branch-scale", "1e30", "--tokens", 4, "--sequences", 2, "--out", "o")  # fmt: skip
    assert f"overflowed in {dtype}" in line, line
    advice = re.search(r"use --dtype ([a-z0-9]+(?: or [a-z0-9]+)*)", line)
    assert advice is not None, line
    widest = torch.finfo(getattr(torch, dtype)).max
    for wider in advice[1].split(" or "):
        assert torch.finfo(getattr(torch, wider)).max > 10 * widest, line
    assert_own_options(line, ("collapse",))
    assert not (tmp_path / "o").exists()


# --- a standard output that cannot be written ------------------------------------------------

PROBE = Path(sys.executable).with_name("probe")
#: A command that prints lines and writes a result and its report, in a second.
COUNT = "paths --count --layers 6 --heads 4 --out out"
#: Standard output: a reader that went away, a full device, a closed descriptor.
REDIRECTS = {"closed pipe": "| true", "full device": ">/dev/full", "closed descriptor": "1>&-"}
DROPPED = "the rest of its lines were dropped, the command went on"


def _unwritable(args: str, redirect: str, cwd: Path) -> subprocess.CompletedProcess:
    if not PROBE.exists():
        pytest.skip("no installed probe executable next to this Python")
    script = f"{PROBE} {args} {redirect}; exit ${{PIPESTATUS[0]}}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    return done


@pytest.mark.parametrize("redirect", REDIRECTS.values(), ids=list(REDIRECTS))
def test_an_unwritable_stdout_drops_lines_not_work(redirect, tmp_path):
    done = _unwritable(COUNT, redirect, tmp_path)
    assert done.returncode == 0, done.stderr  # the closed pipe's (tests/test_seams.py)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("probe: warning: standard output ") and lines[0].endswith(DROPPED)
    (result,) = (tmp_path / "out").glob("*.nc")
    assert result.with_suffix(".html").is_file() and (tmp_path / "out" / "index.html").is_file()


@pytest.mark.parametrize("redirect", REDIRECTS.values(), ids=list(REDIRECTS))
def test_help_to_an_unwritable_stdout_is_no_traceback(redirect, tmp_path):
    """Help is printed by click itself, not through probe's console."""
    done = _unwritable("sweep --help", redirect, tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(line.endswith(DROPPED) for line in done.stderr.splitlines()), done.stderr


#: Standard error: a full device, a closed descriptor, a reader that went away.
ERR_REDIRECTS = {"full device": "2>/dev/full", "closed descriptor": "2>&-",
                 "closed pipe": "2> >(true)"}  # fmt: skip


@pytest.mark.parametrize("redirect", ERR_REDIRECTS.values(), ids=list(ERR_REDIRECTS))
def test_an_unwritable_stderr_drops_lines_not_work(redirect, tmp_path):
    """Standard error is treated as standard output is: its lines (progress, notes,
    warnings) are dropped, the work is done and the exit status is the run's."""
    run = "collapse gpt2-tiny --init random --sequences 2 --tokens 8 --variants SAN --out out"
    done = _unwritable(run, redirect, tmp_path)
    assert done.returncode == 0
    (result,) = (tmp_path / "out").glob("*.nc")
    assert result.with_suffix(".html").is_file() and (tmp_path / "out" / "index.html").is_file()
    refused = _unwritable("collapse gpt2-tiny --tokens 0 --out out2", redirect, tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "out2").exists()
