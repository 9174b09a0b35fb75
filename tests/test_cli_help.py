"""``--help`` at 80 columns, and tables in a pipe.

Every command is found from the typer app itself (``typer.main.get_command``), so a
command or option added later is held to the same rules: its help fits 80 columns, its
options stand in the panels of ``cli.help.PANELS``, no Python type, click type name or
integer limit shows, each entry gives its default at most once, and an option has one
metavar across the commands that take it.  A table printed to a pipe keeps its numbers
whole (``cli.console``)."""

from __future__ import annotations

import math
import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli import domains
from cli.app import app
from cli.help import OTHER, PANELS

runner = CliRunner()
#: A terminal 80 columns wide, as click and rich read it.
NARROW = {"COLUMNS": "80", "TERMINAL_WIDTH": "80", "LINES": "40"}
#: What must not show in any help: Python types, click's type names as metavars, and the
#: integer types' limits (a range reads ``≥ 1``).
LEAKS = ["list[str]", "list[Path]", "<str>", "<int>", "<float>", "<Path>", "2147483647",
         "9223372036854775807", "2^63", "2**63"]  # fmt: skip
CLICK_METAVARS = re.compile(r"\b(INTEGER|TEXT|FLOAT|PATH|BOOLEAN|FILENAME|DIRECTORY)\b")


def _walk(command, words=()):
    yield words, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _walk(sub, (*words, name))


COMMANDS = list(_walk(get_command(app)))
LEAVES = [(words, command) for words, command in COMMANDS if not getattr(command, "commands", None)]


def _help(words) -> str:
    result = runner.invoke(app, [*words, "--help"], env=NARROW)
    assert result.exit_code == 0, (words, result.output)
    return result.stdout


