"""Every option's domain, declared once, next to the option: the CLI's validation layer.

An option is declared as ``option("--tokens", Count(2), help=...)``: the domain object
parses what the user typed, refuses anything outside it with one line
(``probe: error: --tokens must be a whole number from 2 to 2147483647, got 0``), and
states its bounds in the help (``[≥ 2]``: :func:`bounds`), both from the same object.
Typer calls the domain as the option's ``parser`` while it parses the command line,
defaults included, so every value is checked before the command runs at all.

Domains (their checks live in :mod:`probe.requests.checks`, shared with the library):

* ``Count(low, high)``: whole numbers in ASCII digits, bounded on both sides
  (``probe.requests.checks.MAX_COUNT`` by default); ``words`` adds literals such as ``all``;
* ``Seed()``: 0 to 2^63 - 1;
* ``Real(low, high, low_open, high_open)``: finite floats; ``inf`` and ``nan`` refused;
* ``Device()``: ``cpu``, ``cuda``, ``cuda:N``, checked against what torch has;
* ``Choice(values)``: one of a fixed list (names from ``probe.names``);
* ``TextFile()``, ``ResultFile()``, ``InFolder()``: files and folders that exist and can
  be read (regular files only: a fifo would block, a device is not text);
* ``OutFolder()``: a folder results can be written to (tried, never created here);
* ``NewFolder(marker)``: a folder a command writes whole; only an empty one or one it
  wrote itself may be replaced;
* ``ImageFolder()``: a readable folder of images (``--images``);
* ``Family()``: a family probe knows, by name (``probe models FAMILY``);
* ``ModelName()``: a non-empty hub id, local folder or bundled name.

Sizes are checked once more against memory where the model and all sizes are known
(``probe.requests.memory``), before anything is allocated.  The fuzzer in
``tests/test_fuzz_cli.py`` reads these objects back from the command tree (the
``parser`` of each option) and draws values inside and outside every domain.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import typer

from probe.errors import ProbeError
from probe.requests import checks


class OptionError(Exception):
    """A value outside its option's domain.

    Not a ValueError on purpose: typer's pydantic layer would wrap a ValueError in its
    own wording; this one reaches ``console.OneLineErrors``, which prints it as the
    command's one line.
    """


class Domain:
    """The values one option accepts.  Subclasses define ``check`` and ``describe``."""

    #: What kind of value, for the fuzzer: "int", "float", "device", "choice", "file",
    #: "folder", "images", "out-folder", "new-folder", "result", "model", "family", "text",
    #: "setting", "revision", "branch-scale", and a sweep's lists of them: "grid-setting",
    #: "revisions", "branch-scales".
    kind = "text"
    metavar = "TEXT"
    #: Literal words accepted beside the domain's values (e.g. "all").
    words: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.name = "the value"

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str) and value in self.words:
            return value
        try:
            return self.check(value)
        except ProbeError as err:
            raise OptionError(str(err)) from None

    def check(self, value: Any) -> Any:
        return str(value)

    def describe(self) -> str:
        return ""


class Count(Domain):
    """Whole numbers from ``low`` to ``high`` (and ``words``)."""

    kind = "int"
    metavar = "N"

    def __init__(self, low: int = 1, high: int = checks.MAX_COUNT, words: tuple[str, ...] = ()):
        super().__init__()
        self.low, self.high, self.words = low, high, tuple(words)

    def check(self, value):
        return checks.integer(self.name, value, self.low, self.high)

    def describe(self) -> str:
        words = " or ".join(self.words)
        return bounds(self.low, self.high) + (f", or {words}" if words else "")


def bounds(low: int, high: int) -> str:
    """Whole numbers from ``low`` to ``high`` as a person writes them: ``1 to 1000``, and
    ``≥ 2`` where ``high`` is only the limit of the number type (``probe.requests.checks.MAX_COUNT``
    and above: an error line states it, should a value pass it)."""
    return f"≥ {low}" if high >= checks.MAX_COUNT else f"{low} to {high}"


class Seed(Count):
    """A random seed: 0 up to ``probe.requests.checks.MAX_SEED``."""

    metavar = "SEED"

    def __init__(self) -> None:
        super().__init__(0, checks.MAX_SEED)


class Real(Domain):
    """Finite floats in an interval, open or closed at either end."""

    kind = "float"
    metavar = "X"

    def __init__(
        self,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        high_open: bool = False,
    ) -> None:
        super().__init__()
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def check(self, value):
        return checks.real(self.name, value, self.low, self.high, self.low_open, self.high_open)

    def describe(self) -> str:
        return "finite," + checks.interval(self.low, self.high, self.low_open, self.high_open)


class Device(Domain):
    kind = "device"
    metavar = "DEVICE"

    def check(self, value):
        return checks.device(value, self.name)

    def describe(self) -> str:
        return "cpu, cuda or cuda:N"


class Choice(Domain):
    """One of ``values`` (exact spelling; the help lists them)."""

    kind = "choice"

    def __init__(self, values, metavar: str | None = None) -> None:
        super().__init__()
        self.values = tuple(values)
        #: A few short values are the metavar (``mean|svd``); a name (``DTYPE``) stands for
        #: more, and the help lists them.
        self.metavar = metavar or "|".join(self.values)
        self.listed = metavar is not None

    def check(self, value):
        text = value.value if hasattr(value, "value") else str(value)
        if text not in self.values:
            raise ProbeError(
                f"{self.name} must be one of {', '.join(self.values)}, got {checks.shown(text)}"
            )
        return text

    def describe(self) -> str:
        if not self.listed:
            return ""  # the metavar lists the choices
        return ", ".join(self.values[:-1]) + f" or {self.values[-1]}"


class CommaList(Domain):
    """A comma list of ``values`` (any subset, any order), or one of ``words``; ``parse``
    is the library's own reader of such a list, whose error line is kept."""

    kind = "list"

    def __init__(self, values, parse, words: tuple[str, ...] = (), metavar: str = "LIST") -> None:
        super().__init__()
        self.values, self.parse, self.words, self.metavar = tuple(values), parse, words, metavar

    def check(self, value):
        text = str(value)
        if not text.strip():
            choices = f"'{self.words[0]}' or " if self.words else ""
            raise ProbeError(
                f"{self.name} is empty; give {choices}a comma list of {','.join(self.values)}"
            )
        self.parse(text)
        return text


