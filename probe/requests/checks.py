"""The checks every entry point shares: numbers, devices, files and folders, memory.

One definition of each domain, used by the command line (``probe.cli.domains`` wraps
these as option parsers) and by the library (``collapse.prepare``, ``paths.sample``,
``toy.run``, ``fastformer.train`` call them), so a value the CLI refuses is refused
in a notebook with the same line, and the help text is written from the same bounds.

Nothing here imports torch at module level: the command line parses its options
before it loads anything heavy.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import tempfile
from pathlib import Path

from probe.errors import ProbeError

#: Seeds: non-negative 64-bit integers (what torch's generators and netCDF hold).
MAX_SEED = 2**63 - 1
#: Counts and sizes (sequences, tokens, steps, widths, ...): what a torch dimension and a
#: C int hold.  Memory is checked separately (``probe.requests.memory``): a count inside this bound
#: can still be refused because its run cannot fit.
MAX_COUNT = 2**31 - 1

_DIGITS = re.compile(r"[+]?[0-9]+")
_DEVICE = re.compile(r"(cpu|cuda)(?::([0-9]+))?")


def shown(value) -> str:
    """A value as the error line quotes it: repr of text (so '' and ' ' are visible)."""
    return repr(value) if isinstance(value, str) else str(value)


#: Whole numbers longer than this are refused before they are read (no count, seed or
#: width comes near: 2^63 has 19 digits); Python itself reads no more than 4300.
MAX_DIGITS = 40


def clipped(text: str, keep: int = 40) -> str:
    """``text`` as an error line quotes it, its middle left out past ``keep`` characters."""
    text = str(text)
    if len(text) <= keep:
        return text
    return f"{text[: keep // 2]}...{text[-keep // 2 :]}"


#: What a path may be on the file systems probe writes to (Linux's NAME_MAX and PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4095


def path_length(text: str, name: str) -> None:
    """Refuse a path the operating system would reject as too long (ENAMETOOLONG)."""
    encoded = os.fsencode(text)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX or len(encoded) > PATH_MAX:
        raise ProbeError(
            f"{name} is too long a path ({longest} bytes in one name, {len(encoded)} in all; "
            f"at most {NAME_MAX} and {PATH_MAX}); give a shorter one"
        )


def plain(value):
    """A numpy scalar (``np.int64(8)``, ``np.float32(0.5)``, ``np.bool_``) as the Python
    value it holds; anything else as it is.  numpy is not imported: its scalars are told by
    their module and 0 dimensions."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def integer(option: str, value, low: int | None = None, high: int | None = MAX_COUNT) -> int:
    """``value`` (an int, a numpy integer, or text of ASCII digits) within [low, high], else
    ProbeError.

    Unicode digits ("١٢"), underscores ("1_000"), signs other than a leading +, spaces
    and floats are refused: the value a user typed is the value that runs.
    """
    value = plain(value)
    if isinstance(value, bool):
        raise ProbeError(f"{option} must be a whole number, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if _DIGITS.fullmatch(text.removeprefix("-")) and len(text.lstrip("+-0")) > MAX_DIGITS:
            raise ProbeError(  # a number no option takes, and no need to read it
                f"{option} must be a whole number{_range(low, high)}, got "
                f"{len(text.lstrip('+-0'))} digits ({clipped(text)})"
            )
        if text.startswith("-") and _DIGITS.fullmatch(text[1:]):
            number = -int(text[1:])
        elif _DIGITS.fullmatch(text):
            number = int(text)
        else:
            raise ProbeError(
                f"{option} must be a whole number{_range(low, high)}, got {shown(value)}"
            )
    elif isinstance(value, int):
        number = value
    else:
        raise ProbeError(f"{option} must be a whole number{_range(low, high)}, got {shown(value)}")
    if (low is not None and number < low) or (high is not None and number > high):
        raise ProbeError(f"{option} must be a whole number{_range(low, high)}, got {number}")
    return number


def _range(low, high) -> str:
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" of at least {low}"
    if high is not None:
        return f" of at most {high}"
    return ""


def real(
    option: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """A finite float within the bounds (open or closed), else ProbeError (a numpy scalar is
    taken as the number it holds)."""
    value = plain(value)
    if isinstance(value, bool):
        raise ProbeError(f"{option} must be a number, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        # ASCII only, as Python writes floats: no "١.٥", no "1_0", no "infinity".
        if not re.fullmatch(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", text):
            if text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
                raise ProbeError(
                    f"{option} must be a finite number{interval(low, high, low_open, high_open)}, got {shown(value)}"
                )
            raise ProbeError(
                f"{option} must be a number{interval(low, high, low_open, high_open)}, got {shown(value)}"
            )
        number = float(text)
    elif isinstance(value, int | float):
        number = float(value)
    else:
        raise ProbeError(f"{option} must be a number, got {shown(value)}")
    inside = math.isfinite(number)
    if inside and low is not None:
        inside = number > low if low_open else number >= low
    if inside and high is not None:
        inside = number < high if high_open else number <= high
    if not inside:
        raise ProbeError(
            f"{option} must be a finite number{interval(low, high, low_open, high_open)}, "
            f"got {value if isinstance(value, str) else number}"
        )
    return number


def interval(low, high, low_open=False, high_open=False) -> str:
    """ " in (0, 10]"-style words for an error line ("" without bounds)."""
    if low is None and high is None:
        return ""
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    return f" in {left}{'-inf' if low is None else _num(low)}, {'inf' if high is None else _num(high)}{right}"


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def device(value, option: str = "`device`") -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` for a device this machine has, else ProbeError.

    Other torch device types (mps, xpu, meta, ...) are refused: probe's kernels, memory
    checks and tests cover the CPU and CUDA only.
    """
    text = str(value).strip() if value is not None else "cpu"
    match = _DEVICE.fullmatch(text)
    if match is None:
        raise ProbeError(f"unknown device {shown(text)} for {option}; use cpu, cuda or cuda:N")
    if match.group(1) == "cpu":
        if match.group(2) not in (None, "0"):
            raise ProbeError(f"{option} {text}: there is one CPU device; use {option} cpu")
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise ProbeError(
            f"{option} {text} asked for, but no CUDA device is available; use {option} cpu"
        )
    count = torch.cuda.device_count()
    if match.group(2) is not None and int(match.group(2)) >= count:
        raise ProbeError(
            f"{option} {text}: this machine has {count} CUDA device{'s' * (count != 1)} "
            f"(cuda:0 to cuda:{count - 1})"
        )
    return text


# --- files and folders -------------------------------------------------------------


def path_state(path, option: str) -> os.stat_result | None:
    """``stat`` of ``path`` (links followed), None where nothing is there; ProbeError for a
    path no file can have (a name too long, a loop of links, no permission to look)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        shown_path = str(path) if len(str(path)) <= 80 else str(path)[:77] + "..."
        raise ProbeError(f"{option} {shown_path}: {err.strerror}") from None
    except ValueError:  # an embedded NUL
        raise ProbeError(f"{option} {shown(str(path))}: not a valid path") from None


def as_path(value, option: str, what: str = "file") -> Path:
    """``value`` as a path: a non-empty text or ``os.PathLike`` of text, else ProbeError
    (a number, a list or bytes is no path this process names files with)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise ProbeError(f"{option} must be a path to a {what}, got {type(value).__name__}")
    if not value:
        raise ProbeError(f"{option} is empty; give a {what}")
    return Path(value)


def readable_file(path, option: str, what: str = "file") -> Path:
    """An existing regular file this process can read (not a folder, fifo or device)."""
    path = as_path(path, option, what)
    if str(path) in ("", "."):
        raise ProbeError(f"{option} is empty; give a {what}")
    info = path_state(path, option)
    if info is None:
        raise ProbeError(f"no such {what}: {path}")
    if stat.S_ISDIR(info.st_mode):
        raise ProbeError(f"{option} {path} is a directory; give a {what}")
    if not stat.S_ISREG(info.st_mode):
        # A fifo would block the read forever; a device is no text.
        raise ProbeError(f"{option} {path} is not a regular file; give a {what}")
    if not os.access(path, os.R_OK):
        raise ProbeError(f"cannot read {option} {path}: permission denied")
    return path


def readable_folder(path, option: str, what: str = "folder") -> Path:
    """An existing folder this process can list."""
    path = as_path(path, option, what)
    info = path_state(path, option)
    if info is None:
        raise ProbeError(f"no such {what}: {path}")
    if not stat.S_ISDIR(info.st_mode):
        raise ProbeError(f"{option} {path} is not a folder; give a {what}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ProbeError(f"cannot read {option} {path}: permission denied")
    return path


def writable_folder(path, option: str = "`out`") -> Path:
    """A folder results can be written to: existing and writable, or creatable.

    Nothing is created: a missing folder is made when the first result is put in place,
    so a command refused later leaves no empty folder behind.  Writability is tried, not
    guessed from permission bits (root passes ``os.access`` on /proc, yet cannot write).
    """
    if not isinstance(path, str | os.PathLike):
        raise ProbeError(f"{option} must be a folder's path; got {type(path).__name__}")
    path = Path(path)
    if "\0" in str(path):
        raise ProbeError(f"{option} {shown(str(path))} holds a NUL character; give a folder")
    existing = path
    while (info := path_state(existing, option)) is None:
        if os.path.islink(existing):  # a dangling link: mkdir would fail on it
            raise ProbeError(f"{option} {path}: {existing} is a broken link; give a folder")
        parent = existing.parent
        if parent == existing:
            break
        existing = parent
    if info is not None and not stat.S_ISDIR(info.st_mode):
        if existing == path:
            raise ProbeError(f"{option} {path} is a file; give a folder")
        raise ProbeError(f"{option} {path}: {existing} is a file, not a folder")
    try:
        fd, probe_file = tempfile.mkstemp(prefix=".probe-write-check-", dir=existing)
    except OSError as err:
        raise ProbeError(
            f"cannot write to {option} {path}: {err.strerror}; choose a folder you can write to"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe_file)
    return path


def new_folder(path, option: str, marker: str, writer: str) -> Path:
    """A folder a command will write whole (staged beside it, then renamed into place).

    It must have a name of its own (``.``, ``sub/..`` and ``/`` name a folder that holds
    other things, such as the current one), and may already exist only empty or as a
    folder ``writer`` wrote before (it holds ``marker``): only those are replaced.
    """
    path = Path(path)
    if str(path) == "" or "\0" in str(path):
        raise ProbeError(f"{option} is empty; give a new folder, e.g. {option} my-run")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as err:
        raise ProbeError(f"{option} {path}: {err}") from None
    here = Path.cwd().resolve()
    if resolved == here or resolved in here.parents:
        raise ProbeError(
            f"{option} {path} names {resolved}, the current folder or one above it; "
            f"give a new folder, e.g. {option} my-run"
        )
    if resolved.name in ("", ".", ".."):
        raise ProbeError(f"{option} {path} has no name of its own; give a new folder")
    info = path_state(path, option)
    if os.path.islink(path) or (info is not None and not stat.S_ISDIR(info.st_mode)):
        raise ProbeError(f"{option} {path} is a file or a link; give a folder")
    if info is not None:
        try:
            entries = [p.name for p in path.iterdir()]
        except OSError as err:
            raise ProbeError(f"cannot read {option} {path}: {err.strerror}") from None
        if entries and marker not in entries:
            raise ProbeError(
                f"{option} {path} exists and was not written by {writer} (no {marker}); "
                "probe replaces only its own folders: give a new folder"
            )
    writable_folder(resolved.parent, option=f"the folder of {option} {path}")
    return path