def _entries(text: str) -> list[str]:
    """The entries of a help page: a line indented by two spaces and its continuation."""
    entries: list[str] = []
    for line in text.splitlines():
        if re.match(r"  \S", line):
            entries.append(line.strip())
        elif line.startswith("   ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append("")  # a title or blank line ends the entry
    return [entry for entry in entries if entry]


def _options(command):
    return [p for p in command.params if p.param_type_name == "option" and not p.hidden]


@pytest.mark.parametrize("words", [words for words, _ in COMMANDS], ids=" ".join)
def test_help_fits_80_columns_and_leaks_no_types_or_limits(words):
    text = _help(words)
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide
    for leak in LEAKS:
        assert leak not in text, (words, leak)
    assert not CLICK_METAVARS.search(text), (words, CLICK_METAVARS.search(text))


@pytest.mark.parametrize("words", [words for words, _ in LEAVES], ids=" ".join)
def test_each_entry_gives_its_default_at_most_once(words):
    for entry in _entries(_help(words)):
        assert len(re.findall(r"\bdefault\b", entry, flags=re.I)) <= 1, (words, entry)


@pytest.mark.parametrize("words,command", LEAVES, ids=[" ".join(w) for w, _ in LEAVES])
def test_every_option_stands_in_a_panel(words, command):
    text = _help(words)
    used = set()
    for param in _options(command):
        panel = getattr(param, "rich_help_panel", None)
        if param.name == "help":
            assert panel is None
            continue
        assert panel in PANELS, (words, param.opts, panel)
        used.add(panel)
    for panel in [*used, OTHER]:
        assert re.search(rf"^{panel}:$", text, flags=re.M), (words, panel)
    # The panels come in PANELS' order, the options without one last.
    titles = [t for t in re.findall(r"^(\w+):$", text, flags=re.M) if t in (*PANELS, OTHER)]
    assert titles == [p for p in (*PANELS, OTHER) if p in titles]


def test_the_analysis_commands_have_the_same_panels():
    for words in [("collapse",), ("attention",), ("sweep",)]:
        text = _help(words)
        for panel in ("Model", "Inputs", "Analysis", "Running", "Output"):
            assert f"\n{panel}:\n" in text, (words, panel)
    assert "\nGrid:\n" in _help(("sweep",))


def test_an_option_has_one_metavar_in_every_command():
    """The same option (by its long name) reads the same in every command that takes it;
    a command that takes a comma list of its values writes the value's metavar and
    ``,...`` (``--tokens N`` and a sweep's ``--tokens N,...``)."""
    seen: dict[str, dict[str, list]] = {}
    for words, command in LEAVES:
        for param in _options(command):
            if param.is_flag or param.name == "help":
                continue
            assert param.metavar, (words, param.opts)
            assert not CLICK_METAVARS.fullmatch(param.metavar), (words, param.opts)
            name = max(param.opts, key=len)
            seen.setdefault(name, {}).setdefault(param.metavar.removesuffix(",..."), []).append(
                " ".join(words)
            )
    differ = {name: found for name, found in seen.items() if len(found) > 1}
    assert not differ, differ
    assert len([name for name, found in seen.items() if sum(map(len, found.values())) > 1]) > 10


def test_a_shared_range_reads_the_same_everywhere():
    texts = {}
    for _words, command in LEAVES:
        for param in _options(command):
            d = domains.domain_of(param)
            if isinstance(d, domains.Seed):
                texts.setdefault("seed", set()).add(d.describe())
            elif isinstance(d, domains.Count) and param.name in ("tokens", "sequences"):
                texts.setdefault(param.name, set()).add(d.describe())
    assert texts["seed"] == {"≥ 0"}
    assert texts["tokens"] == {"≥ 2"}
    assert texts["sequences"] == {"≥ 1", "≥ 1, or all"}


def test_dtype_says_its_default_once_and_only_of_its_command():
    collapse = " ".join(_help(("collapse",)).split())
    entry = collapse[collapse.index("--dtype DTYPE") :].split(" --")[0]
    assert entry.count("default") == 1 and "default: float32" in entry
    assert "check" not in entry and "paths" not in entry and "decompose" not in entry
    check = " ".join(_help(("check",)).split())
    assert "default: float64" in check[check.index("--dtype DTYPE") :].split(" --")[0]
    paths = " ".join(_help(("paths",)).split())
    assert "default: float32 with --sample, float64 with --decompose" in paths


def test_the_toy_commands_show_their_tasks_defaults():
    """The words ``--help`` gives for a toy task's default are the task's settings."""
    from probe.analyses.toy_settings import TASKS

    spelled = {"eval_": "eval", "sequences": "train"}
    checked = 0
    for words, command in LEAVES:
        if words[0] != "toy":
            continue
        task = TASKS[words[1]]
        for param in _options(command):
            key = spelled.get(param.name, param.name)
            if not isinstance(param.show_default, str) or key not in task:
                continue
            shown, value = param.show_default.split()[0], task[key]
            if isinstance(value, bool):
                assert shown == ("positions" if value else "no-positions"), (words, key)
            elif isinstance(value, tuple):
                assert shown == ",".join(map(str, value)), (words, key)
            elif isinstance(value, str):
                assert shown == value, (words, key)
            else:
                assert math.isclose(float(shown), value), (words, key, shown, value)
            checked += 1
    assert checked > 40


def test_the_command_list_gives_each_first_sentence_whole():
    text = " ".join(_help(()).split())
    assert "Check that probe's entry fits MODEL: its modules, the self-test identities" in text
    assert "...]" not in text.replace("[ARGS]...", "")


def test_a_piped_table_keeps_its_numbers_whole(tmp_path):
    """CliRunner's output is a pipe: at 60 columns the counts of 41^40 paths, up to 64
    digits, each stand whole in their cell; no cell is cut with an ellipsis."""
    result = runner.invoke(
        app,
        ["paths", "--count", "--layers", "40", "--heads", "40", "--out", str(tmp_path)],
        env={"COLUMNS": "60"},
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    for k in (0, 10, 25, 40):
        count = math.comb(40, k) * 40**k
        assert re.search(rf"│\s+{k} │\s+{count} │", result.stdout), (k, count)


def test_a_table_of_text_folds_and_never_ends_in_an_ellipsis():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    table = [line for line in result.stdout.splitlines() if line[:1] in "┏┃│└"]
    assert table and max(len(line) for line in table) <= 80


def test_a_narrow_table_of_numbers_grows_rather_than_cut_them(monkeypatch, capsys):
    from rich.table import Table

    from cli.console import out

    monkeypatch.setenv("COLUMNS", "30")
    table = Table(title="t")
    for name in ("layer", "SAN", "SAN+MLP", "SAN+skip", "transformer"):
        table.add_column(name, justify="right")
    table.add_row("12", "0.00712345", "< 1.2e-6 (float32)", "-4.5e-07", "123456789012")
    out.print(table)
    shown = capsys.readouterr().out
    assert "…" not in shown
    for number in ("0.00712345", "1.2e-6", "-4.5e-07", "123456789012", "transformer"):
        assert number in shown, (number, shown)