class Text(Domain):
    """Any non-empty text without NUL characters (the command reads its meaning)."""

    def check(self, value):
        text = str(value)
        if not text.strip():
            raise ProbeError(f"{self.name} is empty")
        if "\0" in text:
            raise ProbeError(f"{self.name} {checks.shown(text)} holds a NUL character")
        return text


class Memory(Text):
    """``--max-memory``: DEVICE=SIZE pairs (``0=20GiB,cpu=60GiB``), read where a device map
    applies (:func:`cli.options.memory`)."""

    metavar = "SIZES"


class Setting(Domain):
    """One ``KEY=VALUE`` of a config override (``--set n_layer=4``): the value is read as a
    whole number, a real number, true/false or text (:func:`probe.requests.overrides.parse_setting`);
    whether the key and type fit the model is said once its config is read."""

    kind = "setting"
    metavar = "KEY=VALUE"

    def check(self, value):
        from probe.requests.overrides import parse_setting

        parse_setting(value)
        return str(value)


class Revision(Domain):
    """A hub revision: a branch, tag or commit name (:func:`probe.requests.request.check_revision`)."""

    kind = "revision"
    metavar = "REV"

    def check(self, value):
        from probe.requests.request import check_revision

        return check_revision(str(value))


class BranchScale(Domain):
    """alpha of residual branch scaling: a number or an expression of the depth L
    (:func:`probe.surgery.scaling.parse_branch_scale`)."""

    kind = "branch-scale"
    metavar = "ALPHA"

    def check(self, value):
        from probe.surgery.scaling import parse_branch_scale

        return parse_branch_scale(str(value)).text

    def describe(self) -> str:
        return "a number, or an expression of the depth L: 1/sqrt(L), 1/L, L^-0.5"


class MaskName(Domain):
    """An attention mask (:func:`probe.surgery.masks.parse_mask`)."""

    kind = "mask"
    metavar = "MASK"

    def check(self, value):
        from probe.surgery.masks import parse_mask

        return parse_mask(str(value)).text

    def describe(self) -> str:
        return "model, bidirectional, causal, window:W or causal-window:W (W >= 1)"


class ModelName(Domain):
    kind = "model"
    metavar = "MODEL"

    def check(self, value):
        text = str(value)
        if not text.strip():
            raise ProbeError(
                f"{self.name} is empty; give a hub id, a local save_pretrained folder, or minilm"
            )
        if "\0" in text:
            raise ProbeError(f"{self.name} {checks.shown(text)} holds a NUL character")
        checks.path_state(text, self.name)  # a name no folder can have is said here
        return text


