"""Numbers bounded when they are read, and user text printed as it was typed.

Every number a command or the library reads is refused in one line before anything runs
when it is outside what any run can use: a window wider than any context, a number of
thousands of digits (Python's own limit message never reaches the user), digits that are
not ASCII ("١٢" is not 12 here).  An error line quotes what the user typed verbatim: no
terminal markup ("[bold]"), no emoji codes (":-1:").
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import probe
from probe.analyses import collapse
from probe.cli.app import app
from probe.cli.options import memory
from probe.errors import ProbeError
from probe.surgery.masks import Mask, parse_mask

HUGE = "9" * 5000
RUN = ["--init", "random", "--sequences", "1", "--tokens", "8", "--variants", "SAN"]


def _refused(args, tmp_path, words: str) -> str:
    """``probe ARGS`` exits 2 with one error line holding ``words``, and writes nothing."""
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [*args, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("probe: error: ") and words in line, line
    assert "4300" not in line and "sys.set_int_max_str_digits" not in line
    assert len(line) < 400  # a 5000-digit value is not echoed whole
    assert not out.exists()
    return line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--mask", "window:99999999999999999999"], "at most 2147483647"),
        (["--mask", "causal-window:2147483648"], "at most 2147483647"),
        (["--mask", f"window:{HUGE}"], "at most 2147483647"),
        (["--mask", "window:١٢"], "whole number"),
        (["--mask", "window:１２"], "whole number"),  # full-width digits
        (["--set", f"n_layer={HUGE}"], "5000 digits"),
        (["--tokens", HUGE], "5000 digits"),
        (["--seed", HUGE], "5000 digits"),
        (["--sequences", "١٢"], "whole number"),
    ],
    ids=[
        "window",
        "causal-window",
        "window-5000",
        "arabic-indic",
        "full-width",
        "set-5000",
        "tokens-5000",
        "seed-5000",
        "sequences-arabic-indic",
    ],  # fmt: skip
)
def test_a_number_outside_any_run_is_refused_when_read(args, words, tmp_path):
    _refused(["collapse", "gpt2", *RUN, *args], tmp_path, words)


def test_a_sweep_reads_its_numbers_as_collapse_does(tmp_path):
    _refused(["sweep", "gpt2", "--init", "random", "--set", f"n_layer=1,{HUGE}"], tmp_path,
             "5000 digits")  # fmt: skip
    _refused(["sweep", "gpt2", "--init", "random", "--mask", f"bidirectional,window:{HUGE}"],
             tmp_path, "at most 2147483647")  # fmt: skip


@pytest.mark.parametrize(
    "make",
    [
        lambda: Mask("window", 10**30),
        lambda: Mask("causal-window", 2**31),
        lambda: parse_mask("window:" + HUGE),
        lambda: parse_mask("window:١٢"),
        lambda: collapse.prepare("gpt2", init="random", mask="window:" + HUGE),
        lambda: probe.Inputs(tokens=int("9" * 30)),
    ],
    ids=["Mask", "Mask-causal", "parse-5000", "parse-arabic-indic", "collapse", "Inputs"],
)
def test_the_library_bounds_the_same_numbers_before_any_load(make):
    with pytest.raises(ProbeError) as caught:
        make()
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400


def test_the_widest_window_a_context_can_use_still_runs():
    mask = Mask("window", 2**31 - 1)
    assert bool(mask.allowed(5).all())  # every key within the window


def test_a_max_memory_device_is_an_ascii_index():
    assert memory("0=1GiB,cpu=2GiB") == {0: "1GiB", "cpu": "2GiB"}
    assert memory("٠=1GiB") == {"٠": "1GiB"}  # not device 0: accelerate names it unknown


@pytest.mark.parametrize(
    ("args", "typed"),
    [
        (["collapse", ":-1: [bold]x[/bold]", "--init", "random"], ":-1: [bold]x[/bold]"),
        (["collapse", "gpt2", "--variants", ":thumbs_up:[red]"], ":thumbs_up:[red]"),
        (["collapse", "gpt2", "--mask", "[b]:smile:"], "[b]:smile:"),
    ],
    ids=["model", "variants", "mask"],
)
def test_user_text_in_an_error_line_is_printed_verbatim(args, typed, tmp_path):
    line = _refused(args, tmp_path, typed)
    assert "👍" not in line and "👎" not in line and "😄" not in line
