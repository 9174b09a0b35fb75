"""The shape of the house: file sizes, imports, and who speaks the CLI's language.

Read from the source with ``ast``, nothing imported: every source file is at most
``MAX_LINES`` long; the modules' imports (at any depth, function-level included) form no
cycle; no module imports another module's private name; no analysis imports another
analysis; and the library (``probe/``, ``analyses/``) names no command-line flag in a
string: a result's request is data, rendered as a command line by ``probe.reports``.
Each exception that is still there is listed below by name, so the lists can only shrink.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Source folder -> the package it installs as (pyproject's package-dir).
PACKAGES = {
    "probe": "probe",
    "analyses": "probe.analyses",
    "cli": "probe.cli",
    "reports": "probe.reports",
}
MAX_LINES = 500

#: Files allowed over MAX_LINES: none.
TOO_LONG: set[str] = set()
#: Strings of the library that are command lines by nature, as (module, function) pairs:
#: none; a result keeps its request as data and ``probe.reports.reproduce`` renders it.
COMMAND_LINES: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import in ``module``, at any depth."""
    tree = ast.parse(MODULES[module].read_text())
    base = module if _is_package(module) else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - node.level + 1]
                target = ".".join(parts + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [alias.name for alias in node.names]
            # "from . import x" imports the submodule x where there is one.
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
            found += [(sub, []) for sub in subs]
            found.append((target, [n for n in names if f"{target}.{n}" not in MODULES]))
    return [(target, names) for target, names in found if target in MODULES]


def test_no_source_file_is_too_long():
    long = {
        str(path.relative_to(ROOT))
        for path in MODULES.values()
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert long <= TOO_LONG, f"over {MAX_LINES} lines: {sorted(long - TOO_LONG)}"
    assert TOO_LONG <= long, f"split already; drop from TOO_LONG: {sorted(TOO_LONG - long)}"


#: The most lines a function's body (after its docstring) may hold: one step, readable on
#: one screen.  A signature is not counted: a command's is the declaration of its options.
MAX_BODY = 60
#: Bodies over MAX_BODY that are one step written out long: (module, function) -> what.
ONE_STEP: dict[tuple[str, str], str] = {
    ("probe.analyses.collapse", "_dataset"): "the result's variables and attributes",
    ("probe.analyses.path_decompose", "_dataset"): "the result's variables and attributes",
    ("probe.analyses.attention", "_dataset"): "the result's variables and attributes",
    ("probe.figures.plot_paths", "sample_ratios"): "one figure, panel by panel",
    ("probe.reports.paths_report", "_decompose"): "one section of the report",
}


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_every_function_does_one_thing():
    long = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if _body_lines(node) > MAX_BODY:
                    long[(module, node.name)] = _body_lines(node)
    over = {k: v for k, v in long.items() if k not in ONE_STEP}
    assert not over, f"bodies over {MAX_BODY} lines: split them into steps: {over}"
    assert set(ONE_STEP) <= set(long), f"short now; drop: {sorted(set(ONE_STEP) - set(long))}"


def test_no_import_cycle():
    graph = {m: {t for t, _ in _imports(m) if t != m} for m in MODULES}
    # A package's __init__ importing its own submodules is how a package is built, not a
    # cycle between concepts.
    for m in graph:
        if _is_package(m):
            graph[m] = {t for t in graph[m] if not t.startswith(m + ".")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt) :] + [nxt] if nxt in trail else [node, nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_module_imports_a_private_name_of_another():
    private = [
        f"{module} takes {name} from {target}"
        for module in MODULES
        for target, names in _imports(module)
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert not private, "\n".join(private)


#: The analyses: each is one module, or a family of modules (path_*, toy_*).
ANALYSES = {
    "probe.analyses.collapse": "collapse",
    "probe.analyses.attention": "attention",
    "probe.analyses.toy": "toy",
    **{m: "toy" for m in MODULES if m.startswith("probe.analyses.toy_")},
    **{m: "paths" for m in MODULES if m.startswith("probe.analyses.path")},
}


#: Drivers over the analyses: the sweep runs collapse (and attention) at every point of its
#: grid, so it may import their public functions; no analysis may import a driver.
DRIVERS = {m for m in MODULES if m.startswith("probe.analyses.sweep")}


def test_no_analysis_imports_another():
    assert not DRIVERS & set(ANALYSES)
    crossing = [
        f"{module} ({ANALYSES[module]}) imports {target} ({ANALYSES[target]})"
        for module in ANALYSES
        for target, _ in _imports(module)
        if target in ANALYSES and ANALYSES[target] != ANALYSES[module]
    ]
    assert not crossing, "\n".join(crossing)


def test_no_analysis_imports_a_driver():
    assert DRIVERS, "the sweep's modules moved: update DRIVERS"
    reaching = [
        f"{module} imports the driver {target}"
        for module in MODULES
        if module.startswith("probe.analyses.") and module not in DRIVERS
        for target, _ in _imports(module)
        if target in DRIVERS
    ]
    assert not reaching, "\n".join(reaching)


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _cli_flags() -> set[str]:
    """The flags probe's command line declares (another program's, e.g. torchrun's
    ``--nproc-per-node``, may be named where the library tells how to start it)."""
    text = "\n".join(p.read_text() for p in (ROOT / "cli").glob("*.py"))
    return set(re.findall(r"[(\s]\"(--[a-z][a-z0-9-]*)\"", text))


CLI_FLAGS = _cli_flags()


def _flag_strings(module: str) -> list[str]:
    """Strings of ``module`` (docstrings too) that name a flag, outside COMMAND_LINES."""
    tree = ast.parse(MODULES[module].read_text())
    exempt: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and (module, node.name) in COMMAND_LINES:
            exempt |= {id(n) for n in ast.walk(node)}
    return [
        f"{MODULES[module].relative_to(ROOT)}:{node.lineno}: {FLAG.findall(node.value)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and any(flag in CLI_FLAGS for flag in FLAG.findall(node.value))
        and id(node) not in exempt
    ]


def test_the_cli_flags_are_found():
    assert {"--tokens", "--device", "--batch-size", "--no-skip", "--decompose"} <= CLI_FLAGS


def test_the_library_names_no_cli_flag():
    library = [m for m in MODULES if not m.startswith(("probe.cli", "probe.reports"))]
    named = [line for m in library for line in _flag_strings(m)]
    assert not named, f"{len(named)} strings name a flag:\n" + "\n".join(named)
