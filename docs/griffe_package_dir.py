"""A griffe extension that loads `probe` the way setuptools installs it.

pyproject.toml's `[tool.setuptools.package-dir]` installs the top-level folders
`analyses/`, `cli/` and `reports/` as `probe.analyses`, `probe.cli` and `probe.reports`.
Griffe reads source folders, where `probe/` has no `analyses/` inside, so without this
extension the API reference could only name `analyses.collapse.run`.  Once griffe has
loaded the package `probe`, the extension loads each such folder as the subpackage it is
installed as, so every object has the path users import: `probe.analyses.collapse.run`.

mkdocs.yml names this file under the mkdocstrings handler's `extensions`;
tests/test_api_reference.py loads the package with it, as the docs build does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomli, which pytest requires there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """The direct subpackages of `probe` whose source folder is not under `probe/`.

    Parameters
    ----------
    root
        The repository root, which holds pyproject.toml.

    Returns
    -------
    dict[str, Path]
        Dotted package name (`probe.analyses`) -> its source folder (`root/analyses`),
        from pyproject.toml's `[tool.setuptools.package-dir]`.
    """
    with open(root / "pyproject.toml", "rb") as file:
        mapping = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {
        name: root / folder
        for name, folder in mapping.items()
        if name.count(".") == 1
        and name.startswith("probe.")
        and Path(folder) != Path(*name.split("."))
    }


class PackageDir(griffe.Extension):
    """Graft the folders that package-dir maps into `probe` onto griffe's `probe`."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Load each mapped folder as a subpackage of `pkg`, under its installed name.

        Parameters
        ----------
        pkg
            The package griffe has just loaded; only `probe` is extended.
        loader
            The loader that loaded it, which loads the folders too (same extensions,
            docstring parser and collections).
        **kwargs
            Unused; griffe passes them for forward compatibility.
        """
        if pkg.path != "probe":
            return
        for name, folder in package_dirs().items():
            child = name.removeprefix("probe.")
            if child in pkg.members and pkg.members[child].is_module:
                continue
            # Visiting under its parent from the start gives every object, and every relative
            # import inside the folder, its installed path.
            module = loader._load_module(child, folder / "__init__.py", parent=pkg)
            pkg.set_member(child, module)
            loader.expand_exports(module)
            loader.expand_wildcards(module, external=False)