class TextFile(Domain):
    """A readable regular file (UTF-8 is checked when it is read), or one of ``words``."""

    kind = "file"
    metavar = "FILE"

    def __init__(self, words: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.words = tuple(words)

    def check(self, value):
        return checks.readable_file(_path(value, self.name), self.name, "text file")


class ResultFile(Domain):
    """A result file probe wrote (.nc); glob patterns the shell left alone pass through."""

    kind = "result"
    metavar = "RESULT"

    def check(self, value):
        path = _path(value, self.name)
        missing = checks.path_state(path, self.name) is None
        if missing and any(c in str(path) for c in "*?["):
            return path  # expanded by the command (report_cmd._expand)
        if missing:
            raise ProbeError(f"no such result file: {path}")
        return checks.readable_file(path, self.name, "result file (.nc)")


class InFolder(Domain):
    """An existing folder this process can read (``what``: its words in the error line)."""

    kind = "folder"
    metavar = "DIR"

    def __init__(self, what: str = "folder") -> None:
        super().__init__()
        self.what = what

    def check(self, value):
        return checks.readable_folder(_path(value, self.name), self.name, self.what)


class ImageFolder(InFolder):
    """A readable folder of images (which files are images is said when they are read)."""

    kind = "images"

    def __init__(self) -> None:
        super().__init__("folder of images")

    def check(self, value):
        path = _path(value, self.name)
        if checks.path_state(path, self.name) is None:
            raise ProbeError(
                f"{self.name} {path} is not a folder: nothing is there; give a {self.what}"
            )
        return super().check(value)


class Family(Text):
    """A family probe knows (``probe models`` lists them), by its name."""

    kind = "family"
    metavar = "FAMILY"

    def check(self, value):
        text = super().check(value)
        from probe.models import ADAPTERS  # at parse time only: `probe --help` stays light

        if text not in ADAPTERS:
            raise ProbeError(f"no family {checks.shown(text)}; choose one of {', '.join(ADAPTERS)}")
        return text


class OutFolder(Domain):
    """A folder results and reports can be written to; created only when they are."""

    kind = "out-folder"
    metavar = "DIR"

    def check(self, value):
        folder = checks.writable_folder(_path(value, self.name), self.name)
        # Every command that writes into DIR rewrites DIR/index.html last: something that
        # is not a file there would refuse it after the result and report were written.
        index = folder / "index.html"
        state = checks.path_state(index, self.name)
        if state is not None and not stat.S_ISREG(state.st_mode):
            raise ProbeError(
                f"{self.name} {folder}: {index.name} there is not a file "
                "(the folder's index is written there); move it away or choose another folder"
            )
        return folder


class NewFolder(Domain):
    """A folder written whole by this command (``marker``: the file it always holds)."""

    kind = "new-folder"
    metavar = "DIR"

    def __init__(self, marker: str, writer: str) -> None:
        super().__init__()
        self.marker, self.writer = marker, writer

    def check(self, value):
        return checks.new_folder(_path(value, self.name), self.name, self.marker, self.writer)


def _path(value, name: str) -> Path:
    text = str(value)
    if not text.strip():  # "" or " ": a quoting slip far more often than a folder named so
        raise ProbeError(f"{name} is {'empty' if not text else 'blank'}; give a path")
    if "\0" in text:
        raise ProbeError(f"{name} {checks.shown(text)} holds a NUL character")
    checks.path_length(text, name)
    return Path(value)


def option(*decls: str, domain: Domain, help: str, **extra):
    """``typer.Option`` whose values must lie in ``domain``; ``--help`` states the domain
    beside the help (:func:`cli.help.facts`).  ``extra``: typer's own (``rich_help_panel``,
    ``show_default``, ...)."""
    domain.name = next((d for d in decls if d.startswith("--")), decls[0])
    return typer.Option(*decls, parser=domain, metavar=domain.metavar, help=help, **extra)


def argument(name: str, domain: Domain, help: str, **extra):
    """``typer.Argument`` whose values must lie in ``domain``."""
    domain.name = name
    return typer.Argument(parser=domain, metavar=name, help=help, **extra)


def domain_of(param) -> Domain | None:
    """The domain behind a parameter of the built command tree (for the fuzzer)."""
    info = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
    parser = getattr(info, "parser", None)
    return parser if isinstance(parser, Domain) else None


def options_of(command) -> set[str]:
    """The long options (``--name``) of a click command."""
    return {
        flag
        for param in command.params
        for flag in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))
        if flag.startswith("--")
    }


def command_of(group, words):
    """The command that the words of a command line run in ``group`` (the last group they
    name, where they name none of its commands)."""
    command = group
    for word in words:
        commands = getattr(command, "commands", None)
        if word == "--" or not commands:
            break
        if word.startswith("-"):
            continue
        if word not in commands:
            break
        command = commands[word]
    return command


def option_for(name: str, flags: set[str] | None, spelled: str | None = None) -> str:
    """The words for the library's parameter ``name`` on a command with options ``flags``:
    ``spelled`` where that is no option (``MODEL``); else the first of ``spelled``,
    ``--name`` (dashes for underscores), its plural and its singular that the command has
    (a sweep takes ``seed`` as ``--seeds``); else the plain name (a config field).
    ``flags`` None (no command): ``spelled``, else ``--name``."""
    dashed = "--" + name.replace("_", "-")
    if flags is None or (spelled and not spelled.startswith("--")):
        return spelled or dashed
    for flag in (spelled, dashed, dashed + "s", dashed.removesuffix("s")):
        if flag in flags:
            return flag
    return name
