"""The API reference: what docs/reference/*.md documents, read as mkdocstrings reads it.

griffe (the library under mkdocstrings-python) loads the package `probe` from the source
folders with the extension mkdocs.yml names (docs/griffe_package_dir.py), so the objects
have the paths users import (`probe.analyses.collapse.run`).  Every object the reference
renders must then have a numpy-style docstring that parses without a warning into the
sections the site shows: Parameters for every parameter, Returns where a value comes back,
Raises where the function itself raises ProbeError; and no Sphinx role (`:func:` ...),
which mkdocstrings would print as it is instead of a link.  Building the site
(`mkdocs build --strict`, in `make test`) checks that every link resolves; this test is the
cheap part that needs no build.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = sorted((ROOT / "docs" / "reference").glob("*.md"))
EXTENSION = ROOT / "docs" / "griffe_package_dir.py"
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|mod|attr|exc|obj|const):`")
#: A numpy entry naming several parameters ("x, mask"): griffe gives every one of them the
#: first one's type and default, so the table would state wrong types.
GROUPED = re.compile(r"^\*{0,2}\w+(?:, \*{0,2}\w+)+$", re.M)


@pytest.fixture(scope="module")
def package():
    return griffe.load(
        "probe",
        search_paths=[ROOT],
        extensions=griffe.load_extensions(f"{EXTENSION}:PackageDir"),
        docstring_parser="numpy",
    )


def identifiers() -> list[tuple[str, bool | list[str]]]:
    """(identifier, members shown) of every `::: identifier` block of the reference: True
    (all public members), False (none) or the list its `members:` option names."""
    found = []
    for page in REFERENCE:
        for match in re.finditer(r"^::: (\S+)\n((?:    .*\n)*)", page.read_text(), re.M):
            listed = re.search(r"members: (false|\[(.*)\])", match.group(2))
            members: bool | list[str] = True
            if listed:
                members = [n.strip() for n in listed[2].split(",")] if listed[2] else False
            found.append((match.group(1), members))
    return found


def rendered(package) -> list:
    """The objects the reference renders: each `:::` object and, unless its members are
    hidden, its public members that are not imported from elsewhere (mkdocs.yml's filters)."""
    found = []
    for identifier, members in identifiers():
        obj = package.get_member(identifier.removeprefix("probe."))
        found.append(obj)
        if members and (obj.is_module or obj.is_class):
            found += [
                member
                for name, member in obj.members.items()
                if not name.startswith("_")
                and not member.is_alias
                and not member.is_module
                and (members is True or name in members)
            ]
    return found


def parsed(obj) -> tuple[dict[str, list], list[str]]:
    """The docstring's sections by kind, and the warnings griffe's numpy parser gave."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("griffe")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        sections = obj.docstring.parse("numpy")
    finally:
        logger.removeHandler(handler)
    by_kind: dict[str, list] = {}
    for section in sections:
        by_kind.setdefault(section.kind.value, []).append(section)
    return by_kind, records


def public_parameters(obj) -> set[str]:
    return {
        p.name
        for p in obj.parameters
        if p.name not in ("self", "cls") and not p.name.startswith("_")
    }


def documented(sections: dict[str, list]) -> set[str]:
    return {p.name.lstrip("*") for s in sections.get("parameters", []) for p in s.value}


def raises_probe_error(obj) -> bool:
    """Whether the function (or a dataclass's __post_init__) raises ProbeError itself."""
    code = obj.source if obj.is_function else ""
    if obj.is_class:
        for name in ("__init__", "__post_init__"):
            if name in obj.members and not obj.members[name].is_alias:
                code += obj.members[name].source
    return "raise ProbeError(" in code


def test_the_reference_names_what_users_import(package) -> None:
    names = [identifier for identifier, _ in identifiers()]
    assert len(names) >= 40
    assert all(name.startswith("probe.") for name in names), names
    assert "probe.analyses.collapse.run" in names
    run = package.get_member("analyses.collapse.run")
    assert run.path == "probe.analyses.collapse.run"
    assert run.filepath == ROOT / "analyses" / "collapse.py"


def test_reference_docstrings_are_numpy_style(package) -> None:
    problems = []
    objects = rendered(package)
    assert len(objects) >= 80
    for obj in objects:
        obj = obj.final_target if obj.is_alias else obj
        where = obj.path
        if obj.docstring is None:
            # An object without a docstring is left out of the site, but a public
            # function or method of a documented module or class should have one.
            if obj.is_function:
                problems.append(f"{where}: no docstring")
            continue
        if SPHINX_ROLE.search(obj.docstring.value):
            problems.append(f"{where}: Sphinx role {SPHINX_ROLE.search(obj.docstring.value)[0]}")
        sections, warnings = parsed(obj)
        problems += [f"{where}: {warning}" for warning in warnings]
        if GROUPED.search(obj.docstring.value):
            problems.append(
                f"{where}: parameters grouped: {GROUPED.search(obj.docstring.value)[0]}"
            )
        if obj.is_function or obj.is_class:
            missing = public_parameters(obj) - documented(sections)
            if missing:
                problems.append(f"{where}: parameters not documented: {sorted(missing)}")
        if obj.is_function and "returns" not in sections and str(obj.returns) != "None":
            problems.append(f"{where}: no Returns section")
        if (obj.is_function or obj.is_class) and raises_probe_error(obj):
            raised = {str(e.annotation) for s in sections.get("raises", []) for e in s.value}
            if "ProbeError" not in raised:
                problems.append(f"{where}: raises ProbeError but no Raises section says so")
    assert not problems, "\n".join(problems)


def test_mkdocs_loads_the_extension_and_parses_numpy() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "docstring_style: numpy" in config
    assert f"{EXTENSION.relative_to(ROOT)}:PackageDir" in config
