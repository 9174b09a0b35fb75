"""The command tree is declared in one place: ``cli.app.COMMANDS``, in ``probe --help``'s order."""

from __future__ import annotations

from typer.main import get_command
from typer.testing import CliRunner

from cli.app import COMMANDS, app


def test_the_help_lists_the_commands_in_the_order_of_the_list():
    # Typer puts groups after plain commands whatever the order of registration: a command
    # listed after a group would show elsewhere than the list says.
    assert list(get_command(app).commands) == [name for name, _ in COMMANDS]
    listed = CliRunner().invoke(app, ["--help"]).stdout.split("Commands:\n", 1)[1]
    shown = [
        line.split()[0] for line in listed.splitlines() if line.startswith("  ") and line[2] != " "
    ]
    assert shown == [name for name, _ in COMMANDS]
