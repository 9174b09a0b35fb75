"""Every analysis is declared once (probe.registry), and what it declares exists: its
measurement, its command in probe's command tree, its report and its index line; the
result files, the reports and the index read the declaration."""

from __future__ import annotations

import pytest
import typer

from probe import registry
from probe.cli.app import COMMANDS
from probe.files.results import TOY_SCHEMAS
from probe.reports import index_headline


def _tree() -> set:
    """What ``cli.app.COMMANDS`` registers: each command's function, each group's Typer,
    and the functions of the group's commands."""
    found = set()
    for _, registered in COMMANDS:
        found.add(registered)
        if isinstance(registered, typer.Typer):
            found |= {c.callback for c in registered.registered_commands}
    return found


TREE = _tree()


@pytest.mark.parametrize("analysis", registry.ANALYSES, ids=lambda a: a.name)
def test_what_an_analysis_declares_exists(analysis):
    for path in (analysis.library, analysis.report, analysis.headline):
        assert callable(registry.resolve(path)), path
    assert registry.resolve(analysis.command) in TREE, f"{analysis.command} is no command"
    assert analysis.variables and all(isinstance(d, tuple) for d in analysis.variables.values())
    assert index_headline.kind_words(analysis.name) == analysis.section


def test_names_are_unique_and_the_index_keeps_the_declared_order():
    names = [a.name for a in registry.ANALYSES]
    assert len(set(names)) == len(names)
    assert index_headline.sections(set(names)) == names
    assert set(TOY_SCHEMAS) == {"circle", "paths"}  # a toy result's variables, by task


def test_probe_attention_and_probe_paths_are_both_analyses():
    import probe
    from probe.analyses import attention, paths

    assert probe.attention is attention.run and probe.paths is paths
    assert {"attention", "paths"} <= set(dir(probe))
